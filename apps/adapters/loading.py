"""Getting adapter versions into vLLM and checking what it serves.

``adapter_version_load`` loads a version on every replica and marks what vLLM said; the
serve-probe (``serve_probe_verify``) asks every replica for the log-probs of the probe the
trainer recorded and compares them, so a version meets users only where vLLM serves exactly its
weights. Every load is checked against the digest Strop recorded when the version was registered:
a version in object storage by the replica's plugin (Strop sends the digest with the load and the
plugin refuses other files, ``platform/vllm_plugins/strop_vllm_store.py``), a folder on this host
by Strop itself before vLLM is asked. Depends on the adapters and the engine handle only: training
(after a run), the API, the dashboard, the serving queue and experiments all load versions the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_mark_failed, adapter_version_mark_loaded
from apps.adapters.store import StoreCorrupt, verify_directory
from apps.common.exceptions import Conflict
from apps.common.observability.metrics import adapter_load_counted
from apps.engines.vllm import vllm_client
from apps.engines.vllm_client import AdapterRejected, VLLMError, VLLMUnavailable
from gpu_trainer.probe import PROBE_SOURCE

logger = logging.getLogger(__name__)


def adapter_version_load(*, version_id: int) -> str:
    """Load a version on every replica; a refusal marks it failed with vLLM's message."""
    version = AdapterVersion.objects.select_related("tenant").get(pk=version_id)
    if version.status == AdapterVersion.Status.FAILED:
        return "failed"
    if version.status == AdapterVersion.Status.PURGED:
        return "purged"  # its weights are gone from the store: nothing to load
    try:
        _verify_local_copy(version)
    except StoreCorrupt as exc:
        adapter_load_counted("rejected")
        adapter_version_mark_failed(version, message=_mismatch_message(version, exc))
        return "failed"
    try:
        vllm_client().load_adapter(version.vllm_name, version.artifact_path, digest=version.digest)
    except AdapterRejected as exc:
        adapter_load_counted("rejected")
        adapter_version_mark_failed(version, message=f"vLLM refused the adapter: {exc.message}")
        return "failed"
    except VLLMUnavailable:
        adapter_load_counted("unavailable")
        raise
    except VLLMError:
        adapter_load_counted("error")
        raise
    adapter_load_counted("loaded")
    adapter_version_mark_loaded(version)
    return "loaded"


def adapter_version_load_everywhere(version: AdapterVersion) -> None:
    """Load a version on every replica (idempotent); vLLM's refusal or absence is raised, and a
    folder that does not match the version's digest is a Conflict."""
    try:
        _verify_local_copy(version)
    except StoreCorrupt as exc:
        raise Conflict(_mismatch_message(version, exc), code="adapter_digest_mismatch") from None
    vllm_client().load_adapter(version.vllm_name, version.artifact_path, digest=version.digest)  # idempotent
    if version.loaded_at is None:
        AdapterVersion.objects.filter(pk=version.pk, loaded_at__isnull=True).update(loaded_at=timezone.now())


def _verify_local_copy(version: AdapterVersion) -> None:
    """A version in a folder on this host is read by vLLM in place: check it against the digest
    first. (One in object storage is checked by the replica that fetches it, against the digest
    sent with the load.) A missing folder is left to vLLM, whose 404 says so."""
    path = Path(version.artifact_path)
    if version.digest and not version.artifact_path.startswith("s3://") and path.is_dir():
        verify_directory(path, digest=version.digest)


def _mismatch_message(version: AdapterVersion, exc: StoreCorrupt) -> str:
    return (
        f"digest mismatch: the adapter store's copy of version {version.number} is not the one Strop registered "
        f"({exc}); it was not loaded"
    )


@dataclass
class ProbeCheck:
    replica: int  # its place in VLLM_BASE_URLS, from 1: tenants never see the replicas' addresses
    max_abs_diff: float | None
    ok: bool
    message: str


def serve_probe_verify(version: AdapterVersion) -> list[ProbeCheck]:
    """Ask every vLLM replica for the probe's log-probs under ``version`` and compare them with the
    trainer's. Raises Conflict (naming the replica and the gap) when one does not serve exactly
    these weights, or when the version has no probe to check."""
    probe = (version.metrics or {}).get("serve_probe")
    if not probe or probe.get("source") != PROBE_SOURCE:
        # A version registered without a probe, or one whose probe (cut from a training sample, as
        # versions made before the synthetic probe had) the scrub migration removed.
        raise Conflict(
            f"version {version.number} has no serve probe recorded, so Strop cannot check that vLLM serves its "
            "weights; an operator records one with `manage.py adapter_version_reprobe` (the trainer and "
            "`manage.py adapter_version_register` record one with every version they make)",
            code="no_serve_probe",
        )
    tolerance = settings.STROP_PROBE_TOLERANCE
    client = vllm_client()
    checks: list[ProbeCheck] = []
    prompt, completion, expected = probe["prompt_token_ids"], probe["completion_token_ids"], probe["logprobs"]
    for index, replica in enumerate(client.base_urls, start=1):
        served = client.prompt_logprobs(replica, model=version.vllm_name, token_ids=[*prompt, *completion])
        served_tail = served[len(prompt) :]
        tail = [v for v in served_tail if v is not None]
        if len(served_tail) != len(expected) or len(tail) != len(served_tail):
            checks.append(ProbeCheck(index, None, False, "vLLM returned no log-prob for some probe tokens"))
            continue
        gap = max(abs(float(a) - float(b)) for a, b in zip(tail, expected, strict=True))
        ok = gap <= tolerance
        checks.append(ProbeCheck(index, gap, ok, "" if ok else f"max |Δ logprob| {gap:.4f} > {tolerance}"))
    failed = [c for c in checks if not c.ok]
    if failed:
        for check in failed:  # the operator's log names the replica; the tenant reads its number
            logger.warning(
                "serve probe of %s failed on replica %d (%s): %s",
                version.vllm_name,
                check.replica,
                client.base_urls[check.replica - 1],
                check.message,
            )
        details = "; ".join(f"replica {c.replica} of {len(checks)}: {c.message}" for c in failed)
        raise Conflict(
            f"vLLM does not serve version {version.number}'s weights: {details}. The experiment was not started.",
            code="serve_probe_mismatch",
            details={"checks": [c.__dict__ for c in checks], "tolerance": tolerance},
        )
    return checks
