from __future__ import annotations

from django.db import models

from apps.tenants.models import Tenant


class ServingFailure(models.Model):
    """A completion Strop could not serve because vLLM failed (down, too slow, broke mid-stream).

    Kept apart from interactions: a failed request served nothing to learn from, and an
    interaction is only ever a whole served completion. Experiments read these as the error-rate
    guardrail of the arm that was asked."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey("adapters.Adapter", on_delete=models.CASCADE, related_name="+")
    adapter_version = models.ForeignKey(
        "adapters.AdapterVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    experiment = models.ForeignKey(
        "experiments.Experiment", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    experiment_arm = models.CharField(max_length=64, blank=True)
    end_user_id = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=32, help_text="the error code: vllm_unavailable, vllm_error, ...")
    message = models.TextField(blank=True)
    streamed = models.BooleanField(default=False, help_text="the failure came after the stream had started")
    occurred_at = models.DateTimeField()
    latency_ms = models.FloatField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "occurred_at"]), models.Index(fields=["experiment", "end_user_id"])]
