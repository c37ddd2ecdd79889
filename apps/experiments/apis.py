"""Experiments over the API (key scope ``admin``), and the assignment a tenant that serves
elsewhere asks for (key scope ``serve`` or ``ingest``: it records consent)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.apis import AdapterOut
from apps.adapters.selectors import adapter_get_for_tenant, adapter_version_get_for_tenant
from apps.common.apis import ScopedApi
from apps.common.parsing import StrictSerializer
from apps.experiments.models import Experiment, ExperimentSnapshot, HoldoutSnapshot, PromotionAlarm, PromotionWatch
from apps.experiments.selectors import (
    alarms_recent,
    experiment_get_for_tenant,
    experiment_latest_snapshot,
    experiment_list,
    experiment_snapshots,
    holdout_latest_snapshot,
    promotion_watch_current,
)
from apps.experiments.services import (
    adapter_holdout_set,
    adapter_promote,
    adapter_rollback,
    experiment_create,
    experiment_promote,
    experiment_rollback,
    experiment_snapshot_now,
    experiment_start,
    experiment_stop,
)
from apps.experiments.stats import METRICS


class ExperimentOut(serializers.ModelSerializer):
    adapter = serializers.CharField(source="adapter.name")
    control_version = serializers.IntegerField(source="control_version.number", allow_null=True, default=None)
    candidate_version = serializers.IntegerField(source="candidate_version.number")
    latest = serializers.SerializerMethodField(help_text="the latest statistics snapshot (null before the first)")

    class Meta:
        model = Experiment
        fields = [
            "id",
            "adapter",
            "status",
            "control_version",
            "candidate_version",
            "candidate_weight",
            "config",
            "auto_promote",
            "auto_rollback",
            "decision",
            "decision_reason",
            "created_by",
            "created_at",
            "started_at",
            "ended_at",
            "ended_by",
            "latest",
        ]

    def get_latest(self, obj: Experiment) -> dict[str, Any] | None:
        if not self.context.get("with_latest"):
            return None
        snapshot = experiment_latest_snapshot(obj)
        return SnapshotOut(snapshot).data if snapshot is not None else None


class SnapshotOut(serializers.ModelSerializer):
    class Meta:
        model = ExperimentSnapshot
        fields = ["computed_at", "users", "action", "analysis", "seconds"]


class ExperimentCreateIn(StrictSerializer):
    candidate_version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)
    candidate_weight = serializers.FloatField(required=False, default=0.5, min_value=0.01, max_value=0.99)
    primary_metric = serializers.ChoiceField(choices=sorted(METRICS), required=False)
    guardrails = serializers.ListField(child=serializers.ChoiceField(choices=sorted(METRICS)), required=False)
    secondary_metrics = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(METRICS)),
        required=False,
        help_text="reported beside the primary, deciding nothing (default: accept_rate, accepted_per_request)",
    )
    min_users_per_arm = serializers.IntegerField(required=False, min_value=2, max_value=10**7)
    min_effective_users_per_arm = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=10**7,
        help_text="effective users (weighted by each metric's denominator, Kish) an arm needs before a metric "
        "is tested at all (default 20; docs/experiments.md)",
    )
    max_duration_s = serializers.IntegerField(required=False, min_value=60, max_value=366 * 24 * 3600)
    alpha = serializers.FloatField(required=False, min_value=0.001, max_value=0.2)
    expected_users = serializers.IntegerField(
        required=False,
        min_value=2,
        max_value=10**9,
        help_text="users (both arms together) the experiment expects to reach; the always-valid interval is "
        "tightest there (stored as config.n_star, default 5000). A cohort far smaller than the default "
        "should say so, or the interval stays too wide to decide.",
    )
    start = serializers.BooleanField(required=False, default=False, help_text="start it at once")


class ExperimentCollectionApi(ScopedApi):
    """An adapter's experiments (newest first), and creating one from a gated candidate."""

    required_scope = "admin"

    @extend_schema(responses={200: ExperimentOut(many=True)})
    def get(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        return Response(ExperimentOut(experiment_list(self.tenant, adapter=adapter)[:100], many=True).data)

    @extend_schema(request=ExperimentCreateIn, responses={201: ExperimentOut})
    def post(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        data = ExperimentCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        attrs = data.validated_data
        candidate = adapter_version_get_for_tenant(self.tenant, adapter=adapter, number=attrs["candidate_version"])
        config = {
            k: attrs[k]
            for k in (
                "primary_metric",
                "guardrails",
                "secondary_metrics",
                "min_users_per_arm",
                "min_effective_users_per_arm",
                "max_duration_s",
                "alpha",
            )
            if k in attrs
        }
        if "expected_users" in attrs:
            config["n_star"] = float(attrs["expected_users"])
        experiment = experiment_create(
            self.tenant,
            adapter=adapter,
            candidate_version=candidate,
            actor=self.actor,
            candidate_weight=attrs["candidate_weight"],
            config=config,
            to_start=attrs["start"],
        )
        if attrs["start"]:
            experiment = experiment_start(self.tenant, experiment=experiment, actor=self.actor)
        return Response(ExperimentOut(experiment, context={"with_latest": True}).data, status=201)


class ExperimentDetailApi(ScopedApi):
    """One experiment with its latest statistics."""

    required_scope = "admin"

    @extend_schema(responses={200: ExperimentOut})
    def get(self, request: Request, experiment_id: str) -> Response:
        experiment = experiment_get_for_tenant(self.tenant, experiment_id=experiment_id)
        return Response(ExperimentOut(experiment, context={"with_latest": True}).data)


class ExperimentSnapshotListApi(ScopedApi):
    """Every statistics snapshot, oldest first: the experiment over time."""

    required_scope = "admin"

    @extend_schema(responses={200: SnapshotOut(many=True)})
    def get(self, request: Request, experiment_id: str) -> Response:
        experiment = experiment_get_for_tenant(self.tenant, experiment_id=experiment_id)
        return Response(SnapshotOut(experiment_snapshots(experiment)[:2000], many=True).data)


class ActionIn(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class _ExperimentActionApi(ScopedApi):
    """What every action on one experiment shares: the experiment (404 for another tenant's), the
    optional ``reason``, and the experiment with its latest statistics as the answer. Each
    subclass is one action and calls one service (``act``)."""

    required_scope = "admin"

    def act(self, experiment: Experiment, reason: str) -> Experiment:
        raise NotImplementedError

    @extend_schema(request=ActionIn, responses={200: ExperimentOut})
    def post(self, request: Request, experiment_id: str) -> Response:
        experiment = experiment_get_for_tenant(self.tenant, experiment_id=experiment_id)
        data = ActionIn(data=request.data if request.data else {})
        data.is_valid(raise_exception=True)
        experiment = self.act(experiment, data.validated_data["reason"])
        return Response(ExperimentOut(experiment, context={"with_latest": True}).data)


class ExperimentStartApi(_ExperimentActionApi):
    """Start a draft: the candidate is loaded on every replica and serve-probed first."""

    def act(self, experiment: Experiment, reason: str) -> Experiment:
        return experiment_start(self.tenant, experiment=experiment, actor=self.actor)


class ExperimentStopApi(_ExperimentActionApi):
    """End a running experiment without a verdict: everyone gets production again."""

    def act(self, experiment: Experiment, reason: str) -> Experiment:
        return experiment_stop(self.tenant, experiment=experiment, actor=self.actor, reason=reason)


class ExperimentPromoteApi(_ExperimentActionApi):
    """Make the candidate production."""

    def act(self, experiment: Experiment, reason: str) -> Experiment:
        return experiment_promote(self.tenant, experiment=experiment, actor=self.actor, reason=reason)


class ExperimentRollbackApi(_ExperimentActionApi):
    """Reject the candidate: production stays as it was, the candidate is retired."""

    def act(self, experiment: Experiment, reason: str) -> Experiment:
        return experiment_rollback(self.tenant, experiment=experiment, actor=self.actor, reason=reason)


class ExperimentSnapshotApi(_ExperimentActionApi):
    """Compute the statistics of a running experiment now (and act on them as the tenant chose)."""

    def act(self, experiment: Experiment, reason: str) -> Experiment:
        return experiment_snapshot_now(self.tenant, experiment=experiment)


class AdapterRollbackIn(StrictSerializer):
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)


class AdapterVersionPromoteApi(ScopedApi):
    """Move the production pointer to this version (it must be loaded in vLLM); audited. The adapter's
    running experiment is decided (its candidate promoted) or stopped first (``adapter_promote``)."""

    required_scope = "admin"

    @extend_schema(
        request=None,
        responses={200: AdapterOut},
        description="A version vLLM does not hold yet is loaded first (503 when vLLM is down); a failed one is 409. "
        "A running experiment on the adapter ends first: decided when this is its candidate, else stopped.",
    )
    def post(self, request: Request, adapter_name: str, number: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        version = adapter_version_get_for_tenant(self.tenant, adapter=adapter, number=number)
        return Response(AdapterOut(adapter_promote(self.tenant, version=version, actor=self.actor)).data)


class AdapterRollbackApi(ScopedApi):
    """Move production back to an earlier good version (a running experiment is stopped first)."""

    required_scope = "admin"

    @extend_schema(request=AdapterRollbackIn, responses={200: AdapterOut})
    def post(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        data = AdapterRollbackIn(data=request.data)
        data.is_valid(raise_exception=True)
        version = adapter_version_get_for_tenant(self.tenant, adapter=adapter, number=data.validated_data["version"])
        return Response(
            AdapterOut(adapter_rollback(self.tenant, adapter=adapter, to_version=version, actor=self.actor)).data
        )


class HoldoutIn(StrictSerializer):
    share = serializers.FloatField(
        min_value=0.0, max_value=0.5, help_text="share of the opted-in users kept on the base model (0: none)"
    )


class HoldoutSnapshotOut(serializers.ModelSerializer):
    class Meta:
        model = HoldoutSnapshot
        fields = ["computed_at", "users", "analysis"]


class PromotionAlarmOut(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number")

    class Meta:
        model = PromotionAlarm
        fields = [
            "version",
            "metric",
            "reference",
            "observed",
            "reference_value",
            "relative_change",
            "reason",
            "rolled_back",
            "created_at",
        ]


class PromotionWatchOut(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number")

    class Meta:
        model = PromotionWatch
        fields = ["version", "promoted_at", "reference", "checked_at", "metrics"]


class HoldoutOut(serializers.Serializer):
    adapter = serializers.CharField()
    share = serializers.FloatField()
    latest = HoldoutSnapshotOut(allow_null=True, help_text="the lineage against the holdout (control = holdout)")
    alarms = PromotionAlarmOut(many=True, help_text="alarms on promoted versions, last 7 days")
    watch = PromotionWatchOut(
        allow_null=True,
        help_text="the latest alarm check of the production version while its promotion (last 7 days) is watched: "
        "per metric a status (alarm, no_alarm, too_few_users, too_few_effective_users, not_testable) and its reason",
    )


class AdapterHoldoutApi(ScopedApi):
    """The adapter's holdout (users kept on the base model across promotions), the lineage's
    cumulative lift against it, and the alarms raised after promotions."""

    required_scope = "admin"

    def _out(self, adapter: Any) -> Response:
        return Response(
            HoldoutOut(
                {
                    "adapter": adapter.name,
                    "share": adapter.holdout_share,
                    "latest": holdout_latest_snapshot(adapter),
                    "alarms": list(alarms_recent(self.tenant, adapter=adapter)[:50]),
                    "watch": promotion_watch_current(adapter),
                }
            ).data
        )

    @extend_schema(responses={200: HoldoutOut})
    def get(self, request: Request, adapter_name: str) -> Response:
        return self._out(adapter_get_for_tenant(self.tenant, name=adapter_name))

    @extend_schema(request=HoldoutIn, responses={200: HoldoutOut})
    def put(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        data = HoldoutIn(data=request.data)
        data.is_valid(raise_exception=True)
        adapter = adapter_holdout_set(
            self.tenant, adapter=adapter, share=data.validated_data["share"], actor=self.actor
        )
        return self._out(adapter)
