"""Python client of the Strop API: ``Strop`` (sync) and ``AsyncStrop`` (asyncio)."""

from strop._async_batcher import AsyncFeedbackBatcher
from strop._async_client import AsyncStrop
from strop._async_streaming import AsyncChatCompletionStream, AsyncCompletionStream
from strop._batch_core import BatcherOptions, BatcherStats, FailedBatch, RejectedEvent
from strop._batcher import FeedbackBatcher
from strop._chat_types import ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatMessage
from strop._client import Strop
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
)
from strop._literals import Outcome, Scope
from strop._management_types import Adapter, ApiKey, Assignment, EndUser, Experiment, Model
from strop._streaming import ChatCompletionStream, CompletionStream
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
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "Adapter",
    "ApiKey",
    "Assignment",
    "AsyncChatCompletionStream",
    "AsyncCompletionStream",
    "AsyncFeedbackBatcher",
    "AsyncStrop",
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
    "EndUser",
    "Experiment",
    "FailedBatch",
    "FeedbackBatcher",
    "FeedbackState",
    "Interaction",
    "InternalServerError",
    "ItemError",
    "ItemResult",
    "Model",
    "NotFoundError",
    "Outcome",
    "Page",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RejectedEvent",
    "Scope",
    "ServiceUnavailableError",
    "StreamError",
    "Strop",
    "StropError",
    "StropInfo",
    "Usage",
    "__version__",
]
