"""New labelled events may be enough for a training run: ask the training scheduler, by its
task's name, to check the tenant shortly. The interactions app calls this once feedback
committed; a burst of feedback asks for one check (``apps.common.debounce``), which the scheduling
task clears when it starts, and beat's ``training_schedule_all`` (every 15 s) covers a lost one.
"""

from __future__ import annotations

from apps.common.debounce import debounced_enqueue

SCHEDULE_TASK = "workers.training.training_schedule_tenant"


def training_check_soon(tenant_id: int) -> None:
    """New labelled events may be enough for a run: check the tenant's adapters shortly."""
    debounced_enqueue(SCHEDULE_TASK, tenant_id)
