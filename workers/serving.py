from __future__ import annotations

from celery import shared_task

from apps.engines.vllm_client import VLLMUnavailable


@shared_task(
    name="workers.serving.adapter_version_load",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(VLLMUnavailable,),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=10,
    expires=3600,
)
def adapter_version_load(version_id: int) -> str:
    """Load a version on every vLLM replica (idempotent: loading a loaded name is a no-op).

    vLLM down is retried with backoff; a version vLLM refuses is marked failed, not retried."""
    from apps.adapters.loading import adapter_version_load as load

    return load(version_id=version_id)
