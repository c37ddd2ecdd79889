from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.experiments.experiment_snapshot_all", acks_late=True, expires=120)
def experiment_snapshot_all() -> int:
    """Beat: the statistics of every running experiment (idempotent: each call adds one snapshot)."""
    from apps.experiments.services import experiment_snapshot_all as snapshot_all

    return len(snapshot_all())


@shared_task(name="workers.experiments.experiment_snapshot_take", acks_late=True, expires=300)
def experiment_snapshot_take(experiment_id: int) -> bool:
    from apps.experiments.services import experiment_snapshot_take as take

    return take(experiment_id) is not None
