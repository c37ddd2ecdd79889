"""Python client of the Strop API: ``Strop`` (sync) and ``AsyncStrop`` (asyncio)."""

from strop._async_batcher import AsyncFeedbackBatcher
from strop._async_client import AsyncStrop
from strop._batch_core import BatcherOptions, BatcherStats, FailedBatch, RejectedEvent
from strop._batcher import FeedbackBatcher
from strop._client import Strop
from strop._exceptions import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
    StropError,
)
from strop._management_types import Adapter, Assignment, EndUser, Experiment, Model
from strop._streaming import AsyncCompletionStream, CompletionStream
from strop._types import (
    BatchResult,
    Completion,
    CompletionChoice,
    CompletionChunk,
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
    "APIStatusError",
    "APITimeoutError",
    "Adapter",
    "Assignment",
    "AsyncCompletionStream",
    "AsyncFeedbackBatcher",
    "AsyncStrop",
    "AuthenticationError",
    "BadRequestError",
    "BatchResult",
    "BatcherOptions",
    "BatcherStats",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionStream",
    "ConflictError",
    "EndUser",
    "Experiment",
    "FailedBatch",
    "FeedbackBatcher",
    "FeedbackState",
    "Interaction",
    "ItemError",
    "ItemResult",
    "Model",
    "NotFoundError",
    "Page",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RejectedEvent",
    "ServiceUnavailableError",
    "StreamError",
    "Strop",
    "StropError",
    "StropInfo",
    "Usage",
    "__version__",
]
