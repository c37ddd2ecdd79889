"""Bad input that used to reach the database or a parser unchecked: each is now a 4xx that names
what is wrong, and nothing else breaks (a tenant's setting never stops another tenant's charts)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.interactions.models import Feedback, Interaction, RollupDirty
from apps.interactions.services import interactions_ingest

pytestmark = pytest.mark.django_db


@pytest.fixture
def adapter(client_a):
    from apps.adapters.models import Adapter, BaseModel

    base = BaseModel.objects.create(name="edges-base", path="/nonexistent", family="qwen")
    return Adapter.objects.create(tenant=client_a.tenant, name="tab", base_model=base, is_default=True)


def served(tenant, prompt="def f():", completion="return 1") -> Interaction:
    now = timezone.now()
    return Interaction.objects.create(
        tenant=tenant, source="served", prompt=prompt, completion=completion, served_at=now, received_at=now
    )


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/v1/adapters/%00/versions"),
        ("get", "/v1/adapters/%00/training-policy"),
        ("get", "/v1/adapters/tab%00/holdout"),
        ("get", "/v1/adapters/%00/experiments"),
        ("get", "/v1/adapters/%00/assignment?user=u"),
        ("post", "/v1/adapters/%00/versions/1/purge"),
        ("put", "/v1/adapters/%00/eval-set"),
        ("get", "/v1/users/%00"),
        ("delete", "/v1/users/dev%00"),
    ],
)
def test_a_nul_in_a_name_in_the_path_is_not_found(client_a, adapter, method, path):
    response = getattr(client_a, method)(path)
    assert response.status_code == 404, response.content[:300]
    assert response.json()["error"]["code"] == "not_found"


def test_retention_days_past_a_century_is_refused_and_a_stored_one_stops_no_other_tenants_charts(
    client_a, make_tenant, make_client
):
    for days in (3_000_000_000, 1_000_000, 36_501):
        response = client_a.patch("/v1/tenant", {"retention_days": days}, format="json")
        assert response.status_code == 400 and "retention_days" in response.json()["error"]["message"], days
    assert client_a.patch("/v1/tenant", {"retention_days": 36_500}, format="json").status_code == 200
    # One stored before the bound (no date is that far back): it keeps everything, and beat's rollup
    # pass goes on for every tenant.
    from apps.interactions.rollups import retention_cutoff, rollups_refresh_all
    from apps.tenants.models import Tenant

    Tenant.objects.filter(pk=client_a.tenant.pk).update(retention_days=1_000_000)
    assert retention_cutoff(client_a.tenant.pk) is None
    other = make_client(make_tenant("other"))
    for client in (client_a, other):
        body = {"client_id": "i1", "prompt": "p", "completion": "c"}
        assert client.post("/v1/interactions", body, format="json").status_code == 201
    rollups_refresh_all()
    assert not RollupDirty.objects.exists()


def test_a_tenant_whose_rollups_fail_leaves_the_others_refreshed(client_a, make_tenant, make_client, monkeypatch):
    from apps.interactions import rollups

    other = make_client(make_tenant("other"))
    for client in (client_a, other):
        body = {"client_id": "i1", "prompt": "p", "completion": "c"}
        assert client.post("/v1/interactions", body, format="json").status_code == 201
    real = rollups.rollups_refresh

    def failing(tenant_id: int) -> int:
        if tenant_id == client_a.tenant.pk:
            raise RuntimeError("this tenant's refresh fails")
        return real(tenant_id)

    monkeypatch.setattr(rollups, "rollups_refresh", failing)
    rollups.rollups_refresh_all()
    assert set(RollupDirty.objects.values_list("tenant_id", flat=True)) == {client_a.tenant.pk}


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"prompt": "def f():\u0000"}, "prompt"),
        ({"completion": "return 1\u0000"}, "completion"),
        ({"completionId": "e\u00001"}, "completionId"),
        ({"completionId": 5}, "completionId"),
        ({"extra": "a\u0000"}, "extra"),
        ({"extra": {"a": {"b": ["c\u0000"]}}}, "extra.a.b.0"),
    ],
)
def test_an_editor_outcome_with_text_that_cannot_be_stored_is_a_400_naming_it(client_a, extra, field):
    served(client_a.tenant)  # one it would link to
    body = {"completionId": "e1", "prompt": "def f():", "completion": "return 1", "accepted": True, **extra}
    response = client_a.post("/v1/editor/autocomplete", body, format="json")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["param"] == field
    assert not Interaction.objects.filter(client_id="e1").exists()


def test_an_editor_outcome_nested_too_deep_is_refused_on_the_link_path_too(client_a):
    served(client_a.tenant)
    deep = '{"a": ' * 40 + "{}" + "}" * 40
    body = '{"completionId": "d1", "prompt": "def f():", "completion": "return 1", "accepted": true, "extra": ' + deep
    response = client_a.post("/v1/editor/autocomplete", body + "}", content_type="application/json")
    assert response.status_code == 400 and "nested deeper" in response.json()["error"]["message"]


def test_an_editor_outcome_sent_again_after_its_prompt_was_served_again_lands_on_the_first(client_a):
    first = served(client_a.tenant)
    body = {"completionId": "dup-1", "prompt": "def f():", "completion": "return 1", "accepted": True}
    assert client_a.post("/v1/editor/autocomplete", body, format="json").status_code in (200, 201)
    second = served(client_a.tenant)  # the same prompt served again, then the plugin retries
    response = client_a.post("/v1/editor/autocomplete", {**body, "accepted": False}, format="json")
    assert response.status_code in (200, 201), response.content[:300]
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.client_id == "dup-1" and second.client_id is None
    assert Interaction.objects.filter(tenant=client_a.tenant, client_id="dup-1").count() == 1
    assert Feedback.objects.get(interaction=first).events_received == 2


def test_a_csv_import_it_cannot_read_is_a_400(client_a):
    body = "end_user_id,opted_in\n" + "x" * 200_000 + ",true\n"
    response = client_a.post("/v1/users/import", body, content_type="text/csv")
    assert response.status_code == 400
    assert "the CSV cannot be read at line" in response.json()["error"]["message"]


def test_an_unknown_policy_field_or_override_says_unknown_field(client_a, adapter):
    for body in ({"min_new_event": 5}, {"trainer_overrides": {"device": "cuda"}}):
        response = client_a.patch("/v1/adapters/tab/training-policy", body, format="json")
        assert response.status_code == 400 and response.json()["error"]["code"] == "unknown_field", body


def test_the_user_header_names_one_user_whether_the_client_sent_utf8_or_latin1(client_a):
    body = {"completionId": "h1", "prompt": "p", "completion": "c", "accepted": True}
    utf8 = "josé".encode().decode("latin-1")  # curl's bytes for it, as the server hands them over
    latin1 = "jos\u00e9"  # Node's (Continue's) bytes for it: 0xE9 alone, not UTF-8
    for client_id, header in (("h1", utf8), ("h2", latin1)):
        response = client_a.post(
            "/v1/editor/autocomplete", {**body, "completionId": client_id}, format="json", HTTP_X_STROP_USER=header
        )
        assert response.status_code in (200, 201), response.content[:300]
    assert {i.end_user_id for i in Interaction.objects.filter(client_id__in=["h1", "h2"])} == {"josé"}


def test_an_eval_case_too_long_to_score_is_a_400_naming_it(client_a, adapter):
    case = {"prefix": "def f():\n    ", "suffix": "\n", "middle": "return 1"}
    assert client_a.put("/v1/adapters/tab/eval-set", {"cases": [case]}, format="json").status_code == 200
    for field, size in (("middle", 4_001), ("prefix", 100_001), ("suffix", 100_001)):
        cases = [case, {**case, field: "x" * size}]
        response = client_a.put("/v1/adapters/tab/eval-set", {"cases": cases}, format="json")
        assert response.status_code == 400, field
        assert response.json()["error"]["message"].startswith(f"cases[1].{field}: at most"), response.json()


@pytest.mark.parametrize("kind", ["feedback", "persistence"])
def test_a_tenant_whose_pending_labels_fail_to_attach_leaves_the_others_attached(
    client_a, make_tenant, make_client, monkeypatch, kind
):
    from apps.interactions import services
    from apps.interactions.models import PersistenceReport
    from apps.interactions.services import pending, persistence

    other = make_client(make_tenant("other"))
    for client in (client_a, other):
        interactions_ingest(client.tenant, items=[{"client_id": "i1", "prompt": "p", "completion": "return 1"}])
    # Labels that came first wait as pending; their interaction is then stored by another path.
    model = Feedback if kind == "feedback" else PersistenceReport
    for client in (client_a, other):
        row = model(
            tenant=client.tenant, pending_client_id="i1", occurred_at=timezone.now(), received_at=timezone.now(),
            updated_at=timezone.now(),
            **({"outcome": "accepted"} if kind == "feedback" else {"checkpoint_s": 30, "reported_ratio": 1.0}),
        )  # fmt: skip
        row.save()
    module, name = (
        (pending, "feedback_attach_pending") if kind == "feedback" else (persistence, "persistence_attach_pending")
    )
    real = getattr(module, name)

    def failing(tenant) -> int:
        if tenant.pk == client_a.tenant.pk:
            raise RuntimeError("this tenant's attach fails")
        return real(tenant)

    monkeypatch.setattr(module, name, failing)
    sweep = services.feedback_attach_pending_all if kind == "feedback" else services.persistence_attach_pending_all
    sweep()
    waiting = set(model.objects.filter(pending_client_id__isnull=False).values_list("tenant_id", flat=True))
    assert waiting == {client_a.tenant.pk}
