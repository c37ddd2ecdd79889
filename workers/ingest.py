from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.ingest.feedback_attach_pending_all", acks_late=True, expires=120)
def feedback_attach_pending_all() -> int:
    """Attach feedback and persistence reports that arrived before their interaction (idempotent:
    attached rows are skipped)."""
    from apps.interactions.services import feedback_attach_pending_all as attach
    from apps.interactions.services import persistence_attach_pending_all

    return attach() + persistence_attach_pending_all()


@shared_task(name="workers.ingest.stream_parts_sweep", acks_late=True, expires=60)
def stream_parts_sweep() -> int:
    """Record the streams whose worker died as partial interactions (idempotent: a stream recorded
    has no parts left)."""
    from apps.interactions.stream_parts import stream_parts_sweep as sweep

    return sweep()


@shared_task(name="workers.ingest.rollups_refresh_all", acks_late=True, expires=30)
def rollups_refresh_all() -> int:
    """Recompute the hours whose interactions or feedback changed (idempotent: marks are consumed)."""
    from apps.interactions.rollups import rollups_refresh_all as refresh

    return refresh()


@shared_task(name="workers.ingest.retention_prune_all", acks_late=True, expires=3600)
def retention_prune_all() -> int:
    """Delete what every tenant's retention says is too old (idempotent: a rerun finds less)."""
    from apps.privacy.retention import retention_prune_all as prune

    return sum(sum(report.deleted.values()) for report in prune().values())
