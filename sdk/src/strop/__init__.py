"""Python client of the Strop API: ``Strop`` (sync) and ``AsyncStrop`` (asyncio)."""

from strop._adapter_types import Adapter, AdapterVersion, EvalSet, TrainingPolicy, TrainingRun
from strop._async_batcher import AsyncFeedbackBatcher
from strop._async_client import AsyncStrop
from strop._async_streaming import AsyncChatCompletionStream, AsyncCompletionStream
from strop._batch_core import BatcherOptions, BatcherStats, FailedBatch, RejectedEvent
from strop._batcher import FeedbackBatcher
from strop._chat_types import ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatMessage
from strop._client import Strop
from strop._core import InsecureBaseURLWarning
from strop._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
    StropError,
    UnprocessableEntityError,
)
from strop._experiment_types import Assignment, Experiment, Holdout, Snapshot
from strop._literals import Metric, Outcome, Scope
from strop._management_types import ApiKey, AuditEvent, EndUser, Health, Model, Tenant
from strop._persistence import PersistenceTracker
from strop._persistence_types import InteractionPersistence, PersistenceCheckpoint, PersistenceResult
from strop._streaming import ChatCompletionStream, CompletionStream
from strop._types import (
    BatchResult,
    Completion,
    CompletionChoice,
    CompletionChunk,
    EditorOutcome,
    FeedbackState,
    Interaction,
    ItemError,
    ItemResult,
    Page,
    StropInfo,
    Usage,
)
from strop._version import __version__

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "Adapter",
    "AdapterVersion",
    "ApiKey",
    "Assignment",
    "AsyncChatCompletionStream",
    "AsyncCompletionStream",
    "AsyncFeedbackBatcher",
    "AsyncStrop",
    "AuditEvent",
    "AuthenticationError",
    "BadRequestError",
    "BatchResult",
    "BatcherOptions",
    "BatcherStats",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionStream",
    "ChatMessage",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionStream",
    "ConflictError",
    "EditorOutcome",
    "EndUser",
    "EvalSet",
    "Experiment",
    "FailedBatch",
    "FeedbackBatcher",
    "FeedbackState",
    "Health",
    "Interaction",
    "InsecureBaseURLWarning",
    "InternalServerError",
    "ItemError",
    "ItemResult",
    "Metric",
    "Model",
    "NotFoundError",
    "Outcome",
    "Page",
    "PersistenceResult",
    "InteractionPersistence",
    "PersistenceCheckpoint",
    "PersistenceTracker",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RejectedEvent",
    "Scope",
    "ServiceUnavailableError",
    "Snapshot",
    "Holdout",
    "StreamError",
    "Strop",
    "StropError",
    "StropInfo",
    "Tenant",
    "TrainingPolicy",
    "TrainingRun",
    "UnprocessableEntityError",
    "Usage",
    "__version__",
]
