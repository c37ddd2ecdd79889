"""The interactions app's services, one module per sub-domain, named here for their callers:
``ingest`` (interactions), ``feedback`` (feedback and session outcomes), ``pending`` (feedback
that came first), ``persistence`` (what is left of an accepted completion at a checkpoint) and
``batches`` (what every batch shares).

A batch is validated item by item; every item gets its own verdict (created / duplicate /
rejected, or recorded / pending / rejected for feedback); the items that pass are written in
one transaction."""

from apps.interactions.services.batches import ItemResult, batch_check_size
from apps.interactions.services.feedback import feedback_ingest
from apps.interactions.services.ingest import interactions_ingest
from apps.interactions.services.pending import feedback_attach_pending, feedback_attach_pending_all
from apps.interactions.services.persistence import (
    persistence_attach_pending,
    persistence_attach_pending_all,
    persistence_ingest,
)

__all__ = [
    "ItemResult",
    "batch_check_size",
    "feedback_attach_pending",
    "feedback_attach_pending_all",
    "feedback_ingest",
    "interactions_ingest",
    "persistence_attach_pending",
    "persistence_attach_pending_all",
    "persistence_ingest",
]
