from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.ingest.feedback_attach_pending_all", acks_late=True, expires=120)
def feedback_attach_pending_all() -> int:
    """Attach feedback that arrived before its interaction (idempotent: attached rows are skipped)."""
    from apps.interactions.services import feedback_attach_pending_all as attach

    return attach()


@shared_task(name="workers.ingest.rollups_refresh_all", acks_late=True, expires=30)
def rollups_refresh_all() -> int:
    """Recompute the hours whose interactions or feedback changed (idempotent: marks are consumed)."""
    from apps.interactions.rollups import rollups_refresh_all as refresh

    return refresh()
