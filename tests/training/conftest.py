from __future__ import annotations

import itertools

import pytest

from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.models import TrainingPolicy
from tests.serving.conftest import scripted_vllm  # noqa: F401  (vLLM's admin answers, as a test writes them)

_ids = itertools.count()


@pytest.fixture
def execute_run():
    """``execute(run)``: the gpu worker's task body for ``run``, in this process (its outcome). The
    pipeline narrows torch's CPU threads for training; they are given back afterwards."""
    import torch

    import apps.training.pipeline as pipeline

    def execute(run) -> str:  # type: ignore[no-untyped-def]
        threads = torch.get_num_threads()
        try:
            return pipeline.training_run_execute(run.pk, attempt=run.attempt)
        finally:
            torch.set_num_threads(threads)

    return execute


@pytest.fixture
def tiny_adapter(tenant, tiny_starter_model):
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    TrainingPolicy.objects.create(tenant=tenant, adapter=adapter, min_new_events=8, heldout_fraction=0.25)
    return adapter


@pytest.fixture
def add_events(tenant):
    """``add(n, opted_in=True, outcome=None)``: log n interactions with served-style token ids and label them."""

    def add(n: int, *, opted_in: bool = True, outcome: str | None = None, tenant_=None) -> list[str]:
        owner = tenant_ or tenant
        items = []
        for _ in range(n):
            i = next(_ids)
            items.append(
                {
                    "client_id": f"ev-{i}",
                    "prompt": f"x{i} = ",
                    "completion": "1",
                    "prompt_token_ids": [5, 6, 7 + i % 50],
                    "completion_token_ids": [8 + i % 40, 9],
                    "completion_logprobs": [-0.5, -1.0],
                    "end_user_id": f"dev-{i % 5}" if opted_in else f"private-{i % 5}",
                    "opted_in": opted_in,
                }
            )
        results = interactions_ingest(owner, items=items)
        outcomes = ["accepted", "rejected", "not_shown", "edited"]
        feedback_ingest(
            owner,
            items=[
                {"client_id": r.client_id, "outcome": outcome or outcomes[k % 4], "kept_text": "1"}
                for k, r in enumerate(results)
            ],
        )
        return [r.id for r in results]

    return add


@pytest.fixture
def policy(tiny_adapter):
    """The adapter's training policy with nothing held out: every event of a window trains."""
    policy = TrainingPolicy.objects.get(adapter=tiny_adapter)
    policy.heldout_fraction = 0.0
    policy.save()
    return policy
