"""The ``editor`` key scope, for editor plugins' configuration files (a copy on every developer's
machine): it serves completions and sends feedback on what it served, and nothing else. A leaked
editor config reads no end user's completions, sets no one's consent, and cannot label another
key's interactions.

vLLM is a closed port here: a completion the key may ask for is answered 503 (it got past every
check); the interactions an editor key served are recorded as the serving path records them."""

from __future__ import annotations

import socket
import uuid

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from apps.adapters.models import Adapter, BaseModel
from apps.cohorts.models import EndUser
from apps.interactions.models import Feedback, Interaction
from apps.interactions.served import ServedCompletion, interactions_record_served
from apps.serving.services import served_by
from apps.tenants.models import ApiKey
from apps.tenants.services import api_key_create

pytestmark = pytest.mark.django_db

PROMPT = "def add(a, b):\n    "


@pytest.fixture(autouse=True)
def _vllm_down(settings) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.VLLM_BASE_URLS = [f"http://127.0.0.1:{port}"]


@pytest.fixture
def adapter(tenant) -> Adapter:
    base = BaseModel.objects.create(name="editor-base", path="/nonexistent", family="qwen")
    return Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)


def _client(tenant, scopes: list[str], **options) -> APIClient:
    issued = api_key_create(tenant, name="k", scopes=scopes, **options)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
    client.key = issued.api_key
    return client


@pytest.fixture
def editor(tenant) -> APIClient:
    return _client(tenant, ["editor"])


def _served(tenant, adapter, key: ApiKey | None, *, user: str = "alice", completion: str = "return a + b") -> str:
    """A completion served through ``key``, recorded as the completion endpoint records it."""
    interaction_id = uuid.uuid4()
    interactions_record_served(
        tenant,
        choices=[ServedCompletion(interaction_id, completion, [1, 2, 3], [-0.1, -0.2, -0.3], "stop")],
        prompt=PROMPT,
        prefix="",
        suffix="",
        prompt_token_ids=[5, 6],
        model_name="tab",
        adapter_id=adapter.pk,
        adapter_version_id=None,
        experiment_id=None,
        experiment_arm="",
        end_user_id=user,
        end_user_opted_in=True,
        served_at=timezone.now(),
        latency_ms=10.0,
        metadata={"temperature": 1.0, **served_by(key)},
    )
    return str(interaction_id)


def test_an_editor_key_serves_completions_and_chat(editor, adapter):
    completion = editor.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8}, format="json")
    chat = editor.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, format="json")
    assert completion.status_code == chat.status_code == 503  # past every check, to a vLLM that is down
    assert editor.get("/v1/models").status_code == 200


def test_an_editor_key_cannot_give_consent_but_can_withdraw_it(tenant, editor, adapter):
    EndUser.objects.create(tenant=tenant, external_id="bob", opted_in=False)
    body = {"prompt": PROMPT, "max_tokens": 8, "user": "bob"}
    refused = editor.post("/v1/completions", {**body, "opted_in": True}, format="json")
    assert refused.status_code == 403 and "cannot give an end user's consent" in refused.json()["error"]["message"]
    header = editor.post("/v1/completions", body, format="json", HTTP_X_STROP_OPT_IN="true")
    assert header.status_code == 403
    chat = {"messages": [{"role": "user", "content": "hi"}], "user": "carol", "opted_in": True}
    assert editor.post("/v1/chat/completions", chat, format="json").status_code == 403
    assert EndUser.objects.get(external_id="bob").opted_in is False
    assert not EndUser.objects.filter(external_id="carol").exists()

    EndUser.objects.filter(external_id="bob").update(opted_in=True)
    withdrawn = editor.post("/v1/completions", {**body, "opted_in": False}, format="json")
    assert withdrawn.status_code == 503
    assert EndUser.objects.get(external_id="bob").opted_in is False


def test_a_new_developer_seen_through_an_editor_key_gets_the_keys_default(tenant, adapter):
    editor = _client(tenant, ["editor"], default_opt_in=True)
    body = {"prompt": PROMPT, "max_tokens": 8}
    assert editor.post("/v1/completions", body, format="json", HTTP_X_STROP_USER="dana").status_code == 503
    assert EndUser.objects.get(external_id="dana").opted_in is True


def test_an_editor_key_sends_feedback_on_what_it_served(tenant, editor, adapter):
    served = _served(tenant, adapter, editor.key)
    response = editor.post("/v1/feedback", {"interaction_id": served, "outcome": "accepted"}, format="json")
    assert response.status_code == 200, response.content
    Interaction.objects.filter(pk=served).update(client_id="cmp-1")
    batch = {"items": [{"client_id": "cmp-1", "outcome": "partial", "accepted_chars": 3}]}
    assert editor.post("/v1/feedback", batch, format="json").json()["recorded"] == 1
    assert Feedback.objects.get(interaction_id=served).outcome == "partial"


def test_an_editor_key_sends_no_feedback_on_what_it_did_not_serve(tenant, make_tenant, editor, adapter):
    other_key = _client(tenant, ["serve", "feedback", "ingest"])
    theirs = _served(tenant, adapter, other_key.key)
    logged = other_key.post(
        "/v1/interactions", {"client_id": "c-1", "prompt": "x", "completion": "y"}, format="json"
    ).json()["id"]
    stranger = make_tenant("stranger")
    foreign = _served(
        stranger, Adapter.objects.create(tenant=stranger, name="tab", base_model=adapter.base_model), None
    )
    for named in (
        {"interaction_id": theirs},
        {"interaction_id": logged},
        {"client_id": "c-1"},
        {"interaction_id": foreign},
    ):
        response = editor.post("/v1/feedback", {**named, "outcome": "rejected"}, format="json")
        assert response.status_code == 404, (named, response.content)
        assert "served through this editor key" in response.json()["error"]["message"]
    # Nothing waits as pending for an editor key, and a session outcome is not its to send.
    later = editor.post("/v1/feedback", {"client_id": "not-yet", "outcome": "accepted"}, format="json")
    session = editor.post("/v1/feedback", {"conversation_id": "s-1", "turn": 0, "outcome": "thumbs_up"}, format="json")
    assert later.status_code == 404 and session.status_code == 404, session.content
    batch = editor.post("/v1/feedback", {"items": [{"interaction_id": theirs, "outcome": "rejected"}]}, format="json")
    assert batch.status_code == 207 and batch.json()["rejected"] == 1
    assert not Feedback.objects.exists()  # pending feedback too


def test_an_editor_key_reads_nothing_and_sets_no_ones_consent(tenant, editor, adapter):
    served = _served(tenant, adapter, editor.key)
    EndUser.objects.create(tenant=tenant, external_id="alice", opted_in=False)
    refused = [
        ("get", "/v1/interactions", None),
        ("get", f"/v1/interactions/{served}", None),
        ("post", "/v1/interactions", {"client_id": "c-9", "prompt": "x", "completion": "y"}),
        ("get", "/v1/users", None),
        ("get", "/v1/users/alice", None),
        ("post", "/v1/users/alice/opt-in", None),
        ("post", "/v1/users/alice/opt-out", None),
        ("post", "/v1/users/import", {"items": [{"end_user_id": "alice", "opted_in": True}]}),
        ("delete", "/v1/users/alice", None),
        ("get", "/v1/adapters/tab/assignment?user=alice&opted_in=true", None),
        ("get", "/v1/adapters", None),
        ("get", "/v1/adapters/tab/versions", None),
        ("get", "/v1/keys", None),
        ("get", "/v1/audit-events", None),
        ("patch", "/v1/tenant", {"default_opt_in": True}),
    ]
    for method, path, body in refused:
        response = getattr(editor, method)(path, body, format="json")
        assert response.status_code == 403, (method, path, response.content)
    assert EndUser.objects.get(external_id="alice").opted_in is False
    assert Interaction.objects.count() == 1


def _outcome(completion_id: str, completion: str, *, accepted: bool = True) -> dict:
    return {
        "name": "autocomplete",
        "schema": "0.2.0",
        "level": "all",
        "data": {
            "completionId": completion_id,
            "prompt": PROMPT,
            "completion": completion,
            "accepted": accepted,
            "modelName": "tab",
        },
    }


def test_an_editor_keys_outcomes_link_only_to_what_it_served(tenant, editor, adapter):
    other_key = _client(tenant, ["serve", "ingest"])
    theirs = _served(tenant, adapter, other_key.key, user="", completion="return a - b")
    mine = _served(tenant, adapter, editor.key, user="", completion="return a + b")

    linked = editor.post("/v1/editor/autocomplete", _outcome("cmp-mine", "return a + b"), format="json")
    assert linked.status_code == 200 and linked.json()["linked_to_served"] is True, linked.content
    assert Interaction.objects.get(pk=mine).client_id == "cmp-mine"

    # The other key's completion, exactly: not linked, an outcome of the editor key's own instead.
    unlinked = editor.post("/v1/editor/autocomplete", _outcome("cmp-theirs", "return a - b"), format="json")
    assert unlinked.status_code == 201 and unlinked.json()["linked_to_served"] is False
    assert Interaction.objects.get(pk=theirs).client_id is None
    assert not Feedback.objects.filter(interaction_id=theirs).exists()
    own = Interaction.objects.get(client_id="cmp-theirs")
    assert own.source == "editor" and Feedback.objects.get(interaction=own).outcome == "accepted"
    # ... kept without its text: an editor key puts no text of its choosing into training.
    assert (own.prompt, own.prefix, own.completion) == ("", "", "") and own.metadata["text_withheld"] is True


def test_an_editor_keys_unmatched_outcome_is_counted_but_never_trained_on(tenant, editor, adapter):
    from apps.training.selectors import training_events_eligible  # noqa: PLC0415

    EndUser.objects.create(tenant=tenant, external_id="alice", opted_in=True)
    ingest = _client(tenant, ["ingest"])
    outcome = _outcome("cmp-logged", "return b + a")
    assert ingest.post("/v1/editor/autocomplete", outcome, format="json", HTTP_X_STROP_USER="alice").status_code == 201
    outcome = _outcome("cmp-editor", "return b + a")
    assert editor.post("/v1/editor/autocomplete", outcome, format="json", HTTP_X_STROP_USER="alice").status_code == 201
    eligible = training_events_eligible(adapter, parent=None)
    assert eligible.filter(interaction__client_id="cmp-logged").exists()  # an ingest key's outcome trains
    assert not eligible.filter(interaction__client_id="cmp-editor").exists()
    assert Feedback.objects.get(interaction__client_id="cmp-editor").outcome == "accepted"


def test_an_editor_outcome_naming_another_interactions_client_id_labels_nothing(tenant, editor, adapter):
    ingest = _client(tenant, ["ingest", "feedback"])
    ingest.post("/v1/interactions", {"client_id": "c-7", "prompt": "x", "completion": "y"}, format="json")
    response = editor.post("/v1/editor/autocomplete", _outcome("c-7", "z", accepted=False), format="json")
    assert response.status_code == 200 and response.json()["feedback"]["status"] == "rejected", response.content
    assert not Feedback.objects.exists()
    # Nor is it told that row's id (it says when the row was served: apps.interactions.ids) ...
    assert response.json()["interaction"] == {"index": 0, "status": "duplicate", "client_id": "c-7"}
    # ... while a replay of its own outcome answers its own id.
    first = editor.post("/v1/editor/autocomplete", _outcome("cmp-own", "z"), format="json").json()
    again = editor.post("/v1/editor/autocomplete", _outcome("cmp-own", "z"), format="json").json()
    assert again["interaction"]["status"] == "duplicate" and again["interaction"]["id"] == first["interaction"]["id"]


def test_an_editor_key_is_made_by_the_api_the_command_and_offered_by_the_dashboard(tenant, capsys):
    admin = _client(tenant, ["admin"])
    created = admin.post("/v1/keys", {"name": "continue", "scopes": ["editor"]}, format="json")
    assert created.status_code == 201 and created.json()["scopes"] == ["editor"]
    call_command("api_key_create", tenant.slug, "--scopes", "editor", "--name", "vscode")
    assert ApiKey.objects.get(name="vscode").scopes == ["editor"]
    from apps.dashboard.forms import ApiKeyCreateForm  # noqa: PLC0415

    assert "editor" in dict(ApiKeyCreateForm().fields["scopes"].choices)


@pytest.mark.vllm
def test_an_editor_key_serves_a_real_completion_and_labels_it_but_not_another_keys(serving_tenant, serving_adapter):
    editor = _client(serving_tenant, ["editor"])
    other = _client(serving_tenant, ["serve"])
    body = {"prefix": "def add(a, b):\n    ", "suffix": "\n", "max_tokens": 4, "user": "alice"}
    mine = editor.post("/v1/completions", body, format="json")
    theirs = other.post("/v1/completions", body, format="json")
    assert mine.status_code == theirs.status_code == 200, (mine.content, theirs.content)
    assert Interaction.objects.get(pk=mine.json()["id"]).metadata["api_key_prefix"] == editor.key.prefix
    sent = editor.post("/v1/feedback", {"interaction_id": mine.json()["id"], "outcome": "accepted"}, format="json")
    assert sent.status_code == 200, sent.content
    refused = editor.post("/v1/feedback", {"interaction_id": theirs.json()["id"], "outcome": "rejected"}, format="json")
    assert refused.status_code == 404
    assert list(Feedback.objects.values_list("interaction_id", flat=True)) == [uuid.UUID(mine.json()["id"])]


def _linkable(completion_id: str, completion: str = "return a + b") -> dict:
    return {"completionId": completion_id, "prompt": PROMPT, "completion": completion, "accepted": True}


def test_an_editor_outcome_takes_the_configs_opt_out_and_refuses_its_opt_in(tenant, adapter):
    editor = _client(tenant, ["editor"], default_opt_in=True)
    post = editor.post
    # A developer first seen through an outcome (no completion of theirs to link), opting out.
    answer = post("/v1/editor/autocomplete", _linkable("c-1"), format="json", HTTP_X_STROP_USER="erin",
                  HTTP_X_STROP_OPT_IN="false")  # fmt: skip
    assert answer.status_code in (200, 201), answer.content
    assert EndUser.objects.get(external_id="erin").opted_in is False
    assert Interaction.objects.get(client_id="c-1").end_user_opted_in is False
    # A completion served to nobody named, linked by the outcome that names its developer and opts out.
    served = _served(tenant, adapter, editor.key, user="", completion="return b + a")
    answer = post("/v1/editor/autocomplete", _linkable("c-2", "return b + a"), format="json",
                  HTTP_X_STROP_USER="fay", HTTP_X_STROP_OPT_IN="false")  # fmt: skip
    assert answer.json()["status"] == "linked", answer.content
    assert EndUser.objects.get(external_id="fay").opted_in is False
    assert Interaction.objects.get(pk=served).end_user_opted_in is False
    # A developer already opted in, withdrawing on an outcome linked to their own completion.
    _served(tenant, adapter, editor.key, user="gus", completion="return a - b")
    EndUser.objects.create(tenant=tenant, external_id="gus", opted_in=True)
    answer = post("/v1/editor/autocomplete", _linkable("c-3", "return a - b"), format="json",
                  HTTP_X_STROP_USER="gus", HTTP_X_STROP_OPT_IN="false")  # fmt: skip
    assert answer.json()["status"] == "linked", answer.content
    assert EndUser.objects.get(external_id="gus").opted_in is False
    # Consent through an editor key is refused, as on a completion, and nothing is recorded.
    refused = post("/v1/editor/autocomplete", _linkable("c-4"), format="json", HTTP_X_STROP_USER="hal",
                   HTTP_X_STROP_OPT_IN="true")  # fmt: skip
    assert refused.status_code == 403 and "cannot give an end user's consent" in refused.json()["error"]["message"]
    assert not Interaction.objects.filter(client_id="c-4").exists()
    assert not EndUser.objects.filter(external_id="hal").exists()
