"""The ``Literal`` types follow the server's own lists, and the calls that take those values say
so; API keys (where scopes are passed) through the SDK."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import get_args, get_type_hints

import pytest
from strop import AsyncStrop, AuthenticationError, Metric, Outcome, PermissionDeniedError, Scope, Strop
from strop._async_experiments import AsyncExperiments
from strop._async_management import AsyncKeys
from strop._async_resources import AsyncFeedback
from strop._experiments import Experiments
from strop._management import Keys
from strop._resources import Feedback

from apps.experiments.stats import METRICS
from apps.interactions.models import Feedback as FeedbackRow
from apps.tenants.services import ALL_SCOPES

pytestmark = pytest.mark.django_db(transaction=True)


def test_outcome_scope_and_metric_list_what_the_server_takes():
    assert list(get_args(Outcome)) == list(FeedbackRow.Outcome.values)
    assert list(get_args(Scope)) == list(ALL_SCOPES)
    assert list(get_args(Metric)) == sorted(METRICS)


def test_the_readme_lists_every_scope():
    readme = (Path(__file__).resolve().parents[2] / "sdk" / "README.md").read_text()
    (listed,) = re.findall(r"`strop\.Scope` \(([^)]*)\)", readme)
    assert re.findall(r"`(\w+)`", listed) == list(get_args(Scope))


@pytest.mark.parametrize("resource", [Feedback, AsyncFeedback])
def test_feedback_calls_take_an_outcome(resource):
    for method in (resource.send, resource.enqueue, resource.session_outcome):
        assert get_type_hints(method)["outcome"] == Outcome


@pytest.mark.parametrize("resource", [Keys, AsyncKeys])
def test_key_creation_takes_scopes(resource):
    assert get_type_hints(resource.create)["scopes"] == Sequence[Scope]


@pytest.mark.parametrize("resource", [Experiments, AsyncExperiments])
def test_experiment_creation_takes_metrics(resource):
    hints = get_type_hints(resource.create)
    assert (hints["primary_metric"], hints["guardrails"]) == (Metric | None, Sequence[Metric] | None)


def test_keys_are_created_with_scopes_listed_and_revoked(api):
    with Strop(base_url=api.url, api_key=api.key) as admin:
        created = admin.keys.create(name="editor plugin", scopes=["feedback"])
        assert created.key and created.key.startswith("strop_") and created.scopes == ["feedback"]
        assert created.revoked_at is None and created.id in [key.id for key in admin.keys.list()]
        assert admin.keys.get(created.id).key is None  # the secret is shown once

        with Strop(base_url=api.url, api_key=created.key, max_retries=0) as plugin:
            with pytest.raises(PermissionDeniedError):
                plugin.keys.list()  # feedback only
            revoked = admin.keys.revoke(created.id)
            assert revoked.revoked_at is not None
            with pytest.raises(AuthenticationError):
                plugin.feedback.send(client_id="c-1", outcome="accepted")
        with pytest.raises(TypeError):
            admin.keys.create(name="oops", scopes="serve")  # type: ignore[arg-type]


def test_the_async_client_manages_keys_too(api):
    async def main() -> tuple[list[str], bool]:
        async with AsyncStrop(base_url=api.url, api_key=api.key) as admin:
            created = await admin.keys.create(name="ci", scopes=["ingest", "serve"], default_opt_in=False)
            names = [key.name for key in await admin.keys.list()]
            return created.scopes, created.default_opt_in is False and "ci" in names

    scopes, listed = asyncio.run(main())
    assert scopes == ["ingest", "serve"] and listed
