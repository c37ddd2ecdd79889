"""The experiments app's services, one module per sub-domain, named here for their callers:
``lifecycle`` (create, start, stop, promote, roll back),
``exposures`` (who met which arm), ``snapshots`` (statistics and automatic decisions),
``production`` (moving production by hand) and ``lineage`` (the holdout's lift and the
alarms after a promotion)."""

from apps.experiments.services.exposures import exposure_record
from apps.experiments.services.lifecycle import (
    STARTABLE_CANDIDATE_STATUSES,
    experiment_create,
    experiment_promote,
    experiment_rollback,
    experiment_start,
    experiment_stop,
)
from apps.experiments.services.lineage import (
    adapter_holdout_set,
    holdout_snapshot_take,
    lineage_checks_all,
    promotion_alarm_check,
)
from apps.experiments.services.production import adapter_promote, adapter_rollback
from apps.experiments.services.snapshots import (
    experiment_snapshot_all,
    experiment_snapshot_now,
    experiment_snapshot_take,
)

__all__ = [
    "adapter_holdout_set",
    "adapter_promote",
    "STARTABLE_CANDIDATE_STATUSES",
    "adapter_rollback",
    "experiment_create",
    "experiment_promote",
    "experiment_rollback",
    "experiment_snapshot_all",
    "experiment_snapshot_now",
    "experiment_snapshot_take",
    "experiment_start",
    "experiment_stop",
    "exposure_record",
    "holdout_snapshot_take",
    "lineage_checks_all",
    "promotion_alarm_check",
]
