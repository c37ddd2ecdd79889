"""One error shape for the whole API, OpenAI's error object with Strop's details:
``{"error": {"message", "type", "param", "code", "details"}}``.

Domain code raises subclasses of :class:`ApplicationError`;
:func:`apps.common.exception_handler.exception_handler` (wired into DRF) turns them, and DRF's
own exceptions, into that shape with the right status. Anything else is a 500 that is logged.

``code`` says what kind of mistake it is (one code per kind, on every endpoint), ``type`` the
family of the status (OpenAI's names: ``invalid_request_error``, ``authentication_error``...),
``param`` the request field at fault (``max_tokens``, ``messages.0.content``) or None.
:data:`ERROR_CODES` declares every code a client can receive; docs/api.md's table is checked
against it, and a test fails when code in apps/ raises a code it does not declare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The status's family, in the names OpenAI's API uses for its error ``type``.
_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """The error object's ``type`` for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


@dataclass(frozen=True)
class ErrorCode:
    status: int
    when: str
    fix: str

    @property
    def type(self) -> str:
        return error_type(self.status)


# Every code a client can receive, with its status. A code is the kind of mistake, the same on
# every endpoint; the message and ``param`` say which field and why. Per-item codes (a batch's
# 207 results) are the ones a single request answers with its status.
ERROR_CODES: dict[str, ErrorCode] = {
    # 400: the request itself
    "invalid": ErrorCode(400, "a field's value is wrong: type, format or range", "fix the field `param` names"),
    "required": ErrorCode(400, "a required field is missing", "send the field `param` names"),
    "unknown_field": ErrorCode(
        400, "a field or query parameter the endpoint does not take (often a typo)", "remove or rename it"
    ),
    "length_mismatch": ErrorCode(
        400, "completion_logprobs and completion_token_ids differ in length", "send one logprob per token"
    ),
    "malformed_json": ErrorCode(400, "the body is empty or not valid JSON", "send one JSON document"),
    "invalid_utf8": ErrorCode(400, "the body (JSON or CSV) is not valid UTF-8", "encode it as UTF-8"),
    "non_finite_number": ErrorCode(400, "the JSON holds NaN or Infinity", "send finite numbers"),
    "adapter_invalid": ErrorCode(400, "an adapter's settings are inconsistent", "fix the setting the message names"),
    "username_taken": ErrorCode(400, "the username is taken", "choose another"),
    "last_owner": ErrorCode(
        400, "the change would leave the tenant without an owner", "make another member owner first"
    ),
    "nothing_to_retain": ErrorCode(
        400, "a persistence report names a completion that suggested nothing", "report only on accepted completions"
    ),
    "bad_request": ErrorCode(400, "the request cannot be served as sent", "read the message"),
    # 401 / 403: who is calling
    "not_authenticated": ErrorCode(401, "no API key was sent", "send `Authorization: Bearer <API key>`"),
    "authentication_failed": ErrorCode(
        401, "the API key is malformed, unknown or revoked", "check STROP_API_KEY; create a new key if it was revoked"
    ),
    "permission_denied": ErrorCode(
        403, "the key lacks the scope (or the member the role) this call needs", "use a key with the scope"
    ),
    # 404
    "not_found": ErrorCode(404, "no such object or endpoint for this tenant", "check the id or path"),
    "model_not_found": ErrorCode(
        404,
        "`model` names none of the tenant's models (its adapters), or it has no default one",
        "name one of `details.models` (also at GET /v1/models)",
    ),
    "unknown_interaction": ErrorCode(
        404,
        "feedback or a persistence report names a `client_id` not seen yet, and the tenant refuses pending feedback, "
        "or its `occurred_at` is before what the tenant's retention has deleted (an unknown `interaction_id` is "
        "`not_found`)",
        "log the interaction first, or turn on pending feedback in the tenant's settings; one older than the "
        "tenant's retention, drop it",
    ),
    "model_not_loaded": ErrorCode(404, "vLLM has not loaded the model version yet", "retry shortly"),
    # 405 - 415: the HTTP exchange
    "method_not_allowed": ErrorCode(405, "the method is not allowed on this path", "see the `Allow` header"),
    "not_acceptable": ErrorCode(406, "the `Accept` header asks for something other than JSON", "accept JSON"),
    "invitation_unusable": ErrorCode(410, "the invitation was used, revoked or has expired", "ask for a new one"),
    "erased": ErrorCode(
        410,
        "an interaction sent again, or a label (feedback, persistence report, session outcome) for an interaction "
        "or session, that was erased with its end user",
        "drop it: nothing of that user is kept",
    ),
    "length_required": ErrorCode(411, "a body without `Content-Length` (chunked)", "send a Content-Length"),
    "payload_too_large": ErrorCode(413, "the body or the batch is too large", "split it"),
    "unsupported_media_type": ErrorCode(
        415, "the body's `Content-Type` is not one the endpoint takes", "send `application/json` (or text/csv)"
    ),
    "adapter_rejected": ErrorCode(422, "vLLM refused to load the adapter's weights", "read the message; retrain"),
    # 409: the state of things
    "conflict": ErrorCode(409, "the object's state does not allow the call", "read the message"),
    "run_active": ErrorCode(409, "a training run is already going for the adapter or tenant", "wait for it"),
    "run_not_rejected": ErrorCode(
        409, "only a rejected run's events can be left out of training", "name a rejected run"
    ),
    "nothing_to_retrain": ErrorCode(409, "no version learned from an erased end user", "nothing to do"),
    "tenant_exists": ErrorCode(409, "a tenant has that slug", "choose another slug"),
    "adapter_exists": ErrorCode(409, "the tenant has an adapter of that name", "choose another name"),
    "already_member": ErrorCode(409, "the person is already a member", "change their role instead"),
    "not_a_candidate": ErrorCode(409, "the version cannot be an experiment's candidate", "read the message"),
    "not_draft": ErrorCode(409, "only a draft experiment can start", "create a new experiment"),
    "not_running": ErrorCode(409, "the experiment is not running", "read its status"),
    "experiment_running": ErrorCode(409, "an experiment is running on the adapter", "stop it first"),
    "version_failed": ErrorCode(409, "the version failed and cannot serve", "promote another version"),
    "version_purged": ErrorCode(409, "the version's weights were purged", "promote another version"),
    "not_earlier": ErrorCode(409, "a rollback names a version that is not earlier", "name an earlier version"),
    "version_in_use": ErrorCode(409, "the version cannot be purged now", "read the message"),
    "not_trained_on_erased_user": ErrorCode(
        409, "the version did not learn from an erased end user", "only such versions are purged"
    ),
    "not_loaded": ErrorCode(409, "the version is not loaded in vLLM yet", "retry shortly"),
    "adapter_conflict": ErrorCode(409, "vLLM has another adapter loaded under that name", "tell the operator"),
    "adapter_digest_mismatch": ErrorCode(
        409, "the stored weights differ from the version's recorded digest", "tell the operator"
    ),
    "no_serve_probe": ErrorCode(409, "the version has no serve probe to check it with", "tell the operator"),
    "serve_probe_mismatch": ErrorCode(409, "vLLM's answer differs from the version's probe", "tell the operator"),
    # 429 / 5xx
    "rate_limited": ErrorCode(
        429,
        "over the tenant's per-minute limit (or the call alone costs more than the whole limit: then no "
        "`Retry-After`, and `x-should-retry: false`)",
        "wait `Retry-After` seconds; a call over the whole limit, send smaller",
    ),
    "too_many_streams": ErrorCode(
        429, "the tenant has its limit of streams open at once", "wait `Retry-After` seconds or end a stream"
    ),
    "server_error": ErrorCode(500, "the server failed", "quote `details.request_id` to the operator"),
    "vllm_error": ErrorCode(502, "vLLM answered with an error", "retry; quote the request id if it lasts"),
    "service_unavailable": ErrorCode(
        503,
        "the database is unreachable, or it aborted the request against a concurrent one (a deadlock)",
        "retry after `Retry-After` seconds",
    ),
    "vllm_unavailable": ErrorCode(503, "vLLM is down or too slow", "retry after `Retry-After` seconds"),
    "server_busy": ErrorCode(
        503,
        "the API process serves its limit of completions at once (or has no connection to vLLM free)",
        "retry after `Retry-After` seconds",
    ),
}

# A message that starts with the field it is about ("outcome: 'maybe' is not one of ...").
_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+|\[[0-9]+\])*): ")
_INDEX = re.compile(r"\[([0-9]+)\]")


def param_path(field: str) -> str:
    """A field as ``param`` names it: a dotted path, items by index (``messages[0].content`` is
    ``messages.0.content``), as DRF's validation errors nest."""
    return _INDEX.sub(r".\1", field)


def param_of(message: str, details: Any) -> str | None:
    """The field an error is about: ``details["field"]``, else the field its message starts with."""
    field = details.get("field") if isinstance(details, dict) else None
    if isinstance(field, str):
        return param_path(field)
    match = _FIELD_PREFIX.match(message)
    return param_path(match.group(1)) if match else None


def error_object(code: str, message: str, *, status: int, param: str | None, details: Any) -> dict[str, Any]:
    """The error object: OpenAI's four keys, and ``details``."""
    return {
        "message": message,
        "type": error_type(status),
        "param": param,
        "code": code,
        "details": details if details is not None else {},
    }


class ApplicationError(Exception):
    """Base of every error the API answers on purpose. ``param`` is the request field at fault;
    left out, it is ``details["field"]`` or the field the message starts with (``"name: ..."``)."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details if details is not None else {}
        if code is not None:
            self.code = code
        self.param = param if param is not None else param_of(message, self.details)

    def public_details(self) -> Any:
        return self.details

    def as_dict(self) -> dict[str, Any]:
        return error_object(
            self.code, self.message, status=self.status_code, param=self.param, details=self.public_details()
        )


class ValidationFailed(ApplicationError):
    status_code = 400
    code = "invalid"


class NotFound(ApplicationError):
    status_code = 404
    code = "not_found"


class Forbidden(ApplicationError):
    status_code = 403
    code = "permission_denied"


class Conflict(ApplicationError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(ApplicationError):
    status_code = 413
    code = "payload_too_large"


class RateLimited(ApplicationError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int | None, details: Any = None) -> None:
        """``retry_after_s`` None: waiting does not help (the call costs more than the whole limit), so
        the answer carries no ``Retry-After`` and says ``x-should-retry: false``, the header OpenAI's
        clients read before retrying a 429."""
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(ApplicationError):
    """A dependency (vLLM, the database) is down or too slow; the client may retry later."""

    status_code = 503
    code = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


BUSY_RETRY_AFTER_S = 1


class ServerBusy(ServiceUnavailable):
    """This process is at its limit of work at once: the completions it admits
    (:mod:`apps.serving.admission`), or its connections to vLLM (:mod:`apps.engines.vllm_pool`).
    Nothing is wrong with vLLM: the client retries shortly, here or on another API process."""

    code = "server_busy"

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message, retry_after_s=BUSY_RETRY_AFTER_S, details=details)
