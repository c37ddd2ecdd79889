"""vLLM's failures as typed errors, and the mapping from its HTTP answers to them.

vLLM answers errors as ``{"error": {"message", "type", "code"}}`` with the HTTP status in
``code``. Each becomes an :class:`~apps.common.exceptions.ApplicationError` subclass, so the API
answers it in its one error shape: the tenant's mistakes as 4xx, vLLM down or too slow as 503
with Retry-After, anything else as 502. No free connection in this process's pool is the process's
busy answer (503 ``server_busy``), not a failure of vLLM.

Replicas are the operator's: a tenant never reads their URLs, hosts or adapter paths. ``message``
(what the API, the event stream and the dashboard show) has them replaced by placeholders, and
``public_details`` leaves them out of the details; the full text (``operator_message``) and the replica
go to the operator's log when the error is made, on a line that carries the request id.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from apps.common.exception_handler import public_text
from apps.common.exceptions import ApplicationError, ServerBusy, ServiceUnavailable

logger = logging.getLogger(__name__)

# Details the operator's log keeps and a tenant's answer leaves out.
OPERATOR_ONLY_DETAILS = frozenset({"replica", "lora_path"})


def _operator_log(error: ApplicationError, operator_message: str, replica: str | None) -> None:
    level = logging.WARNING if error.status_code >= 500 else logging.INFO
    logger.log(level, "%s (%s) from vLLM replica %s: %s", type(error).__name__, error.code, replica, operator_message)


def _public_details(details: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in details.items() if key not in OPERATOR_ONLY_DETAILS}


class VLLMError(ApplicationError):
    """vLLM answered with an error we have no better name for (its own 5xx, an odd body)."""

    status_code = 502
    code = "vllm_error"

    def __init__(
        self,
        message: str,
        *,
        replica: str | None = None,
        vllm_status: int | None = None,
        vllm_type: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        extra = {"replica": replica, "vllm_status": vllm_status, "vllm_type": vllm_type}
        public = public_text(message, max_length=1000, first_line=False)
        super().__init__(public, details={**extra, **(details or {})})
        self.operator_message = message
        self.replica = replica
        self.vllm_status = vllm_status
        self.vllm_type = vllm_type
        _operator_log(self, message, replica)

    def public_details(self) -> dict[str, Any]:
        return _public_details(self.details)


class VLLMBadRequest(VLLMError):
    """vLLM refused the request's parameters (too many tokens, token id out of vocabulary...)."""

    status_code = 400
    code = "invalid"


class ModelNotLoaded(VLLMError):
    """The base model or adapter named in the request is not loaded on that replica."""

    status_code = 404
    code = "model_not_loaded"


class AdapterRejected(VLLMError):
    """vLLM refused to load a LoRA adapter (missing path, bad config, rank too big, DoRA...)."""

    status_code = 422
    code = "adapter_rejected"


class AdapterConflict(VLLMError):
    """The adapter name is already loaded from a different path (names are never reused)."""

    status_code = 409
    code = "adapter_conflict"


class VLLMUnavailable(ServiceUnavailable):
    """No replica could be reached or one did not answer in time; the caller may retry later."""

    code = "vllm_unavailable"

    def __init__(self, message: str, *, replica: str | None = None, retry_after_s: int = 5) -> None:
        public = public_text(message, max_length=1000, first_line=False)
        super().__init__(public, retry_after_s=retry_after_s, details={"replica": replica})
        self.operator_message = message
        self.replica = replica
        _operator_log(self, message, replica)

    def public_details(self) -> dict[str, Any]:
        return _public_details(self.details)


def upstream_busy(replica: str, exc: httpx.PoolTimeout) -> ServerBusy:
    """This process's pool to vLLM had no free connection within the request's pool deadline.

    The replica is busy, not down (it is not marked down), and nothing was sent: the pool is one
    for every replica, so no other replica could take the request now either. The client gets the
    busy answer admission gives (503 ``server_busy``, ``Retry-After``); the operator's log says which
    replica was asked, since a pool larger than the admission limit runs dry only when connections
    are held outside admission."""
    logger.warning("ServerBusy (server_busy): no free connection in this process's pool for vLLM replica %s (%s); "
                   "the replica is not marked down", replica, exc)
    return ServerBusy("this process has every connection to vLLM in use; retry shortly")


def error_parts(response: httpx.Response) -> tuple[str, str | None]:
    """vLLM's message and type from its error JSON, or whatever else the body holds."""
    try:
        body = response.json()
    except ValueError:
        return (response.text.strip()[:1000] or f"HTTP {response.status_code}"), None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err), (str(err["type"]) if err.get("type") else None)
        if isinstance(err, str):
            return err, None
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key]), None
    return json.dumps(body)[:1000], None


def raise_for(response: httpx.Response, replica: str, *, what: str) -> None:
    """Map a non-2xx answer of a completion or listing call to our errors."""
    status = response.status_code
    if status < 400:
        return
    message, vtype = error_parts(response)
    kwargs: dict[str, Any] = {"replica": replica, "vllm_status": status, "vllm_type": vtype}
    if status == 404 and vtype is not None:  # vLLM's NotFoundError; a bare 404 is a wrong URL
        raise ModelNotLoaded(message, **kwargs)
    if "Out of range float values" in message:  # NaN/inf logprobs: the weights (an adapter) are broken
        raise VLLMError(f"vLLM produced non-finite logprobs: {message}", **kwargs)
    if status in (408, 429, 502, 503, 504):
        raise VLLMUnavailable(f"vLLM {what} at {replica}: {message}", replica=replica)
    if 400 <= status < 500:
        raise VLLMBadRequest(message, **kwargs)
    raise VLLMError(f"vLLM {what} failed: {message}", **kwargs)
