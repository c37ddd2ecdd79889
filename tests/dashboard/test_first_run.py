"""A tenant no interaction has reached yet: its overview shows the steps to the first one, with the
tenant's own values, and its waiting line turns the page into the overview once one arrives. The
training policy page shows a code-completion adapter no agent rewards, and the eval gate's
settings as fields of their own."""

from __future__ import annotations

import pytest

from apps.training.models import TrainingPolicy
from tests.dashboard.conftest import log_events
from tests.dashboard.routes import ACTIONS, url_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def new_tenant(make_tenant, make_user, tiny_starter_model):
    """A tenant with a default adapter and a key, and no traffic: what the quickstart's first block makes."""
    from apps.adapters.services import adapter_create, base_model_register
    from apps.tenants.services import api_key_create

    tenant = make_tenant("acme")
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter_create(tenant, name="tab", base_model=base, is_default=True)
    issued = api_key_create(tenant, name="first", scopes=["serve", "feedback"], actor="system")
    return {
        "tenant": tenant,
        "admin": make_user("ada", tenant, "admin"),
        "viewer": make_user("val", tenant, "viewer"),
        "raw_key": issued.raw_key,
    }


def test_a_tenant_without_traffic_gets_the_steps_to_its_first_event_with_its_own_values(client, new_tenant):
    client.force_login(new_tenant["admin"])
    page = client.get("/dashboard/t/acme/").content.decode()
    assert 'id="first-run"' in page and 'id="live"' not in page and "Over time" not in page
    assert "export STROP_BASE_URL=http://testserver STROP_API_KEY=…   # tenant acme" in page
    assert '"model": "tab"' in page and 'model="tab"' in page  # curl and the SDK
    assert "$STROP_BASE_URL/v1/completions" in page and "with Strop() as client" in page
    assert 'href="/dashboard/t/acme/keys/"' in page
    assert new_tenant["raw_key"] not in page  # a key is shown once, when made; never here
    assert 'hx-get="/dashboard/t/acme/adapters/tab/live/?first_event=1"' in page
    # The header names the base model once: "on the base model base", not "base base".
    assert "· base base" not in page and 'on the base model <span class="mono">base</span>' in page


def test_a_viewer_is_told_who_makes_keys(client, new_tenant):
    client.force_login(new_tenant["viewer"])
    page = client.get("/dashboard/t/acme/").content.decode()
    assert "An admin or owner of Acme creates keys" in page


def test_the_waiting_line_waits_then_reloads_the_page_once_an_interaction_arrives(client, new_tenant):
    client.force_login(new_tenant["viewer"])
    url = "/dashboard/t/acme/adapters/tab/live/?first_event=1"
    waiting = client.get(url)
    assert waiting.status_code == 200 and waiting.content.decode().lstrip().startswith('<p id="first-event"')
    assert "HX-Refresh" not in waiting
    log_events(new_tenant["tenant"], outcomes=["accepted"])
    arrived = client.get(url)
    assert arrived.status_code == 204 and arrived["HX-Refresh"] == "true"
    page = client.get("/dashboard/t/acme/").content.decode()
    assert 'id="first-run"' not in page and 'id="live"' in page and "Over time" in page


def test_a_tenant_with_traffic_sees_no_first_run_panel(login, world):
    page = login(world.users["viewer"]).get(url_for("overview", world)).content.decode()
    assert 'id="first-run"' not in page and 'id="live"' in page


def _policy_post(**changes):
    return {**ACTIONS["training-policy"][1], **changes}


def test_a_code_completion_adapter_shows_no_agent_rewards_and_keeps_them_when_saved(login, world):
    client = login(world.users["admin"])
    url = url_for("training-policy", world)
    page = client.get(url).content.decode()
    assert "What each outcome is worth" in page and "reward_thumbs_up" not in page
    data = {k: v for k, v in _policy_post(min_new_events="32").items() if k not in _agent_fields()}
    response = client.post(url, data, follow=True)
    assert "Training policy saved:" in response.content.decode()
    policy = TrainingPolicy.objects.get(adapter=world.adapter)
    assert policy.min_new_events == 32
    assert all(getattr(policy, name) == TrainingPolicy._meta.get_field(name).default for name in _agent_fields())


def test_an_adapter_that_answers_agents_shows_their_rewards(login, world):
    from apps.interactions.models import Interaction

    Interaction.objects.filter(pk=world.interaction_id).update(messages=[{"role": "user", "content": "Add"}])
    page = login(world.users["admin"]).get(url_for("training-policy", world)).content.decode()
    assert "What each agent signal is worth" in page and 'name="reward_thumbs_up"' in page
    assert 'docs/agents.md, "Agents"' in page and "README" not in page


def test_the_eval_gate_is_set_field_by_field_and_a_bad_value_opens_advanced(login, world):
    client = login(world.users["admin"])
    url = url_for("training-policy", world)
    page = client.get(url).content.decode()
    assert "<details" in page and "Advanced" in page and 'name="gate_max_kl"' in page
    assert 'name="gate_overrides"' not in page and 'placeholder="0.5"' in page  # the default, shown
    refused = client.post(url, _policy_post(gate_max_kl="9"))
    assert refused.status_code == 400
    body = refused.content.decode()
    assert 'id="id_gate_max_kl_error"' in body and "less than or equal to 5" in body
    assert '<details class="card form__section disclosure disclosure--card" open>' in body
    assert not TrainingPolicy.objects.filter(adapter=world.adapter).exists()
    client.post(url, _policy_post(gate_max_kl="0.25", gate_min_heldout="16"))
    policy = TrainingPolicy.objects.get(adapter=world.adapter)
    assert policy.gate_overrides == {"max_kl": 0.25, "min_heldout": 16}
    again = client.get(url).content.decode()
    assert 'name="gate_max_kl" value="0.25"' in again


def _agent_fields() -> set[str]:
    from apps.dashboard.policy_form import AGENT_REWARD_FIELDS

    return set(AGENT_REWARD_FIELDS)
