"""The training app's services, one module per job, named here for their callers: ``policies``
(the policy a tenant admin edits, the FIM eval set), ``scheduling`` (when a run starts, one per
tenant at a time on its GPU queue, the sweep of lost messages) and ``runs`` (the life of a run:
claim, advance, heartbeat, the reaper, discarding a run that learned from an erased user, leaving
a rejected run's events out of training)."""

from apps.training.services.policies import POLICY_FIELDS, eval_set_upload, training_policy_update
from apps.training.services.runs import (
    RERUN_FROM_HEAD_TRIGGER,
    RERUN_TRIGGER,
    training_reap_stale,
    training_run_advance,
    training_run_advance_log,
    training_run_claim,
    training_run_discard,
    training_run_heartbeat,
    training_window_exclude,
    wall_time_reason,
)
from apps.training.services.scheduling import (
    gpu_queue,
    training_run_start,
    training_schedule,
    training_schedule_all,
    training_schedule_tenant,
    training_sweep_queued,
)

__all__ = [
    "POLICY_FIELDS",
    "RERUN_FROM_HEAD_TRIGGER",
    "RERUN_TRIGGER",
    "eval_set_upload",
    "gpu_queue",
    "training_policy_update",
    "training_reap_stale",
    "training_run_advance",
    "training_run_advance_log",
    "training_run_claim",
    "training_run_discard",
    "training_run_heartbeat",
    "training_run_start",
    "training_schedule",
    "training_schedule_all",
    "training_schedule_tenant",
    "training_sweep_queued",
    "training_window_exclude",
    "wall_time_reason",
]
