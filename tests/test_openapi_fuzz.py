"""Every operation of the OpenAPI schema, fuzzed by schemathesis against the live server.

Each call must never be a 5xx, must answer a status the schema documents, with the documented
content type and a body that matches the documented shape. Examples are bounded and derandomised
(a fixed seed), so the run is the same on every machine and fits in the suite's time.
"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES_PER_OPERATION = 20


@pytest.fixture
def fuzz_world(served, live_server, make_tenant, make_client, make_lora_adapter):
    """A tenant with a served default adapter, a few rows to find, and a key with every scope."""
    from apps.adapters.services import adapter_create, adapter_version_register, base_model_register
    from apps.tenants.models import ApiKey, Tenant
    from apps.training.models import TrainingRun

    tenant = make_tenant(f"fuzz-{uuid.uuid4().hex[:8]}")
    Tenant.objects.filter(pk=tenant.pk).update(rate_limit_per_minute=10**6)
    base = base_model_register(name=served.served_model_name, path=served.model_dir)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    adapter.max_completion_tokens = 4  # fuzzed completions stay short on the CPU server
    adapter.save(update_fields=["max_completion_tokens"])
    client = make_client(tenant)
    interaction = client.post(
        "/v1/interactions", {"client_id": "c-1", "prompt": "x = ", "completion": "1"}, format="json"
    ).json()
    client.post("/v1/feedback", {"client_id": "c-1", "outcome": "accepted"}, format="json")
    spare_key = make_client(tenant, scopes=["ingest"]).raw_key
    version = adapter_version_register(
        tenant, adapter=adapter, source_dir=make_lora_adapter(seed=5), enqueue_load=False
    )
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="failed", error="an old failure")
    known = {  # real ids for path parameters: half the examples reach real objects, not only 404s
        "adapter_name": "tab",
        "interaction_id": interaction["id"],
        "key_id": str(ApiKey.objects.get(prefix=spare_key.split("_")[1]).pk),
        "number": str(version.number),
        "run_id": str(run.pk),
    }
    return {"base_url": live_server.url, "key": client.raw_key, "known": known}


def _check_operation(operation, fuzz_world, *, mode: GenerationMode, real_ids: bool) -> None:
    known = fuzz_world["known"]
    names = [p.name for p in operation.path_parameters] if real_ids else []
    fixed = {name: known[name] for name in names if name in known}

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=fixed or None))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,  # the same examples on every run: a red run is reproducible, never luck
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
        database=None,
    )
    def run(case) -> None:
        case.call_and_validate(
            base_url=fuzz_world["base_url"],
            headers={"Authorization": f"Bearer {fuzz_world['key']}"},
            checks=[
                checks.not_a_server_error,
                checks.status_code_conformance,
                checks.content_type_conformance,
                checks.response_schema_conformance,
            ],
            timeout=120,
        )

    run()


def test_every_operation_answers_within_its_schema_and_never_5xx(fuzz_world):
    schema = schemathesis.openapi.from_url(f"{fuzz_world['base_url']}/api/schema/?format=json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    failures = []
    for operation in operations:
        # Schema-valid data and data that breaks the schema; for paths with ids, random ids (404s)
        # and the ids of real objects, so that the operation itself runs.
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for real_ids in (False, True) if "{" in operation.path else (False,):
                try:
                    _check_operation(operation, fuzz_world, mode=mode, real_ids=real_ids)
                except Unsatisfiable:
                    continue  # nothing to break in an operation without parameters or body (GET /health)
                except (Exception, BaseExceptionGroup) as exc:  # collect every failure, then report them all
                    failures.append(f"{operation.label} ({mode.value}, real ids: {real_ids}): {exc}"[:3000])
    assert not failures, "\n\n".join(failures)
