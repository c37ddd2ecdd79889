"""Every operation of the API has an SDK method, on both clients, and that method calls it.

``OPERATIONS`` is the one table: each (method, path) of the OpenAPI schema, the SDK method that
calls it, and arguments to call it with. A new endpoint without a method, or a method whose
endpoint went away, fails the first test by name; the last two call every method against the
live server and check the request it sent is its operation's.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from strop import APIStatusError, AsyncStrop, Strop

NO_ID = "00000000-0000-0000-0000-000000000000"
CASE = {"prefix": "def f():\n    ", "suffix": "\n", "middle": "return 1"}


@dataclass(frozen=True)
class Method:
    """An SDK method by its dotted name from the client (``experiments.promote``), and arguments
    that make a valid call of it (the server may still refuse it: a test tenant has no adapter)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def sdk(method: str, /, *args: Any, **kwargs: Any) -> Method:
    return Method(method, args, kwargs)


OPERATIONS: dict[tuple[str, str], Method] = {
    ("get", "/health"): sdk("health.check"),
    # the tenant, keys, audit log
    ("get", "/v1/tenant"): sdk("tenant.get"),
    ("patch", "/v1/tenant"): sdk("tenant.update", accept_pending_feedback=True),
    ("get", "/v1/keys"): sdk("keys.list"),
    ("post", "/v1/keys"): sdk("keys.create", name="coverage", scopes=["feedback"]),
    ("get", "/v1/keys/{key_id}"): sdk("keys.get", 999_999),
    ("delete", "/v1/keys/{key_id}"): sdk("keys.revoke", 999_999),
    ("get", "/v1/audit-events"): sdk("audit_events.list"),
    # serving, logging, feedback
    ("post", "/v1/completions"): sdk("completions.create", prompt="x = ", max_tokens=1),
    ("post", "/v1/chat/completions"): sdk(
        "chat.completions.create", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    ),
    ("get", "/v1/models"): sdk("models.list"),
    ("post", "/v1/interactions"): sdk("interactions.log", client_id="coverage", prompt="x = ", completion="1"),
    ("get", "/v1/interactions"): sdk("interactions.list"),
    ("get", "/v1/interactions/{interaction_id}"): sdk("interactions.get", NO_ID),
    ("get", "/v1/interactions/{interaction_id}/persistence"): sdk("interactions.persistence", NO_ID),
    ("post", "/v1/feedback"): sdk("feedback.send", client_id="coverage", outcome="accepted"),
    ("post", "/v1/feedback/persistence"): sdk("feedback.persistence", client_id="coverage", checkpoint_s=30, text="1"),
    ("post", "/v1/editor/autocomplete"): sdk(
        "editor.autocomplete_outcome", {"completionId": "coverage-editor", "prompt": "x = ", "accepted": True}
    ),
    # cohorts
    ("get", "/v1/users"): sdk("users.list"),
    ("post", "/v1/users/import"): sdk("users.import_", [{"end_user_id": "dev-1", "opted_in": True}]),
    ("get", "/v1/users/{end_user_id}"): sdk("users.get", "dev-1"),
    ("delete", "/v1/users/{end_user_id}"): sdk("users.erase", "nobody"),
    ("post", "/v1/users/{end_user_id}/opt-in"): sdk("users.opt_in", "dev-1"),
    ("post", "/v1/users/{end_user_id}/opt-out"): sdk("users.opt_out", "dev-1"),
    # adapters and training
    ("get", "/v1/adapters"): sdk("adapters.list"),
    ("get", "/v1/adapters/{adapter_name}/versions"): sdk("adapters.versions.list", "tab"),
    ("get", "/v1/adapters/{adapter_name}/versions/{number}"): sdk("adapters.versions.get", "tab", 1),
    ("post", "/v1/adapters/{adapter_name}/versions/{number}/promote"): sdk("adapters.versions.promote", "tab", 1),
    ("post", "/v1/adapters/{adapter_name}/versions/{number}/purge"): sdk("adapters.versions.purge", "tab", 1),
    ("post", "/v1/adapters/{adapter_name}/rollback"): sdk("adapters.rollback", "tab", version=1),
    ("post", "/v1/adapters/{adapter_name}/retrain"): sdk("adapters.retrain", "tab"),
    ("get", "/v1/adapters/{adapter_name}/training-policy"): sdk("training_policy.get", "tab"),
    ("patch", "/v1/adapters/{adapter_name}/training-policy"): sdk("training_policy.update", "tab", min_new_events=8),
    ("get", "/v1/adapters/{adapter_name}/holdout"): sdk("experiments.holdout", "tab"),
    ("put", "/v1/adapters/{adapter_name}/holdout"): sdk("experiments.set_holdout", "tab", share=0.1),
    ("get", "/v1/adapters/{adapter_name}/training-runs"): sdk("training_runs.list", "tab"),
    ("post", "/v1/adapters/{adapter_name}/training-runs"): sdk("training_runs.start", "tab"),
    ("get", "/v1/training-runs/{run_id}"): sdk("training_runs.get", 999_999),
    ("post", "/v1/training-runs/{run_id}/exclude-window"): sdk("training_runs.exclude_window", 999_999),
    ("put", "/v1/adapters/{adapter_name}/eval-set"): sdk("eval_sets.upload", "tab", cases=[CASE]),
    # experiments
    ("get", "/v1/adapters/{adapter_name}/experiments"): sdk("experiments.list", "tab"),
    ("post", "/v1/adapters/{adapter_name}/experiments"): sdk("experiments.create", "tab", candidate_version=1),
    ("get", "/v1/experiments/{experiment_id}"): sdk("experiments.get", 999_999),
    ("get", "/v1/experiments/{experiment_id}/snapshots"): sdk("experiments.snapshots", 999_999),
    ("post", "/v1/experiments/{experiment_id}/start"): sdk("experiments.start", 999_999),
    ("post", "/v1/experiments/{experiment_id}/stop"): sdk("experiments.stop", 999_999, reason="coverage"),
    ("post", "/v1/experiments/{experiment_id}/promote"): sdk("experiments.promote", 999_999),
    ("post", "/v1/experiments/{experiment_id}/rollback"): sdk("experiments.rollback", 999_999),
    ("post", "/v1/experiments/{experiment_id}/snapshot"): sdk("experiments.snapshot", 999_999),
    ("get", "/v1/adapters/{adapter_name}/assignment"): sdk("experiments.assignment", "tab", "dev-1"),
}

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


def schema_operations() -> set[tuple[str, str]]:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {(method, path) for path, item in schema["paths"].items() for method in item if method in HTTP_METHODS}


def resolve(client: Any, name: str) -> Any:
    """The bound method at ``name`` (None when any part of the path is missing)."""
    found = client
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def pattern(path: str) -> re.Pattern[str]:
    return re.compile(
        "".join("[^/]+" if part.startswith("{") else re.escape(part) for part in re.split(r"({\w+})", path))
    )


@pytest.fixture
def clients() -> Any:
    sync, async_ = Strop(api_key="strop_unused"), AsyncStrop(api_key="strop_unused")  # nothing is sent
    yield sync, async_
    sync.close()
    asyncio.run(async_.close())


def test_every_operation_of_the_api_has_a_method_on_both_clients(clients):
    sync, async_ = clients
    operations = schema_operations()
    problems = [
        f"{method.upper()} {path}: no SDK method in OPERATIONS" for method, path in operations - OPERATIONS.keys()
    ]
    problems += [
        f"{method.upper()} {path}: in OPERATIONS, not in the API" for method, path in OPERATIONS.keys() - operations
    ]
    for (method, path), entry in OPERATIONS.items():
        if not callable(resolve(sync, entry.name)):
            problems.append(f"{method.upper()} {path}: Strop has no {entry.name}")
        if not inspect.iscoroutinefunction(resolve(async_, entry.name)):
            problems.append(f"{method.upper()} {path}: AsyncStrop has no coroutine {entry.name}")
    assert not problems, "\n".join(["", *sorted(problems)])


class Requests:
    """(method, path) of every request a client sent, from its event hooks."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def record(self, request: httpx.Request) -> None:
        self.sent.append((request.method.lower(), request.url.path))

    async def record_async(self, request: httpx.Request) -> None:
        self.record(request)


def check_sent(requests: Requests, operation: tuple[str, str], entry: Method) -> str | None:
    method, path = operation
    if len(requests.sent) != 1:
        return f"{entry.name} sent {requests.sent}, not one {method.upper()} {path}"
    sent_method, sent_path = requests.sent[0]
    if sent_method != method or not pattern(path).fullmatch(sent_path):
        return f"{entry.name} sent {sent_method.upper()} {sent_path}, not {method.upper()} {path}"
    return None


@pytest.mark.django_db(transaction=True)
def test_each_sync_method_sends_its_operation(api):
    problems = []
    for operation, entry in OPERATIONS.items():
        requests = Requests()
        http = httpx.Client(event_hooks={"request": [requests.record]}, timeout=60)
        with Strop(base_url=api.url, api_key=api.key, http_client=http, max_retries=0) as client:
            method = resolve(client, entry.name)
            try:
                if method is not None:
                    method(*entry.args, **entry.kwargs)
            except APIStatusError:
                pass  # a refusal is an answer: the request was the operation's
        http.close()
        problems.append(check_sent(requests, operation, entry))
    assert not any(problems), "\n".join(["", *filter(None, problems)])


@pytest.mark.django_db(transaction=True)
def test_each_async_method_sends_its_operation(api):
    async def main() -> list[str | None]:
        problems = []
        for operation, entry in OPERATIONS.items():
            requests = Requests()
            async with httpx.AsyncClient(event_hooks={"request": [requests.record_async]}, timeout=60) as http:
                async with AsyncStrop(base_url=api.url, api_key=api.key, http_client=http, max_retries=0) as client:
                    method = resolve(client, entry.name)
                    try:
                        if method is not None:
                            await method(*entry.args, **entry.kwargs)
                    except APIStatusError:
                        pass
            problems.append(check_sent(requests, operation, entry))
        return problems

    problems = asyncio.run(main())
    assert not any(problems), "\n".join(["", *filter(None, problems)])
