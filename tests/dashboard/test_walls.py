"""The dashboard's tenant walls and roles, on every route the URL resolver knows.

A route added without a row in tests/dashboard/routes.py fails the first test, so no page or
action escapes these checks.
"""

from __future__ import annotations

import pytest

from apps.adapters.models import AdapterVersion
from apps.cohorts.models import EndUser
from apps.experiments.models import Experiment
from apps.tenants.models import ApiKey, AuditEvent
from apps.training.models import TrainingPolicy, TrainingRun
from tests.dashboard.routes import (
    ACCOUNT,
    ACTIONS,
    CONFIRM,
    NEEDS_VLLM,
    PUBLIC,
    READ,
    dashboard_routes,
    prepare,
    tenant_routes,
    url_for,
)

pytestmark = pytest.mark.django_db


def test_every_dashboard_route_is_classified():
    assert set(dashboard_routes()) == PUBLIC | ACCOUNT | READ | set(ACTIONS)
    assert set(tenant_routes()) == READ | set(ACTIONS)


def _snapshot(world):
    """What an action could change in tenant A."""
    world.adapter.refresh_from_db()
    return (
        AuditEvent.objects.filter(tenant=world.a).count(),
        world.adapter.production_version_id,
        list(AdapterVersion.objects.filter(adapter=world.adapter).order_by("pk").values_list("status", flat=True)),
        TrainingRun.objects.filter(tenant=world.a).count(),
        TrainingPolicy.objects.filter(adapter=world.adapter).exists(),
        list(ApiKey.objects.filter(tenant=world.a).order_by("pk").values_list("revoked_at", flat=True)),
        list(Experiment.objects.filter(tenant=world.a).order_by("pk").values_list("status", flat=True)),
        list(EndUser.objects.filter(tenant=world.a).order_by("pk").values_list("external_id", "opted_in")),
    )


@pytest.mark.parametrize("name", tenant_routes())
def test_anonymous_is_sent_to_login_from_every_tenant_route(client, world, name):
    before = _snapshot(world)
    url = url_for(name, world)
    for method in ("get", "post"):
        response = getattr(client, method)(url)
        assert response.status_code == 302, (method, url)
        assert response["Location"].startswith("/dashboard/login/?next=")
    assert _snapshot(world) == before


def test_anonymous_polling_reloads_to_login_instead_of_swapping_it_in(client, world):
    response = client.get(url_for("overview-live", world), HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response["HX-Redirect"] == "/dashboard/login/"


@pytest.mark.parametrize("name", tenant_routes())
def test_member_of_b_gets_404_on_every_page_and_action_of_a(login, world, name):
    client = login(world.users["outsider"])
    before = _snapshot(world)
    url = url_for(name, world)
    data = ACTIONS.get(name, ("post", {}, ""))[1]
    for response in (client.get(url), client.post(url, data)):
        assert response.status_code == 404, url
        body = response.content.decode()
        assert "Tenant-A" not in body and "editor plugin" not in body and "return a + b" not in body
    assert _snapshot(world) == before


# Route parameters that name one object of a tenant (an adapter is named, so B may have one of A's name).
OBJECT_IDS = {"run_id", "experiment_id", "interaction_id", "key_id", "webhook_id", "membership_id", "invitation_id"}


@pytest.mark.parametrize(
    "name", [n for n in tenant_routes() if dashboard_routes()[n] & OBJECT_IDS and n != "invitation-accept"]
)
def test_an_admin_of_b_on_bs_own_pages_cannot_reach_an_object_of_a_by_its_id(login, world, name):
    client = login(world.users["outsider"])  # an admin of B
    before = _snapshot(world)
    url = url_for(name, world).replace(f"/t/{world.a.slug}/", f"/t/{world.b.slug}/", 1)
    assert f"/t/{world.b.slug}/" in url
    data = ACTIONS.get(name, ("post", {}, ""))[1]
    got, posted = client.get(url), client.post(url, data)
    assert got.status_code in (404, 405) and posted.status_code == 404, (url, got.status_code, posted.status_code)
    for response in (got, posted):
        body = response.content.decode()
        assert "Tenant-A" not in body and "editor plugin" not in body and "return a + b" not in body
    assert _snapshot(world) == before


@pytest.mark.parametrize("name", sorted(READ))
def test_viewer_reads_every_page(login, world, name):
    response = login(world.users["viewer"]).get(url_for(name, world))
    assert response.status_code == 200


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_viewer_cannot_act_and_nothing_changes(login, world, name):
    client = login(world.users["viewer"])
    before = _snapshot(world)
    method, data, _ = ACTIONS[name]
    response = getattr(client, method)(url_for(name, world), data)
    assert response.status_code == 403
    assert "Nothing was changed" in response.content.decode()
    assert _snapshot(world) == before
    if name in CONFIRM:
        assert client.get(url_for(name, world)).status_code == 403


@pytest.mark.parametrize("role", ["admin", "owner"])
@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_admin_and_owner_act_and_each_action_writes_its_audit_row(request, login, world, name, role):
    if name in NEEDS_VLLM:
        request.getfixturevalue("served")
    prepare(name, world)
    user = world.users[role]
    client = login(user)
    method, data, audit_action = ACTIONS[name]
    if name in CONFIRM:
        assert client.get(url_for(name, world)).status_code == 200
    response = getattr(client, method)(url_for(name, world), data)
    assert response.status_code in (201, 302), response.content.decode()[:2000]
    event = AuditEvent.objects.filter(tenant=world.a, action=audit_action).latest("id")
    assert event.actor == f"user:{user.pk}"
    assert not AuditEvent.objects.filter(tenant=world.b, actor=f"user:{user.pk}").exists()
    if name == "experiment-new":  # the form's expected users set the interval's N*
        assert world.adapter.experiments.latest("id").config["n_star"] == 400.0


def test_account_routes_need_sign_in(client, world):
    for name in sorted(ACCOUNT - {"logout"}):
        response = client.get(url_for(name, world))
        assert response.status_code == 302 and response["Location"].startswith("/dashboard/login/")
    assert client.get(url_for("login", world)).status_code == 200
