"""The adapter registry: base models, tenant adapters, versions, and the production pointer."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_slug
from django.db import Error as DatabaseLayerError
from django.db import IntegrityError, transaction
from django.db.models import Max

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.adapters.store import Stored, StoreError, adapter_store, store_for
from apps.common.exceptions import Conflict, ServiceUnavailable, ValidationFailed
from apps.common.tasks import enqueue_on_commit
from apps.notifications.services import notification_send
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record

logger = logging.getLogger(__name__)


def base_model_register(*, name: str, path: str | Path, family: str | None = None, force: bool = False) -> BaseModel:
    """Register (or update) a base model: its directory, FIM family, source and fingerprint.

    The source comes from the directory's ``strop_base.json`` when it has one (written by
    ``python -m gpu_trainer base``), else it is the path; the fingerprint is computed from the
    weights either way, and a record that no longer matches them is refused.

    Registering the same weights again changes nothing that matters (``platform/docker/migrate.sh``
    does it at every start). Other weights under a name whose adapters have versions are refused
    unless ``force``: those versions were trained on the old weights, and would be served and
    trained on top of the new ones.
    """
    from learning_shared.errors import TrainerInputError
    from learning_shared.fim import FIM_FORMATS
    from model_supply.base_models import describe_base_model

    model_dir = Path(path).resolve()
    if family is not None and family not in FIM_FORMATS:
        raise ValidationFailed(f"family: {family!r} is not one of {', '.join(FIM_FORMATS)}")
    try:
        described = describe_base_model(model_dir)
    except TrainerInputError as exc:
        raise ValidationFailed(f"path: {exc}") from None
    with transaction.atomic():
        existing = BaseModel.objects.select_for_update().filter(name=name).first()
        if existing is not None and not force:
            _base_model_weights_kept(existing, model_dir=model_dir, fingerprint=described["fingerprint"])
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


def _base_model_weights_kept(base: BaseModel, *, model_dir: Path, fingerprint: str) -> None:
    """Refuse other weights under ``base`` while versions trained on its weights may serve. The
    same weights are recognised by their fingerprint (a moved directory is the same model); a record
    without one (registered before fingerprints) only by its path."""
    same = base.fingerprint == fingerprint if base.fingerprint else base.path == str(model_dir)
    if same:
        return
    trained = AdapterVersion.objects.filter(adapter__base_model=base).exclude(
        status__in=[AdapterVersion.Status.FAILED, AdapterVersion.Status.PURGED]
    )
    count = trained.count()
    if count:
        raise ValidationFailed(
            f"path: base model {base.name!r} is {base.path} (fingerprint {base.fingerprint or 'unknown'}), and "
            f"{count} adapter version(s) were trained on it; {model_dir} holds other weights (fingerprint "
            f"{fingerprint}). Register them under a new name; forcing it repoints every adapter on "
            f"{base.name!r} to weights its versions were not trained on",
            details={"versions": count},
        )


def _adapter_name_check(name: str) -> None:
    """What an adapter's column and the dashboard's URLs (``<slug:adapter_name>``) can hold."""
    most = Adapter._meta.get_field("name").max_length or 0
    rule = f"1 to {most} ASCII letters, digits, hyphens and underscores"
    if len(name) > most:
        raise ValidationFailed(f"name: {len(name)} characters; an adapter's name is {rule}")
    try:
        validate_slug(name)  # the rule of the `slug` path converter every adapter page's URL uses
    except DjangoValidationError:
        raise ValidationFailed(f"name: {name!r} is not a slug; an adapter's name is {rule}") from None


def adapter_create(
    tenant: Tenant, *, name: str, base_model: BaseModel, is_default: bool = False, actor: str = "system"
) -> Adapter:
    _adapter_name_check(name)
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


def adapter_source_verify(base: BaseModel, *, source_dir: str | Path) -> dict[str, Any]:
    """Check that ``source_dir`` is a PEFT LoRA directory vLLM can serve (``verify_adapter``) and
    that it was trained on ``base`` (its ``strop_train_config.json``'s fingerprint, else the base
    its ``adapter_config.json`` names when that directory is here); its adapter config. Cheap next
    to the serve probe, so it runs before one: a probe of a folder that is not an adapter of this
    base fails inside torch instead of saying what is wrong."""
    from gpu_trainer.adapters import check_parent_matches_base, verify_adapter
    from learning_shared.errors import AdapterInvalidError

    source = Path(source_dir)
    if not source.is_dir():
        raise ValidationFailed(f"adapter {source}: no such directory", code="adapter_invalid")
    try:
        config = verify_adapter(source, max_rank=settings.VLLM_MAX_LORA_RANK)
    except AdapterInvalidError as exc:
        raise ValidationFailed(str(exc), code="adapter_invalid") from None
    if base.fingerprint:  # a base registered before fingerprints has none to compare with
        try:
            check_parent_matches_base(source, base.path, base.fingerprint)
        except AdapterInvalidError as exc:
            raise ValidationFailed(
                f"adapter {source} does not fit base model {base.name!r}: {exc}", code="adapter_invalid"
            ) from None
    return config


# The uploads of the innermost open ``atomic_undoing_uploads`` block.
_open_uploads: ContextVar[list[Stored] | None] = ContextVar("strop_adapter_uploads", default=None)


@contextmanager
def atomic_undoing_uploads() -> Iterator[list[Stored]]:
    """``transaction.atomic()`` that removes from the adapter store every version uploaded inside it
    (the list it yields; ``adapter_version_register`` adds to it) unless its transaction commits.

    A version's files are uploaded before its row is written, so a rollback after the upload (an
    error, a time limit, a commit that fails) would leave a complete version that no row names,
    beyond an erase's reach. Nested in another such block, what this one keeps is handed to the
    outer one, whose commit decides; nested in a plain ``transaction.atomic()``, only a rollback of
    this block is seen, so wrap the outermost transaction in this instead. Removing takes a key that
    may delete (``STROP_STORE_PURGE_KEY_ID`` where the store's keys are split): a process without
    one, like a process killed before the commit, leaves the version for an operator to delete
    (docs/operate.md: when the store and the database disagree), and logs which."""
    outer = _open_uploads.get()
    nested = transaction.get_connection().in_atomic_block
    uploads: list[Stored] = []
    token = _open_uploads.set(uploads)
    committing = False
    try:
        with transaction.atomic():
            yield uploads
            committing = True
    except BaseException:
        _uploads_undo(uploads, commit_failed=committing and not nested)
        raise
    finally:
        _open_uploads.reset(token)
    if outer is not None:
        outer.extend(uploads)


def _uploads_undo(uploads: list[Stored], *, commit_failed: bool) -> None:
    for stored in uploads:
        if commit_failed and _row_kept(stored):
            continue  # the commit went through after all, and only its answer was lost
        try:
            store_for(stored.address).purge(stored.address)
        except StoreError as exc:
            logger.error(
                "version %s was uploaded but never registered, and removing it from the adapter store failed (%s): "
                "delete it by hand (docs/operate.md, when the store and the database disagree)",
                stored.address,
                exc,
            )
        else:
            logger.warning("removed %s from the adapter store: its registration did not commit", stored.address)


def _row_kept(stored: Stored) -> bool:
    """Whether a row names ``stored`` after a commit that raised. Unknown counts as no: removing the
    files of a committed row leaves a version that fails to load, visibly; keeping files no row names
    leaves weights that no erase reaches."""
    try:
        transaction.get_connection().close_if_unusable_or_obsolete()
        return AdapterVersion.objects.filter(artifact_path=stored.address).exists()
    except DatabaseLayerError:
        return False


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
    """Write a verified PEFT adapter to the adapter store as a new version and register it.

    The store writes the version once, under a name never reused, with a manifest last, and the
    row commits after the upload, so no row names a half-written version. If the transaction does
    not commit after the upload (an error, a time limit, a failed commit), the upload is removed
    (``atomic_undoing_uploads``; a caller that registers inside its own transaction wraps that in
    one). A process killed between the upload and the commit does leave a complete version that no
    row names: nothing loads or serves it, and docs/operate.md says how to find and delete it. The
    trainer's per-step metrics go into the row, so nothing reads them from files again. Loading
    into vLLM happens after commit.
    """
    if adapter.tenant_id != tenant.pk or (parent is not None and parent.adapter_id != adapter.pk):
        raise ValueError("adapter or parent belongs elsewhere")
    source = Path(source_dir)
    config = adapter_source_verify(adapter.base_model, source_dir=source)
    with atomic_undoing_uploads() as uploads:
        Adapter.objects.select_for_update(no_key=True).filter(pk=adapter.pk).first()  # serialises version numbers
        number = (AdapterVersion.objects.filter(adapter=adapter).aggregate(n=Max("number"))["n"] or 0) + 1
        slug = _version_slug(number)
        vllm_name = f"{adapter.tenant.slug}--{adapter.name}--{slug}"
        try:
            stored = adapter_store().put(
                source, tenant=adapter.tenant.slug, adapter=adapter.name, slug=slug, vllm_name=vllm_name
            )
        except StoreError as exc:
            raise ServiceUnavailable(f"the adapter store did not take version {number}: {exc}") from None
        uploads.append(stored)
        version = AdapterVersion.objects.create(
            tenant=tenant,
            adapter=adapter,
            number=number,
            parent=parent,
            artifact_path=stored.address,
            digest=stored.digest,
            training_steps=_training_steps(source),
            vllm_name=vllm_name,
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


def adapter_version_fetch(version: AdapterVersion, *, into: str | Path) -> Path:
    """A local folder holding ``version``'s files, checked against its digest: fetched from object
    storage into ``into``, or the store's own folder on the embedded default. For the trainer (a
    parent to train on and compare with); vLLM replicas fetch for themselves."""
    try:
        return store_for(version.artifact_path).fetch(version.artifact_path, digest=version.digest, dest=into)
    except StoreError as exc:
        raise ServiceUnavailable(f"version {version.number} could not be read from the adapter store: {exc}") from None


# The most per-step rows a version keeps (a run of 2,048 events at batch 8 and 4 epochs has 1,024).
MAX_TRAINING_STEPS = 20_000


def _training_steps(source: Path) -> list[dict[str, Any]]:
    """The trainer's ``metrics.jsonl`` beside the adapter, as rows (unreadable lines skipped)."""
    steps: list[dict[str, Any]] = []
    try:
        with (source / "metrics.jsonl").open() as fh:
            for line in fh:
                if len(steps) >= MAX_TRAINING_STEPS:
                    break
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    steps.append(row)
    except OSError:
        return []
    return steps


def adapter_serve_probe(base: BaseModel, adapter_dir: str | Path) -> dict[str, Any]:
    """The trainer's log-probs of the synthetic probe sequence under base + adapter (stored in the
    version's metrics as ``serve_probe``; an experiment only starts once vLLM reproduces them).
    Nothing in it comes from a training sample, so a version's metrics hold no end user's text.

    Loads the model with torch: call it from the gpu worker, a management command or a test,
    never from an API process.
    """
    from gpu_trainer.probe import serve_probe

    return serve_probe(base_model_dir=base.path, adapter_dir=adapter_dir)


def adapter_version_probe_record(version: AdapterVersion, *, probe: dict[str, Any], actor: str) -> AdapterVersion:
    """Store a freshly computed serve probe on an existing version (``adapter_version_reprobe``:
    versions whose probe the scrub migration removed); audited."""
    with transaction.atomic():
        version = AdapterVersion.objects.select_for_update(no_key=True).get(pk=version.pk)
        metrics = {k: v for k, v in (version.metrics or {}).items() if k != "serve_probe_scrubbed"}
        version.metrics = {**metrics, "serve_probe": probe}
        version.save(update_fields=["metrics"])
        audit_record(
            version.tenant,
            actor=actor,
            action="adapter_version.reprobe",
            target_type="adapter_version",
            target_id=version.vllm_name,
            data={},
        )
    return version


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
        if version.status == AdapterVersion.Status.PURGED:
            raise Conflict(f"version {version.number}'s weights were purged; it cannot serve", code="version_purged")
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
