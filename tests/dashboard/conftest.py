"""Dashboard fixtures: users with roles, and a tenant whose data is made through the real services."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

PASSWORD = "correct-horse-battery"
_ids = itertools.count()


@pytest.fixture(autouse=True)
def _webhooks_without_dns(settings: Any) -> None:
    """Nothing resolves names here: the pages' webhooks skip the address rule, which has its own
    tests (tests/notifications)."""
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """PBKDF2's deliberate slowness costs ~0.5 s a user on this machine; tests need no such strength."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    """``make(username, tenant=None, role="viewer")``: a dashboard user (password PASSWORD), a member of ``tenant``."""
    from django.contrib.auth import get_user_model

    from apps.tenants.services import membership_create

    def make(username: str, tenant: Any = None, role: str = "viewer") -> Any:
        user = get_user_model().objects.create_user(username=username, password=PASSWORD)
        if tenant is not None:
            membership_create(tenant, user=user, role=role)
        return user

    return make


@pytest.fixture(scope="session")
def lora_source(make_lora_adapter: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random LoRA for the tiny starter model with the per-step ``metrics.jsonl`` a trainer writes beside it."""
    source = make_lora_adapter(seed=3)
    with (source / "metrics.jsonl").open("w") as fh:
        for step in range(12):
            row = {
                "step": step,
                "loss": 0.5 - step * 0.02,
                "policy_loss": 0.4 - step * 0.02,
                "approx_kl": 0.001 * step,
                "clip_fraction": 0.02 * (step % 4),
                "entropy": 2.0 - 0.05 * step,
                "reward_mean": 0.1 + 0.03 * step,
            }
            fh.write(json.dumps(row) + "\n")
        fh.write("not json\n")
    return source


def log_events(
    tenant: Any,
    *,
    outcomes: list[str | None],
    adapter_name: str = "",
    minutes_ago: float = 5,
    user: str = "dev-1",
    completion: str = "return a + b",
    version: Any = None,
    refresh: bool = True,
) -> list[str]:
    """Log one interaction per outcome (None: no feedback) through the ingest services; ids returned.
    ``refresh=False`` leaves the rollups to a later ``rollups_refresh`` (one pass for many calls)."""
    from apps.interactions.models import Interaction
    from apps.interactions.rollups import rollups_refresh
    from apps.interactions.services import feedback_ingest, interactions_ingest

    served_at = (timezone.now() - timedelta(minutes=minutes_ago)).isoformat()
    items = [
        {
            "client_id": f"dash-{next(_ids)}",
            "prefix": "def add(a, b):\n    ",
            "suffix": "\n",
            "completion": completion,
            "completion_token_ids": [689, 264, 489, 293],
            "completion_logprobs": [-0.1, -0.3, -0.05, -0.2],
            "model": adapter_name,
            "end_user_id": user,
            "opted_in": True,
            "served_at": served_at,
            "latency_ms": 41,
        }
        for _ in outcomes
    ]
    results = interactions_ingest(tenant, items=items)
    ids = [r.id for r in results]
    if version is not None:  # logged interactions do not name a version; served ones do
        Interaction.objects.filter(pk__in=ids).update(adapter_version=version, adapter=version.adapter)
    feedback = [
        {"interaction_id": r.id, "outcome": outcome, "kept_text": "return a+b"}
        for r, outcome in zip(results, outcomes, strict=True)
        if outcome is not None
    ]
    if feedback:
        feedback_ingest(tenant, items=feedback)
    if refresh:
        rollups_refresh(tenant.pk)  # what beat does every few seconds: the pages read rollups
    return ids


def start_experiment_unprobed(tenant: Any, *, candidate: Any, exposed: tuple[str, ...] = ("dev-1", "dev-2")) -> Any:
    """An experiment of ``candidate`` made by ``experiment_create`` and put in the state
    ``experiment_start`` leaves it in, without its vLLM load and probe (the dashboard's page tests
    run without vLLM; the actions that need vLLM take the ``served`` fixture). Its first users are
    exposed and one snapshot is taken by the real services."""
    import secrets

    from apps.adapters.models import AdapterVersion
    from apps.experiments.models import CANDIDATE, CONTROL, Experiment
    from apps.experiments.services import experiment_create, experiment_snapshot_take, exposure_record

    experiment = experiment_create(
        tenant,
        adapter=candidate.adapter,
        candidate_version=candidate,
        actor="system",
        config={"min_users_per_arm": 2, "n_star": 200},  # N* near the tests' sample: the tightest band
    )
    candidate.adapter.refresh_from_db()
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.RUNNING,
        control_version=candidate.adapter.production_version,
        salt=secrets.token_hex(8),
        started_at=timezone.now() - timedelta(hours=1),
    )
    AdapterVersion.objects.filter(pk=candidate.pk).update(status=AdapterVersion.Status.IN_EXPERIMENT)
    experiment.refresh_from_db()
    for index, user in enumerate(exposed):
        exposure_record(experiment, external_id=user, arm=CONTROL if index % 2 == 0 else CANDIDATE)
    experiment_snapshot_take(experiment.pk)
    return experiment


@dataclass
class World:
    """Tenant A with an adapter, versions, a finished run, interactions and keys; tenant B beside it."""

    a: Any
    b: Any
    adapter: Any
    v1: Any
    v2: Any
    run: Any
    interaction_id: str
    key: Any
    experiment: Any = None
    users: dict[str, Any] = field(default_factory=dict)


def build_world(
    make_tenant: Callable[..., Any],
    make_user: Callable[..., Any],
    tiny_starter_model: Path,
    lora_source: Path,
    *,
    slug_a: str = "tenant-a",
    slug_b: str = "tenant-b",
) -> World:
    from apps.adapters.services import (
        adapter_create,
        adapter_version_mark_loaded,
        adapter_version_promote,
        adapter_version_register,
        base_model_register,
    )
    from apps.tenants.services import api_key_create
    from apps.training.models import TrainingRun
    from apps.training.services import training_run_advance, training_run_claim, training_run_start

    a, b = make_tenant(slug_a), make_tenant(slug_b)
    base = base_model_register(name="starter-tiny", path=tiny_starter_model)
    adapter = adapter_create(a, name="tab", base_model=base, is_default=True)
    adapter_create(b, name="tab", base_model=base, is_default=True)
    v1 = adapter_version_register(a, adapter=adapter, source_dir=lora_source, enqueue_load=False)
    adapter_version_mark_loaded(v1)
    adapter_version_promote(a, version=v1, actor="system")
    run = training_run_start(a, adapter=adapter, actor="system")
    assert run is not None
    run = training_run_claim(run.pk, attempt=run.attempt)
    gate = {
        "passed": True,
        "reasons": [],
        "notes": ["no FIM eval set"],
        "finite": True,
        "kl_to_parent": 0.012,
        "kl_check": "pass",
        "kl_positions": 96,
        "kl_source": "heldout",
        "reward_candidate": 0.31,
        "reward_parent": 0.22,
        "reward_check": "pass",
        "heldout_count": 8,
        "effective_sample_size": 6.5,
        "fim_check": "skipped",
        "fim_count": 0,
        "feedback_check": "passed",
        "feedback_direction": {"auc": 0.912, "z": 5.3, "accepted": 12, "others": 33},
    }
    training_run_advance(
        run, status=TrainingRun.Status.TRAINING, window_size=40, heldout_size=8, stage_seconds={"export": 0.4}
    )
    training_run_advance(
        run,
        status=TrainingRun.Status.EVALUATING,
        trainer_summary={"steps": 12, "samples": 40},
        stage_seconds={"export": 0.4, "train": 12.5},
    )
    v2 = adapter_version_register(
        a,
        adapter=adapter,
        source_dir=lora_source,
        parent=v1,
        enqueue_load=False,
        metrics={"trainer": {"steps": 12, "samples": 40}, "gate": gate, "run": run.pk},
    )
    adapter_version_mark_loaded(v2)
    training_run_advance(
        run,
        status=TrainingRun.Status.CANDIDATE,
        output_version=v2,
        gate=gate,
        stage_seconds={"export": 0.4, "train": 12.5, "gate": 3.1, "load": 0.2},
    )
    ids = log_events(a, outcomes=["accepted", "rejected", "edited", "not_shown", None], version=v1)
    from apps.cohorts.services import end_users_observe

    end_users_observe(a, observations=[("dev-2", True)], source="import", actor="system", default=True)
    log_events(b, outcomes=["accepted"], completion="B's secret completion")
    experiment = start_experiment_unprobed(a, candidate=v2)
    users = {
        "owner": make_user("olivia", a, "owner"),
        "admin": make_user("adam", a, "admin"),
        "viewer": make_user("vera", a, "viewer"),
        "outsider": make_user("bob", b, "admin"),
    }
    key = api_key_create(
        a, name="editor plugin", scopes=["ingest", "feedback"], actor=f"user:{users['owner'].pk}"
    ).api_key
    return World(
        a=a,
        b=b,
        adapter=adapter,
        v1=v1,
        v2=v2,
        run=run,
        interaction_id=ids[0],
        key=key,
        experiment=experiment,
        users=users,
    )


@pytest.fixture
def world(make_tenant, make_user, tiny_starter_model, lora_source) -> World:
    return build_world(make_tenant, make_user, tiny_starter_model, lora_source)


@pytest.fixture
def login(client: Any) -> Callable[[Any], Any]:
    def as_user(user: Any) -> Any:
        client.force_login(user)
        return client

    return as_user


def feed_experiment(
    world: World, *, users: int = 40, prefix: str = "sim", batches: int = 1, minutes_ago: float = 10
) -> Any:
    """Simulated opted-in users meet the world's running experiment (alternating arms) and use it
    through the real ingest services: the candidate's suggestions are accepted far more often.
    After each of ``batches`` groups of users a snapshot is taken, as beat does every minute.
    Returns the last snapshot."""
    from apps.cohorts.models import ConsentChange
    from apps.cohorts.services import end_users_observe
    from apps.experiments.models import CANDIDATE, CONTROL
    from apps.experiments.services import experiment_snapshot_take, exposure_record
    from apps.interactions.rollups import rollups_refresh

    names = [f"{prefix}-{i:04d}" for i in range(users)]
    end_users_observe(
        world.a,
        observations=[(name, True) for name in names],
        source=ConsentChange.Source.IMPORT,
        actor="system",
        default=True,
    )
    snapshot = None
    per_batch = -(-users // batches)
    for start in range(0, users, per_batch):
        for index in range(start, min(start + per_batch, users)):
            arm = CONTROL if index % 2 == 0 else CANDIDATE
            exposure_record(world.experiment, external_id=names[index], arm=arm)
            accepted = index % 2 if arm == CONTROL else 2 + index % 3
            outcomes: list[str | None] = ["accepted"] * accepted + ["rejected"] * (4 - accepted)
            log_events(world.a, outcomes=outcomes, user=names[index], minutes_ago=minutes_ago, refresh=False)
        rollups_refresh(world.a.pk)  # beat's pass over the batch's hours, before its snapshot
        snapshot = experiment_snapshot_take(world.experiment.pk)
    return snapshot
