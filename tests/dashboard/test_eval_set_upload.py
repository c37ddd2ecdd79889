"""The eval-set upload reads its body only for an admin or owner, and only under the size cap
(issue 40): a viewer's upload is refused unread, an oversize one gets a 413 page and changes
nothing, and the CSRF check still guards the upload (it runs after those two checks).

The client enforces CSRF, as browsers meet it: Django's CSRF middleware would parse a form body
before any view ran."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import MemoryFileUploadHandler
from django.test import Client
from django.urls import reverse

from apps.training.models import EvalSet
from tests.dashboard.conftest import PASSWORD

pytestmark = pytest.mark.django_db

GOOD = b'{"prefix": "def f(", "suffix": "):", "middle": "x"}\n'
PARSED: list[str] = []


class RecordingUploadHandler(MemoryFileUploadHandler):
    """Django's in-memory upload handler, noting each body it starts to parse."""

    def handle_raw_input(self, *args: Any, **kwargs: Any) -> None:
        PARSED.append(self.request.path)
        return super().handle_raw_input(*args, **kwargs)


@pytest.fixture(autouse=True)
def _recorded_parsing(settings: Any) -> None:
    PARSED.clear()
    settings.FILE_UPLOAD_HANDLERS = [f"{__name__}.RecordingUploadHandler"]


@pytest.fixture
def adapter(make_tenant, tiny_starter_model) -> Any:
    from apps.adapters.services import adapter_create, base_model_register

    tenant = make_tenant("tenant-a")
    base = base_model_register(name="starter-tiny", path=tiny_starter_model)
    return adapter_create(tenant, name="tab", base_model=base, is_default=True)


def _signed_in(make_user: Any, adapter: Any, role: str) -> Client:
    """A browser-like client (CSRF enforced) signed in through the login form, and its CSRF token."""
    user = make_user(f"{role}-user", adapter.tenant, role)
    client = Client(enforce_csrf_checks=True)
    client.get(reverse("dashboard:login"))
    token = client.cookies["csrftoken"].value
    response = client.post(
        reverse("dashboard:login"), {"username": user.username, "password": PASSWORD, "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    PARSED.clear()  # the login form's body was parsed, as it should be
    client.defaults["HTTP_X_CSRFTOKEN"] = client.cookies["csrftoken"].value
    return client


def _url(adapter: Any) -> str:
    return reverse("dashboard:eval-set", kwargs={"tenant_slug": adapter.tenant.slug, "adapter_name": adapter.name})


def test_a_viewers_upload_is_refused_before_its_body_is_read(make_user, adapter, settings):
    client = _signed_in(make_user, adapter, "viewer")
    big = SimpleUploadedFile("cases.jsonl", GOOD * (settings.STROP_EVAL_SET_MAX_BYTES // len(GOOD) + 10))

    response = client.post(_url(adapter), {"file": big})

    assert response.status_code == 403
    assert PARSED == []
    assert not EvalSet.objects.filter(adapter=adapter).exists()


def test_an_admins_oversize_upload_is_refused_unread_with_a_message(make_user, adapter, settings):
    client = _signed_in(make_user, adapter, "admin")
    big = SimpleUploadedFile("cases.jsonl", GOOD * (settings.STROP_EVAL_SET_MAX_BYTES // len(GOOD) + 2000))

    response = client.post(_url(adapter), {"file": big})

    assert response.status_code == 413
    assert "The upload is larger than 5 MiB: nothing was read or changed." in response.content.decode()
    assert PARSED == []
    assert not EvalSet.objects.filter(adapter=adapter).exists()


def test_an_admins_file_just_over_the_cap_is_named_beside_the_field(make_user, adapter, settings):
    settings.STROP_EVAL_SET_MAX_BYTES = 10 * len(GOOD)
    client = _signed_in(make_user, adapter, "admin")

    response = client.post(_url(adapter), {"file": SimpleUploadedFile("cases.jsonl", GOOD * 11)})

    assert response.status_code == 400
    assert f"at most {10 * len(GOOD):,}" in response.content.decode()
    assert not EvalSet.objects.filter(adapter=adapter).exists()


def test_an_admins_upload_is_stored_and_still_needs_its_csrf_token(make_user, adapter):
    client = _signed_in(make_user, adapter, "admin")
    token = client.defaults.pop("HTTP_X_CSRFTOKEN")

    refused = client.post(_url(adapter), {"file": SimpleUploadedFile("cases.jsonl", GOOD)})
    assert refused.status_code == 403 and not EvalSet.objects.filter(adapter=adapter).exists()

    stored = client.post(_url(adapter), {"file": SimpleUploadedFile("cases.jsonl", GOOD)}, HTTP_X_CSRFTOKEN=token)
    assert stored.status_code == 302
    assert len(EvalSet.objects.get(adapter=adapter).cases) == 1
