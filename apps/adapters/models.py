from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.tenants.models import Tenant


class BaseModel(models.Model):
    """A base LM that vLLM serves and adapters are trained on. Platform-owned, shared by tenants."""

    class Family(models.TextChoices):
        QWEN = "qwen", "Qwen2.5-Coder / Strop starter"
        STARCODER = "starcoder"
        CODELLAMA = "codellama"
        DEEPSEEK = "deepseek"
        PLAIN = "plain", "No FIM tokens: completes from the prefix alone"

    name = models.SlugField(max_length=100, unique=True, help_text="the name vLLM serves the base model under")
    path = models.CharField(max_length=500, help_text="local Hugging Face model directory")
    family = models.CharField(max_length=16, choices=Family.choices, help_text="decides the FIM prompt format")
    source = models.TextField(
        blank=True, default="", help_text="where the directory came from (its strop_base.json, else its path)"
    )
    fingerprint = models.CharField(
        max_length=64, blank=True, default="", help_text="gpu_trainer's fingerprint of its config and weights"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Adapter(models.Model):
    """A tenant's LoRA adapter on one base model; its versions form a lineage."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="adapters")
    name = models.SlugField(max_length=64, help_text="what tenants put in `model`; unique per tenant")
    base_model = models.ForeignKey(BaseModel, on_delete=models.PROTECT, related_name="adapters")
    is_default = models.BooleanField(default=False, help_text="serves requests that name no model")
    max_completion_tokens = models.PositiveIntegerField(
        default=256,
        help_text="the most tokens one completion may generate; a request asking for more (editor plugins "
        "send 4096) is served this many instead of being refused",
    )
    production_version = models.ForeignKey(
        "AdapterVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the production pointer; empty = the base model alone",
    )
    holdout_share = models.FloatField(
        default=0.0,
        help_text="share of the opted-in users kept on the base model across every promotion (0: no holdout); "
        "assignment: apps.experiments.assignment.in_holdout",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(holdout_share__gte=0) & Q(holdout_share__lte=0.5), name="adapter_holdout_share_0_to_half"
            ),
            models.UniqueConstraint(fields=["tenant", "name"], name="adapter_unique_name_per_tenant"),
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(is_default=True), name="adapter_one_default_per_tenant"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"


class AdapterVersion(models.Model):
    """One trained set of LoRA weights, in a directory of its own that is never overwritten."""

    class Status(models.TextChoices):
        TRAINING = "training"
        CANDIDATE = "candidate"
        IN_EXPERIMENT = "in_experiment"
        PRODUCTION = "production"
        RETIRED = "retired"
        FAILED = "failed"
        # Its weights are deleted from the adapter store (every object version): it trained on an
        # erased end user and was replaced. The row stays, for the lineage and the audit.
        PURGED = "purged"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    artifact_path = models.CharField(
        max_length=500,
        unique=True,
        help_text="where the adapter store keeps it: a folder on the embedded default, s3://bucket/prefix/<vllm name>",
    )
    digest = models.CharField(
        max_length=71, blank=True, default="", help_text="sha256: of its manifest; a fetch checks the files against it"
    )
    vllm_name = models.CharField(max_length=200, unique=True, help_text="tenant--adapter--vN-<random>; never reused")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.TRAINING)
    status_message = models.TextField(blank=True, help_text="why it failed, in vLLM's or the trainer's words")
    lora_rank = models.PositiveIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True)
    show_gate = models.JSONField(
        null=True,
        blank=True,
        help_text='{"threshold", "explore", ...}: completions scoring below the threshold are withheld (serving)',
    )
    training_steps = models.JSONField(
        default=list, blank=True, help_text="the trainer's per-step metrics (metrics.jsonl), for the run's curves"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    loaded_at = models.DateTimeField(null=True, blank=True, help_text="when every replica confirmed it")
    purged_at = models.DateTimeField(
        null=True, blank=True, help_text="when its weights were deleted from the adapter store (status purged)"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["adapter", "number"], name="adapter_version_unique_number"),
        ]

    def __str__(self) -> str:
        return self.vllm_name
