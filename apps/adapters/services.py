"""The adapter registry: base models, tenant adapters, versions, and the production pointer."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.common.exceptions import Conflict, ValidationFailed
from apps.common.tasks import enqueue_on_commit
from apps.notifications.services import notification_send
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record


def base_model_register(*, name: str, path: str | Path, family: str | None = None) -> BaseModel:
    """Register (or update) a base model: its directory, FIM family, source and fingerprint.

    The source comes from the directory's ``strop_base.json`` when it has one (written by
    ``python -m gpu_trainer base``), else it is the path; the fingerprint is computed from the
    weights either way, and a record that no longer matches them is refused.
    """
    from gpu_trainer.base_models import describe_base_model
    from gpu_trainer.errors import TrainerInputError
    from gpu_trainer.fim import FIM_FORMATS

    model_dir = Path(path).resolve()
    if family is not None and family not in FIM_FORMATS:
        raise ValidationFailed(f"family: {family!r} is not one of {', '.join(FIM_FORMATS)}")
    try:
        described = describe_base_model(model_dir)
    except TrainerInputError as exc:
        raise ValidationFailed(f"path: {exc}") from None
    base, _ = BaseModel.objects.update_or_create(
        name=name,
        defaults={
            "path": str(model_dir),
            "family": family or described["family"],
            "source": described["source"],
            "fingerprint": described["fingerprint"],
        },
    )
    return base


def adapter_create(
    tenant: Tenant, *, name: str, base_model: BaseModel, is_default: bool = False, actor: str = "system"
) -> Adapter:
    try:
        with transaction.atomic():
            if is_default:
                Adapter.objects.filter(tenant=tenant, is_default=True).update(is_default=False)
            adapter = Adapter.objects.create(tenant=tenant, name=name, base_model=base_model, is_default=is_default)
            audit_record(
                tenant,
                actor=actor,
                action="adapter.create",
                target_type="adapter",
                target_id=name,
                data={"base_model": base_model.name, "is_default": is_default},
            )
    except IntegrityError:
        raise Conflict(f"adapter {name!r} already exists", code="adapter_exists") from None
    return adapter


def _version_slug(number: int) -> str:
    # The random part keeps the vLLM name and the directory unique even when a registration is
    # retried or a tenant is recreated under an old slug: vLLM caches by (name, path), so
    # neither may ever be reused for other weights.
    return f"v{number}-{uuid.uuid4().hex[:8]}"


def adapter_version_register(
    tenant: Tenant,
    *,
    adapter: Adapter,
    source_dir: str | Path,
    parent: AdapterVersion | None = None,
    metrics: dict[str, Any] | None = None,
    show_gate: dict[str, Any] | None = None,
    status: str = AdapterVersion.Status.CANDIDATE,
    actor: str = "system",
    enqueue_load: bool = True,
) -> AdapterVersion:
    """Copy a verified PEFT adapter into a new version directory and register it.

    The copy lands under a temporary name and is renamed into place, so a crash never leaves a
    half-written version directory that a row points to. Loading into vLLM happens after commit.
    """
    from gpu_trainer.adapters import verify_adapter
    from gpu_trainer.errors import AdapterInvalidError

    if adapter.tenant_id != tenant.pk or (parent is not None and parent.adapter_id != adapter.pk):
        raise ValueError("adapter or parent belongs elsewhere")
    source = Path(source_dir)
    try:
        config = verify_adapter(source, max_rank=settings.VLLM_MAX_LORA_RANK)
    except AdapterInvalidError as exc:
        raise ValidationFailed(str(exc), code="adapter_invalid") from None
    with transaction.atomic():
        Adapter.objects.select_for_update(no_key=True).filter(pk=adapter.pk).first()  # serialises version numbers
        number = (AdapterVersion.objects.filter(adapter=adapter).aggregate(n=Max("number"))["n"] or 0) + 1
        slug = _version_slug(number)
        target = Path(settings.STROP_ADAPTER_ROOT) / adapter.tenant.slug / adapter.name / slug
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(target.name + ".tmp")
        shutil.copytree(source, staging)
        staging.rename(target)
        version = AdapterVersion.objects.create(
            tenant=tenant,
            adapter=adapter,
            number=number,
            parent=parent,
            artifact_path=str(target),
            vllm_name=f"{adapter.tenant.slug}--{adapter.name}--{slug}",
            status=status,
            lora_rank=int(config["r"]),
            metrics=metrics or {},
            show_gate=show_gate,
        )
        audit_record(
            tenant,
            actor=actor,
            action="adapter_version.register",
            target_type="adapter_version",
            target_id=version.vllm_name,
            data={"parent": parent.vllm_name if parent else None},
        )
        if enqueue_load:
            enqueue_on_commit("workers.serving.adapter_version_load", version.pk)
    return version


# The probe sequence of a version registered without a training sample: code any base model reads.
PROBE_TEXT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'


def adapter_serve_probe(
    base: BaseModel, adapter_dir: str | Path, *, sample: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The trainer's log-probs of a probe sequence under base + adapter (stored in the version's
    metrics as ``serve_probe``; an experiment only starts once vLLM reproduces them).

    Loads the model with torch: call it from the gpu worker, a management command or a test,
    never from an API process. ``sample`` (a training sample) gives the probe real served tokens.
    """
    from transformers import AutoTokenizer

    from gpu_trainer.probe import probe_tokens, serve_probe

    tokenizer = AutoTokenizer.from_pretrained(base.path)
    eos_id = int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0)
    if sample is not None:
        tokens = probe_tokens(sample["prompt_token_ids"], sample["completion_token_ids"], eos_id=eos_id)
    else:
        ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        tokens = probe_tokens(ids[:-8], ids[-8:], eos_id=eos_id)
    return serve_probe(base_model_dir=base.path, adapter_dir=adapter_dir, **tokens)


def adapter_version_mark_loaded(version: AdapterVersion) -> AdapterVersion:
    from django.utils import timezone

    AdapterVersion.objects.filter(pk=version.pk, loaded_at__isnull=True).update(loaded_at=timezone.now())
    version.refresh_from_db()
    return version


def adapter_version_mark_failed(version: AdapterVersion, *, message: str) -> AdapterVersion:
    with transaction.atomic():
        version = AdapterVersion.objects.select_for_update(no_key=True).get(pk=version.pk)
        if version.status != AdapterVersion.Status.FAILED:
            version.status, version.status_message = AdapterVersion.Status.FAILED, message
            version.save(update_fields=["status", "status_message"])
            audit_record(
                version.tenant,
                actor="system",
                action="adapter_version.fail",
                target_type="adapter_version",
                target_id=version.vllm_name,
                data={"message": message[:2000]},
            )
    return version


def adapter_version_promote(tenant: Tenant, *, version: AdapterVersion, actor: str) -> Adapter:
    """Move the production pointer to ``version`` in one transaction, and audit it.

    Requests already in flight finish on the version they started with: every version keeps
    its own vLLM name, and the old one stays loaded. The rows are locked FOR NO KEY UPDATE: a
    served interaction's insert takes KEY SHARE locks on its adapter and version (foreign-key
    checks), which FOR UPDATE would wait on, and in the other order, deadlock with.
    """
    with transaction.atomic():
        adapter = Adapter.objects.select_for_update(no_key=True).get(pk=version.adapter_id, tenant=tenant)
        version = AdapterVersion.objects.select_for_update(no_key=True).get(pk=version.pk)
        if version.status == AdapterVersion.Status.FAILED:
            raise Conflict(f"version {version.vllm_name} failed and cannot serve: {version.status_message}")
        if version.loaded_at is None:
            raise Conflict(f"version {version.vllm_name} is not loaded in vLLM yet", code="not_loaded")
        previous = adapter.production_version
        if previous is not None and previous.pk == version.pk:
            return adapter
        if previous is not None:
            AdapterVersion.objects.filter(pk=previous.pk).update(status=AdapterVersion.Status.RETIRED)
        version.status = AdapterVersion.Status.PRODUCTION
        version.save(update_fields=["status"])
        adapter.production_version = version
        adapter.save(update_fields=["production_version"])
        audit_record(
            tenant,
            actor=actor,
            action="adapter.promote",
            target_type="adapter",
            target_id=adapter.name,
            data={"from": previous.vllm_name if previous else None, "to": version.vllm_name},
        )
        # Forward (a newer version) is a promotion; back to an earlier one, a rollback.
        forward = previous is None or version.number > previous.number
        notification_send(
            tenant,
            event="version.promoted" if forward else "version.rolled_back",
            data={
                "adapter": adapter.name,
                "version": version.number,
                "vllm_name": version.vllm_name,
                "previous": previous.number if previous else None,
                "actor": actor,
            },
        )
    return adapter
