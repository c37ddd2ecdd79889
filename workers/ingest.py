from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.ingest.feedback_attach_pending_all", acks_late=True, expires=120)
def feedback_attach_pending_all() -> int:
    """Attach feedback and persistence reports that arrived before their interaction (idempotent:
    attached rows are skipped)."""
    from apps.interactions.services import feedback_attach_pending_all as attach
    from apps.interactions.services import persistence_attach_pending_all

    return attach() + persistence_attach_pending_all()
