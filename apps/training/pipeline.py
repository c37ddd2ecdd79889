"""One training run, start to end: export → train → evaluate → register + load, or reject / fail.

Called by the gpu-queue Celery task. The adapter is touched only at the very end, by
registering a verified directory as a new version; a run that fails or is rejected leaves the
adapter exactly as it was.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, connection

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import (
    adapter_serve_probe,
    adapter_version_fetch,
    adapter_version_register,
    atomic_undoing_uploads,
)
from apps.common.exception_handler import public_text
from apps.common.exceptions import ValidationFailed
from apps.common.observability.metrics import training_run_finished
from apps.common.tasks import enqueue
from apps.engines.vllm_client import VLLMError, VLLMUnavailable
from apps.training.dataset import Window, dataset_export
from apps.training.erasure import training_run_erased
from apps.training.models import ACTIVE_STATUSES, TrainingPolicy, TrainingRun
from apps.training.overrides import overrides_checked
from apps.training.selectors import GOOD_VERSION_STATUSES, eval_set_get, training_policy_get
from apps.training.services import (
    training_run_advance,
    training_run_advance_log,
    training_run_claim,
    training_run_discard,
    training_run_heartbeat,
    training_schedule_tenant,
    wall_time_reason,
)
from learning_shared.errors import TrainerInputError, TrainingDivergedError
from learning_shared.show_filter import fit_show_threshold, threshold_of

logger = logging.getLogger(__name__)


class _Heartbeat(threading.Thread):
    """Beats while the run works, so the reaper can tell a dead worker from a slow one; and
    notices, at each beat, that the run was taken back or an end user in its window was erased.
    A beat that fails (the database went away a moment) is logged and tried again at the next
    interval; once none has gone through for ``TRAINING_STALE_AFTER_S``, or if the thread ends for
    any other reason while the run works, the run stops as lost: the reaper may requeue it, and it
    must never train beside the worker that takes it next."""

    def __init__(self, run: TrainingRun) -> None:
        super().__init__(daemon=True, name=f"heartbeat-run-{run.pk}")
        self.training_run = run
        self.lost = threading.Event()  # the reaper took this attempt back, or no longer can be told it lives
        self.erased = threading.Event()  # an end user in the window was erased
        self._stopped = threading.Event()

    def run(self) -> None:
        run = self.training_run
        last_beat = time.monotonic()
        try:
            while not self._stopped.wait(settings.TRAINING_HEARTBEAT_S):
                try:
                    if not training_run_heartbeat(run.pk, attempt=run.attempt):
                        self.lost.set()
                        return
                    last_beat = time.monotonic()
                    if training_run_erased(run):
                        self.erased.set()
                except Exception:  # the database went away a moment: beat again at the next interval
                    logger.warning("training run %s: a heartbeat failed; retrying", run.pk, exc_info=True)
                    connection.close()  # a broken connection is not reused: the next beat opens a new one
                # Silent this long, the reaper may have requeued the run and another worker may take it.
                if time.monotonic() - last_beat >= settings.TRAINING_STALE_AFTER_S:
                    logger.error(
                        "training run %s: no heartbeat for %s s; stopping it as lost",
                        run.pk,
                        settings.TRAINING_STALE_AFTER_S,
                    )
                    return
        except Exception:
            logger.exception("training run %s: its heartbeat died; stopping the run as lost", run.pk)
        finally:
            if not self._stopped.is_set():
                self.lost.set()  # the thread ends while the run works (taken back, or it died): the run stops
            connection.close()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=10)


class RunTakenBack(Exception):
    """The reaper requeued (or ended) this attempt while it was working; stop quietly."""


class RunStopped(Exception):
    """The run must stop now and end failed, with this reason (no traceback: nothing broke)."""


class RunDiscarded(RunStopped):
    """An end user in the window was erased: what the run learned must not be registered."""

    from_head = False  # the rerun trains from the run's own parent


class RunParentRetired(RunDiscarded):
    """The version the run trained from left the lineage while it ran (its A/B test lost, an alarm or a
    person rolled it back): registered, what it learned on top would become the head the next runs
    build on. Nothing is registered; the rerun trains from the current head."""

    from_head = True


LEFT_OUT_LOGGED = 5  # events named in the run's log when some of its window could not be made into samples

DISCARD_REASON = (
    "discarded: an end user in its window was erased while it ran; nothing it learned was kept, "
    "and a new run without them was scheduled"
)


class _Guard:
    """What stops a run between two trainer steps (and between stages): its wall-time limit, an
    erased end user, the reaper taking it back."""

    def __init__(self, run: TrainingRun, heartbeat: _Heartbeat) -> None:
        self.run, self.heartbeat = run, heartbeat
        self.deadline = time.monotonic() + settings.TRAINING_MAX_RUN_S

    def check(self, step: object = None) -> None:
        """Between trainer steps (``step``: its metrics) the heartbeat's flags are read; between
        stages the database is asked too."""
        if self.heartbeat.lost.is_set():
            raise RunTakenBack("taken back by the reaper, or its heartbeat stopped")
        if self.heartbeat.erased.is_set() or (step is None and training_run_erased(self.run)):
            raise RunDiscarded(DISCARD_REASON)
        if time.monotonic() > self.deadline:
            raise RunStopped(wall_time_reason())


def _advance(run: TrainingRun, status: str, **fields: Any) -> None:
    if not training_run_advance(run, status=status, **fields):
        raise RunTakenBack(f"run {run.pk} attempt {run.attempt} was taken back")


def run_dir_of(run: TrainingRun) -> Path:
    """The run's working folder on this GPU host: the parent's weights fetched, the candidate's
    written. Removed when the run ends (the adapter store keeps a registered version), so no weights
    trained on an end user outlive an erase or a purge here."""
    return Path(settings.STROP_RUN_ROOT) / run.tenant.slug / run.adapter.name / f"run-{run.pk}-attempt-{run.attempt}"


_RUN_FOLDER = re.compile(r"run-(\d+)-attempt-(\d+)")


def run_dirs_sweep() -> list[Path]:
    """Remove this host's run folders whose run has ended: those a worker killed mid-run left (a run
    that ends removes its own). A folder is removed only when its run is in this database, under the
    same tenant and adapter, and no longer active; anything else under the root (another
    deployment's, a run still going, an attempt the reaper took back while its run goes on) stays.
    Each run's start and each worker's start call it; what it removed comes back."""
    root = Path(settings.STROP_RUN_ROOT)
    found: dict[Path, tuple[str, str, int]] = {}
    for folder in root.glob("*/*/run-*-attempt-*"):
        match = _RUN_FOLDER.fullmatch(folder.name)
        if match and folder.is_dir():
            found[folder] = (folder.parent.parent.name, folder.parent.name, int(match[1]))
    if not found:
        return []
    ended = set(
        TrainingRun.objects.filter(pk__in={pk for _, _, pk in found.values()})
        .exclude(status__in=ACTIVE_STATUSES)
        .values_list("tenant__slug", "adapter__name", "pk")
    )
    removed = [folder for folder, key in found.items() if key in ended]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    if removed:
        logger.info("removed %d folder(s) of ended runs under %s", len(removed), root)
    return removed


def training_run_execute(run_id: int, *, attempt: int) -> str:
    run = training_run_claim(run_id, attempt=attempt)
    if run is None:
        return "skipped"
    logger.info("training run %s attempt %s started", run.pk, run.attempt)
    run_dirs_sweep()
    heartbeat = _Heartbeat(run)
    heartbeat.start()
    try:
        outcome = _execute(run, _Guard(run, heartbeat))
    except RunTakenBack:
        return "taken back"
    except RunDiscarded as exc:
        logger.warning("training run %s discarded: %s", run.pk, exc)
        training_run_discard(run, reason=str(exc), from_head=exc.from_head)
        outcome = "failed"
    except RunStopped as exc:
        logger.warning("training run %s stopped: %s", run.pk, exc)
        training_run_advance(run, status=TrainingRun.Status.FAILED, error=str(exc))
        outcome = "failed"
    except Exception as exc:  # the trainer, the gate or the export failed: record it, keep the adapter
        # The tenant sees what went wrong in one line; the traceback, with hosts and paths, goes
        # to the operator's log only.
        logger.exception("training run %s failed", run.pk)
        training_run_advance(run, status=TrainingRun.Status.FAILED, error=failure_reason(exc, run))
        outcome = "failed"
    finally:
        heartbeat.stop()
        shutil.rmtree(run_dir_of(run), ignore_errors=True)
    training_run_finished(run.stage_seconds)
    # Events that arrived while this run trained may already be enough for the next one.
    training_schedule_tenant(run.tenant_id)
    return outcome


def failure_reason(exc: BaseException, run: TrainingRun) -> str:
    """The one line a tenant reads: what failed, never where (paths of this host are cut out)."""
    if isinstance(exc, SoftTimeLimitExceeded):
        return wall_time_reason(run.output_version)
    text = public_text(str(exc), max_length=1000)  # the first line, its hosts and paths cut out
    if isinstance(exc, (TrainerInputError, TrainingDivergedError, ValidationFailed)):
        return text
    return f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (see the operator's log)"


def _execute(run: TrainingRun, guard: _Guard) -> str:
    from gpu_trainer.config import PPOConfig
    from gpu_trainer.gate import FAILED, GateConfig, GateVerdict, evaluate_candidate, feedback_check
    from gpu_trainer.ppo import train_ppo

    _limit_cpu_threads()
    policy = training_policy_get(run.adapter)
    base, parent = run.adapter.base_model, run.parent_version
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    try:
        window = dataset_export(run, policy=policy, max_events=settings.TRAINING_MAX_WINDOW_EVENTS)
    except IntegrityError:  # an event of the window went while it was being fixed: an end user was erased
        raise RunDiscarded(DISCARD_REASON) from None
    seconds["export"] = time.perf_counter() - started
    _log_left_out(run, window)
    guard.check()
    if not window.train:
        unusable = f"; {len(window.left_out)} could not be made into samples" if window.left_out else ""
        raise ValueError(f"the window holds no events to train on (all were held out or none are eligible{unusable})")
    _advance(
        run,
        TrainingRun.Status.TRAINING,
        window_size=len(window.train),
        heldout_size=len(window.heldout),
        stage_seconds=seconds,
    )

    # A policy stored before its limits were tightened fails here, with the API's own message.
    trainer_overrides = overrides_checked("trainer_overrides", policy.trainer_overrides)
    gate_overrides = overrides_checked("gate_overrides", policy.gate_overrides)
    gate_config = GateConfig.from_dict({"seed": run.pk, **gate_overrides})
    # Feedback reported the wrong way round would only be caught by the gate after a whole run: the
    # window alone says so, so the run stops here (the gate checks it again, and records it, below).
    early = GateVerdict(heldout_count=len(window.heldout))
    feedback_check(early, window.show_events, gate_config)
    if early.feedback_check == FAILED:
        early.notes.append("stopped before training: nothing was trained on this window")
        return _reject(run, early)

    run_dir = run_dir_of(run)
    # The candidate's show filter, fitted on the window's training part (what serving will gate it
    # with); fitted before training, since whether there is one decides who teaches silence.
    show_gate = _fit_show_filter(window, policy)
    config = PPOConfig.from_dict(
        {
            "seed": run.pk,
            "max_lora_rank": settings.VLLM_MAX_LORA_RANK,
            "autocast_bf16": _autocast(),
            "silence_reward": policy.reward_not_shown,
            "silence_gated": silence_gated(show_gate),
            **trainer_overrides,
        }
    )
    started = time.perf_counter()
    parent_dir = adapter_version_fetch(parent, into=run_dir / "parent") if parent else None
    result = train_ppo(
        config,
        window.train,
        base_model_dir=base.path,
        parent_adapter_dir=parent_dir,
        out_dir=run_dir / "adapter",
        progress=False,
        on_step=guard.check,
    )
    seconds["train"] = time.perf_counter() - started
    guard.check()
    _advance(run, TrainingRun.Status.EVALUATING, trainer_summary=result.summary, stage_seconds=seconds)

    started = time.perf_counter()
    eval_set = eval_set_get(run.adapter)
    # The candidate is judged as it will be served: with its show filter, against production with
    # production's own gate.
    verdict = evaluate_candidate(
        base_model_dir=base.path,
        parent_adapter_dir=parent_dir,
        candidate_adapter_dir=result.out_dir,
        heldout=window.heldout,
        fim_eval=eval_set.cases if eval_set else None,
        config=gate_config,
        max_rank=settings.VLLM_MAX_LORA_RANK,
        kl_prompts=[list(sample.prompt_token_ids) for sample in window.train[:32]],
        candidate_show_threshold=threshold_of(show_gate),
        parent_show_threshold=threshold_of(parent.show_gate if parent else None),
        silence_reward=policy.reward_not_shown,
        window_show_events=window.show_events,
    )
    seconds["gate"] = time.perf_counter() - started
    if eval_set is not None and verdict.fim_count:
        # What the version's offline evaluation names: the set as it was when this run read it.
        verdict.fim_eval_set = {"cases": len(eval_set.cases), "uploaded_at": eval_set.uploaded_at.isoformat()}
    if not verdict.passed:
        return _reject(run, verdict, stage_seconds=seconds)
    gate = verdict.as_dict()

    guard.check()
    started = time.perf_counter()
    probe = adapter_serve_probe(base, result.out_dir)  # synthetic: no user's text in a version
    seconds["probe"] = time.perf_counter() - started
    started = time.perf_counter()
    with atomic_undoing_uploads():
        # The run's row is locked while its version registers: an erase marking this run waits for
        # the commit and then names the version; one that marked it first is seen here. Should this
        # transaction not commit (the run taken back, a time limit), the upload is removed again.
        locked = TrainingRun.objects.select_for_update().filter(pk=run.pk, attempt=run.attempt, status=run.status)
        if locked.first() is None:
            raise RunTakenBack(f"run {run.pk} attempt {run.attempt} was taken back")
        if training_run_erased(run):
            raise RunDiscarded(DISCARD_REASON)
        _parent_still_good(parent)
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
        _advance(run, run.status, output_version=version)
    seconds["upload"] = time.perf_counter() - started  # registering writes the version to the adapter store
    started = time.perf_counter()
    _load_now_or_later(run, version)  # the version stands: no load failure fails the run from here
    seconds["load"] = time.perf_counter() - started
    _advance(run, TrainingRun.Status.CANDIDATE, output_version=version, gate=gate, stage_seconds=seconds)
    return "candidate"  # the worker then starts its A/B test if the policy asks (experiment_auto_start)


def _parent_still_good(parent: AdapterVersion | None) -> None:
    """Raise RunParentRetired when ``parent`` is no longer fit to build on. The adapter's row is
    locked first (registering locks it next anyway), as a rollback or an experiment's end locks it
    before retiring a version: that one waits for this registration, or is seen by it, and the two
    never deadlock."""
    if parent is None:
        return
    Adapter.objects.select_for_update(no_key=True).filter(pk=parent.adapter_id).first()
    status = AdapterVersion.objects.filter(pk=parent.pk).values_list("status", flat=True).first()
    if status not in GOOD_VERSION_STATUSES:
        raise RunParentRetired(
            f"discarded: version {parent.number}, which it trained from, became {status or 'deleted'} while it ran "
            "(nothing it learned was kept); a new run from the adapter's current head was scheduled"
        )


def _log_left_out(run: TrainingRun, window: Window) -> None:
    """Name in the run's log the events of its window no sample could be built from (the first few)."""
    if not window.left_out:
        return
    count = len(window.left_out)
    shown = "; ".join(window.left_out[:LEFT_OUT_LOGGED])
    more = f" and {count - LEFT_OUT_LOGGED} more" if count > LEFT_OUT_LOGGED else ""
    training_run_advance_log(run, f"left out {count} event(s) no sample can be built from: {shown}{more}")
    run.refresh_from_db(fields=["log"])  # later stages write the log from what they read of it


def _reject(run: TrainingRun, verdict: Any, **fields: Any) -> str:
    """End the run rejected by the gate's ``verdict`` (a GateVerdict), its reasons in the log."""
    _advance(
        run,
        TrainingRun.Status.REJECTED,
        gate=verdict.as_dict(),
        log=run.log + "gate: " + "; ".join(verdict.reasons) + "\n",
        **fields,
    )
    return "rejected"


def _fit_show_filter(window: Window, policy: TrainingPolicy) -> dict[str, Any] | None:
    """The candidate's show filter, fitted on the window's shown completions (learning_shared.show_filter);
    None when the policy turns it off or too few suggestions were accepted to place it."""
    if not policy.show_gate:
        return None
    fitted = fit_show_threshold(window.show_events, recall=policy.show_gate_recall)
    if fitted is None:
        return None
    return {**fitted, "recall": policy.show_gate_recall, "explore": policy.show_gate_explore}


def silence_gated(show_gate: dict[str, Any] | None) -> bool:
    """Whether the trainer leaves staying silent on completions to the show filter: only when the
    run has one. A window with too few accepted suggestions for a filter (developers who accept
    little, as the demo's block tenant's) would otherwise be taught silence by neither the filter
    nor the counterfactual (docs/learning.md, "Multi-line developers")."""
    return threshold_of(show_gate) is not None


def _autocast() -> bool:
    """TRAINER_AUTOCAST_BF16 for this worker's device (``auto``: where bf16 is native)."""
    import torch

    from gpu_trainer.precision import autocast_setting

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return autocast_setting(settings.TRAINER_AUTOCAST_BF16, device)


def _limit_cpu_threads() -> None:
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, settings.TRAINER_CPU_THREADS))


def _load_now_or_later(run: TrainingRun, version: AdapterVersion) -> None:
    """Load the registered version in vLLM right away (freshness). It is registered and the head of
    its lineage whatever vLLM answers, so no answer fails the run: vLLM down, or an error of the load
    itself (a name loaded from another path, a replica that accepts the adapter but does not list it),
    leaves the load to the serving queue, which tries it again, and to serving, which loads a version
    on first use. (An adapter vLLM refuses is marked failed by the load itself.)"""
    try:
        adapter_version_load(version_id=version.pk)
    except VLLMUnavailable:
        pass
    except VLLMError as exc:
        logger.warning("training run %s: loading version %s in vLLM failed; left to the serving queue",
                       run.pk, version.vllm_name, exc_info=True)
        training_run_advance_log(
            run, f"loading version {version.number} in vLLM failed ({exc.message}); the serving queue tries again, "
            "and serving loads it on first use"
        )
    else:
        return
    enqueue("workers.serving.adapter_version_load", version.pk)
