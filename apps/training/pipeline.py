"""One training run, start to end: export → train → evaluate → register + load, or reject / fail.

Called by the gpu-queue Celery task. The adapter is touched only at the very end, by
registering a verified directory as a new version; a run that fails or is rejected leaves the
adapter exactly as it was.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_serve_probe, adapter_version_register
from apps.common.observability.metrics import training_run_finished
from apps.common.tasks import enqueue
from apps.serving.vllm_client import VLLMUnavailable
from apps.training.dataset import Window, dataset_export
from apps.training.models import EvalSet, TrainingPolicy, TrainingRun
from apps.training.selectors import training_policy_get
from apps.training.services import (
    training_run_advance,
    training_run_advance_log,
    training_run_claim,
    training_run_heartbeat,
    training_schedule_tenant,
)
from gpu_trainer.show_gate import fit_show_threshold, threshold_of

logger = logging.getLogger(__name__)


class _Heartbeat(threading.Thread):
    """Beats while the run works, so the reaper can tell a dead worker from a slow one."""

    def __init__(self, run: TrainingRun) -> None:
        super().__init__(daemon=True, name=f"heartbeat-run-{run.pk}")
        self.run_id, self.attempt = run.pk, run.attempt
        self._stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopped.wait(settings.TRAINING_HEARTBEAT_S):
                if not training_run_heartbeat(self.run_id, attempt=self.attempt):
                    return
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=10)


class RunTakenBack(Exception):
    """The reaper requeued this attempt while it was working; stop quietly."""


def _advance(run: TrainingRun, status: str, **fields: Any) -> None:
    if not training_run_advance(run, status=status, **fields):
        raise RunTakenBack(f"run {run.pk} attempt {run.attempt} was taken back")


def training_run_execute(run_id: int, *, attempt: int) -> str:
    run = training_run_claim(run_id, attempt=attempt)
    if run is None:
        return "skipped"
    heartbeat = _Heartbeat(run)
    heartbeat.start()
    try:
        outcome = _execute(run)
    except RunTakenBack:
        return "taken back"
    except Exception as exc:  # the trainer, the gate or the export failed: record it, keep the adapter
        logger.exception("training run %s failed", run.pk)
        training_run_advance(
            run,
            status=TrainingRun.Status.FAILED,
            error=f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()[-8000:]}",
        )
        outcome = "failed"
    finally:
        heartbeat.stop()
    training_run_finished(run.stage_seconds)
    # Events that arrived while this run trained may already be enough for the next one.
    training_schedule_tenant(run.tenant_id)
    return outcome


def _execute(run: TrainingRun) -> str:
    from gpu_trainer.config import PPOConfig
    from gpu_trainer.gate import GateConfig, evaluate_candidate
    from gpu_trainer.ppo import train_ppo

    _limit_cpu_threads()
    policy = training_policy_get(run.adapter)
    base, parent = run.adapter.base_model, run.parent_version
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    window = dataset_export(run, policy=policy)
    seconds["export"] = time.perf_counter() - started
    if not window.train:
        raise ValueError("the window holds no events to train on (all were held out or none are eligible)")
    _advance(
        run,
        TrainingRun.Status.TRAINING,
        window_size=len(window.train),
        heldout_size=len(window.heldout),
        stage_seconds=seconds,
    )

    run_dir = Path(settings.STROP_RUN_ROOT) / run.tenant.slug / run.adapter.name / f"run-{run.pk}-attempt-{run.attempt}"
    config = PPOConfig.from_dict({
        "seed": run.pk,
        "max_lora_rank": settings.VLLM_MAX_LORA_RANK,
        "autocast_bf16": _autocast(),
        "silence_reward": policy.reward_not_shown,
        **policy.trainer_overrides,
    })
    started = time.perf_counter()
    result = train_ppo(
        config,
        window.train,
        base_model_dir=base.path,
        parent_adapter_dir=parent.artifact_path if parent else None,
        out_dir=run_dir / "adapter",
        progress=False,
    )
    seconds["train"] = time.perf_counter() - started
    _advance(run, TrainingRun.Status.EVALUATING, trainer_summary=result.summary, stage_seconds=seconds)

    started = time.perf_counter()
    eval_set = EvalSet.objects.filter(adapter=run.adapter).first()
    # The candidate is judged as it will be served: with the show gate fitted on its window's
    # training part, against production with production's own gate.
    show_gate = _fit_show_gate(window, policy)
    verdict = evaluate_candidate(
        base_model_dir=base.path,
        parent_adapter_dir=parent.artifact_path if parent else None,
        candidate_adapter_dir=result.out_dir,
        heldout=window.heldout,
        fim_eval=eval_set.cases if eval_set else None,
        config=GateConfig.from_dict({"seed": run.pk, **policy.gate_overrides}),
        max_rank=settings.VLLM_MAX_LORA_RANK,
        kl_prompts=[sample["prompt_token_ids"] for sample in window.train[:32]],
        candidate_show_threshold=threshold_of(show_gate),
        parent_show_threshold=threshold_of(parent.show_gate if parent else None),
        silence_reward=policy.reward_not_shown,
    )
    seconds["gate"] = time.perf_counter() - started
    gate = verdict.as_dict()
    if not verdict.passed:
        _advance(
            run,
            TrainingRun.Status.REJECTED,
            gate=gate,
            stage_seconds=seconds,
            log=run.log + "gate: " + "; ".join(verdict.reasons) + "\n",
        )
        return "rejected"

    started = time.perf_counter()
    probe = adapter_serve_probe(base, result.out_dir, sample=window.train[0])
    version = adapter_version_register(
        run.tenant,
        adapter=run.adapter,
        source_dir=result.out_dir,
        parent=parent,
        status=AdapterVersion.Status.CANDIDATE,
        metrics={"trainer": result.summary, "gate": gate, "run": run.pk, "serve_probe": probe},
        show_gate=show_gate,
        actor=f"training-run:{run.pk}",
        enqueue_load=False,
    )
    _load_now_or_later(version)
    seconds["load"] = time.perf_counter() - started
    _advance(run, TrainingRun.Status.CANDIDATE, output_version=version, gate=gate, stage_seconds=seconds)
    if policy.auto_experiment:
        _start_experiment(run, version)
    return "candidate"


def _fit_show_gate(window: Window, policy: TrainingPolicy) -> dict[str, Any] | None:
    """The candidate's show gate, fitted on the window's shown completions (gpu_trainer.show_gate);
    None when the policy turns it off or too few suggestions were accepted to place it."""
    if not policy.show_gate:
        return None
    fitted = fit_show_threshold(window.gate_events, recall=policy.show_gate_recall)
    if fitted is None:
        return None
    return {**fitted, "recall": policy.show_gate_recall, "explore": policy.show_gate_explore}


def _start_experiment(run: TrainingRun, version: AdapterVersion) -> None:
    """The policy asks for every candidate to meet users in an A/B test at once (unless one runs)."""
    from apps.common.exceptions import ApplicationError
    from apps.experiments.selectors import experiment_running_for
    from apps.experiments.services import experiment_create, experiment_start

    if experiment_running_for(run.adapter) is not None:
        logger.info("run %s: candidate %s waits, an experiment is already running", run.pk, version.vllm_name)
        return
    actor = f"training-run:{run.pk}"
    try:
        experiment = experiment_create(run.tenant, adapter=run.adapter, candidate_version=version, actor=actor)
        experiment_start(run.tenant, experiment=experiment, actor=actor)
    except ApplicationError as exc:  # recorded on the run; the candidate stays, for a person to test
        training_run_advance_log(run, f"experiment not started: {exc.message}")


def _autocast() -> bool:
    """TRAINER_AUTOCAST_BF16 for this worker's device (``auto``: where bf16 is native)."""
    import torch

    from gpu_trainer.policy import autocast_setting

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return autocast_setting(settings.TRAINER_AUTOCAST_BF16, device)


def _limit_cpu_threads() -> None:
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, settings.TRAINER_CPU_THREADS))


def _load_now_or_later(version: AdapterVersion) -> None:
    """Load in vLLM right away (freshness); if vLLM is down, the serving queue retries it."""
    from apps.serving.services import adapter_version_load

    try:
        adapter_version_load(version_id=version.pk)
    except VLLMUnavailable:
        enqueue("workers.serving.adapter_version_load", version.pk)
