from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_init
from django.conf import settings

logger = logging.getLogger(__name__)

# Celery's own limits back the run's wall-time limit (apps.training.pipeline stops a run past
# TRAINING_MAX_RUN_S at its next step): the soft one raises in the task a stale-after later, the
# hard one kills the pool process after another. Only a prefork pool enforces them, so the gpu
# worker runs ``--pool prefork --concurrency 1``; the reaper then ends the run failed.
RUN_SOFT_LIMIT_S = settings.TRAINING_MAX_RUN_S + settings.TRAINING_STALE_AFTER_S
RUN_HARD_LIMIT_S = settings.TRAINING_MAX_RUN_S + 2 * settings.TRAINING_STALE_AFTER_S


@shared_task(
    name="workers.training.training_run_execute",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=RUN_SOFT_LIMIT_S,
    time_limit=RUN_HARD_LIMIT_S,
)
def training_run_execute(run_id: int, attempt: int) -> str:
    """Train one run (gpu queue). Idempotent: only the attempt's first delivery claims the run.
    A run that registered a candidate then starts its A/B test if the adapter's policy asks."""
    from apps.training.pipeline import training_run_execute as execute

    outcome = execute(run_id, attempt=attempt)
    if outcome == "candidate":
        experiment_auto_start(run_id)
    return outcome


@shared_task(name="workers.training.training_schedule_tenant", acks_late=True, expires=60)
def training_schedule_tenant(tenant_id: int) -> int:
    """Asked for by feedback (``apps.interactions.training_check``), debounced: the debounce is
    cleared before counting, so an event that commits from here on asks for a check of its own."""
    from apps.common.debounce import debounce_clear
    from apps.training.services import training_schedule_tenant as schedule

    debounce_clear("workers.training.training_schedule_tenant", tenant_id)
    return len(schedule(tenant_id))


@shared_task(name="workers.training.training_schedule_all", acks_late=True, expires=60)
def training_schedule_all() -> int:
    from apps.training.services import training_schedule_all as schedule

    return len(schedule())


@shared_task(name="workers.training.training_reap_stale", acks_late=True, expires=60)
def training_reap_stale() -> int:
    from apps.training.services import training_reap_stale as reap

    return len(reap())


@shared_task(name="workers.training.training_sweep_queued", acks_late=True, expires=120)
def training_sweep_queued() -> int:
    from apps.training.services import training_sweep_queued as sweep

    return len(sweep())


@worker_init.connect
def preload_trainer(sender: object = None, **_: object) -> None:
    """A gpu worker (queue ``gpu`` or a training pool's ``gpu-<pool>``) imports torch, transformers
    and peft once at start, before its pool process forks, not in its first run's clock; and removes
    the folders of ended runs a killed worker left on this host (``run_dirs_sweep``)."""
    selected = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
    queues = set(getattr(selected, "consume_from", None) or {})
    if any(queue == "gpu" or queue.startswith("gpu-") for queue in queues):
        from django.db import connections

        import gpu_trainer.gate  # noqa: F401
        import gpu_trainer.ppo  # noqa: F401

        # Folders of ended runs a killed worker left on this host go now, not at its next run.
        from apps.training.pipeline import run_dirs_sweep

        try:
            run_dirs_sweep()
        except Exception:  # the database may not answer yet: the next run's start sweeps again
            logger.exception("the sweep of run folders at the gpu worker's start failed")
        finally:
            connections.close_all()  # before the pool forks: no child inherits this connection


def experiment_auto_start(run_id: int) -> None:
    """After a run registered its candidate: the policy may ask for every candidate to meet users
    in an A/B test at once (unless one already runs on the adapter). A refusal is written on the
    run; the candidate stays, for a person to test. Training and experiments are siblings that do
    not import each other; this worker is where the two meet."""
    from apps.common.exceptions import ApplicationError
    from apps.experiments.selectors import experiment_running_for
    from apps.experiments.services import experiment_create, experiment_start
    from apps.training.models import TrainingRun
    from apps.training.selectors import training_policy_get
    from apps.training.services import training_run_advance_log

    run = TrainingRun.objects.select_related("tenant", "adapter", "output_version").get(pk=run_id)
    version = run.output_version
    if version is None or not training_policy_get(run.adapter).auto_experiment:
        return
    if experiment_running_for(run.adapter) is not None:
        logger.info("run %s: candidate %s waits, an experiment is already running", run.pk, version.vllm_name)
        return
    actor = f"training-run:{run.pk}"
    try:
        experiment = experiment_create(run.tenant, adapter=run.adapter, candidate_version=version, actor=actor)
        experiment_start(run.tenant, experiment=experiment, actor=actor)
    except ApplicationError as exc:
        training_run_advance_log(run, f"experiment not started: {exc.message}")
