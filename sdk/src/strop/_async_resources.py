"""The resources without streams that serve, log and learn: interactions, feedback (sent now or
batched in the background), editor plugins' outcomes, end users, models and health. Each method
builds its call with ``_api`` and hands it to the client. The tenant's management resources are
in ``_async_management``."""

# unasync: _resources.py is generated from this file. Edit here, then run sdk/scripts/unasync.py.

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from strop import _api
from strop._async_batcher import AsyncFeedbackBatcher
from strop._batch_core import BatcherOptions
from strop._literals import Outcome
from strop._management_types import EndUser, Health, Model
from strop._persistence_types import InteractionPersistence, PersistenceResult
from strop._types import BatchResult, EditorOutcome, Interaction, ItemResult, Page

if TYPE_CHECKING:
    from strop._async_client import AsyncStrop

__all__ = [
    "AsyncAPIResource",
    "AsyncEditor",
    "AsyncFeedback",
    "AsyncHealthResource",
    "AsyncInteractions",
    "AsyncModels",
    "AsyncUsers",
]


class AsyncAPIResource:
    def __init__(self, client: AsyncStrop) -> None:
        self._client = client


class AsyncInteractions(AsyncAPIResource):
    async def log(
        self,
        *,
        client_id: str,
        completion: str,
        prompt: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        completion_token_ids: Sequence[int] | None = None,
        completion_logprobs: Sequence[float] | None = None,
        model: str | None = None,
        end_user_id: str | None = None,
        opted_in: bool | None = None,
        served_at: datetime | str | None = None,
        latency_ms: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        conversation_id: str | None = None,
        turn: int | None = None,
    ) -> Interaction:
        """Log one completion served elsewhere: for a ``prompt`` (or ``prefix``), or an agent's
        reply to ``messages`` (with ``tools``, its session's ``conversation_id`` and ``turn``).
        Sending a ``client_id`` again stores nothing and returns the first interaction
        (``created`` False)."""
        item = _api.interaction_item(
            client_id=client_id,
            completion=completion,
            prompt=prompt,
            prefix=prefix,
            suffix=suffix,
            prompt_token_ids=prompt_token_ids,
            completion_token_ids=completion_token_ids,
            completion_logprobs=completion_logprobs,
            model=model,
            end_user_id=end_user_id,
            opted_in=opted_in,
            served_at=served_at,
            latency_ms=latency_ms,
            metadata=metadata,
            messages=messages,
            tools=tools,
            conversation_id=conversation_id,
            turn=turn,
        )
        return await self._client._run(_api.interaction_log(item))

    async def log_batch(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Log up to 1000 interactions (dicts with ``log``'s fields) in one call; one verdict each."""
        return await self._client._run(_api.interaction_log_batch(items))

    async def get(self, interaction_id: str) -> Interaction:
        return await self._client._run(_api.interaction_get(interaction_id))

    async def persistence(self, interaction_id: str) -> InteractionPersistence:
        """What was left of the interaction's accepted completion at each checkpoint reported so
        far (``feedback.persistence``), measured as retained characters."""
        return await self._client._run(_api.interaction_persistence(interaction_id))

    async def list(
        self, *, end_user_id: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> Page[Interaction]:
        """One page, newest first (``limit`` default 50, at most 500); next: ``offset=page.next_offset``."""
        return await self._client._run(_api.interaction_list(end_user_id=end_user_id, limit=limit, offset=offset))


def _now_unless(occurred_at: datetime | str | None) -> datetime | str:
    """``occurred_at``, else now (UTC): when the user acted, not when the event reached Strop (a
    queued or retried event must not win over one the user did after it)."""
    return datetime.now(timezone.utc).isoformat() if occurred_at is None else occurred_at


class AsyncFeedback(AsyncAPIResource):
    def __init__(self, client: AsyncStrop, options: BatcherOptions | None) -> None:
        super().__init__(client)
        self._options = options
        self._batcher: AsyncFeedbackBatcher | None = None
        # Several threads may make the first enqueue at once: one batcher (and one sender) for all.
        self._batcher_lock = threading.Lock()
        # Set on a client made by ``with_options``: the feedback resource whose batcher it uses.
        self._batcher_owner: AsyncFeedback | None = None

    async def send(
        self,
        *,
        outcome: Outcome,
        interaction_id: str | None = None,
        client_id: str | None = None,
        kept_text: str | None = None,
        accepted_chars: int | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ItemResult:
        """Record one event now: ``status`` is ``recorded``, or ``pending`` when its interaction
        (named by ``client_id``) has not arrived yet. ``edited`` takes the ``kept_text``, and
        ``edit_persisted`` may (the code still in the file: training credits the answer's tokens
        that persisted); ``partial`` the ``accepted_chars``, how many leading characters of the
        completion the user took (1 to its length - 1: an editor's word-by-word accept).
        ``occurred_at`` defaults to now, the time of this call, by this machine's clock, as
        ``enqueue``'s does: the latest wins, so every event the SDK sends is dated by one clock."""
        item = _api.feedback_item(
            outcome=outcome,
            interaction_id=interaction_id,
            client_id=client_id,
            kept_text=kept_text,
            accepted_chars=accepted_chars,
            occurred_at=_now_unless(occurred_at),
            metadata=metadata,
        )
        return await self._client._run(_api.feedback_send(item))

    async def session_outcome(
        self,
        *,
        conversation_id: str,
        turn: int,
        outcome: Outcome,
        discount: float | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ItemResult:
        """How an agent session ended (``thumbs_up``, ``follow_up_dissatisfied``...), after its
        ``turn``: that turn gets the outcome's reward, each earlier one ``discount ** distance``
        of it (default 0: that turn only). A turn's own feedback always wins."""
        item = _api.feedback_item(
            outcome=outcome,
            conversation_id=conversation_id,
            turn=turn,
            discount=discount,
            occurred_at=occurred_at,
            metadata=metadata,
        )
        return await self._client._run(_api.feedback_send(item))

    async def send_batch(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Record up to 1000 events (dicts with ``send``'s fields) in one call; one verdict each."""
        return await self._client._run(_api.feedback_send_batch(items))

    async def persistence(
        self,
        *,
        checkpoint_s: int,
        interaction_id: str | None = None,
        client_id: str | None = None,
        text: str | None = None,
        retained_ratio: float | None = None,
        accepted_chars: int | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> PersistenceResult:
        """Report what is left of an accepted completion ``checkpoint_s`` seconds after the accept:
        ``text`` (at the insertion point now, or the document) or ``retained_ratio`` (your own
        measure, 0 to 1). Strop measures ``retained_chars`` by edit distance; a report sent twice
        counts once, the latest ``occurred_at`` wins. ``PersistenceTracker`` sends these for you."""
        item = _api.persistence_item(
            checkpoint_s=checkpoint_s,
            interaction_id=interaction_id,
            client_id=client_id,
            text=text,
            retained_ratio=retained_ratio,
            accepted_chars=accepted_chars,
            occurred_at=occurred_at,
            metadata=metadata,
        )
        return await self._client._run(_api.persistence_send(item))

    async def persistence_batch(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Up to 1000 persistence reports (dicts with ``persistence``'s fields) in one call."""
        return await self._client._run(_api.persistence_send_batch(items))

    def enqueue(
        self,
        *,
        outcome: Outcome,
        interaction_id: str | None = None,
        client_id: str | None = None,
        kept_text: str | None = None,
        accepted_chars: int | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue one event for the background batcher and return at once (never blocks).
        A plain call, not awaited: call it from the event loop's thread.

        ``occurred_at`` defaults to now, the time of this call, not of the delivery: the latest
        ``occurred_at`` wins, so an event that waited in the queue must not win over one sent
        since."""
        item = _api.feedback_item(
            outcome=outcome,
            interaction_id=interaction_id,
            client_id=client_id,
            kept_text=kept_text,
            accepted_chars=accepted_chars,
            occurred_at=_now_unless(occurred_at),
            metadata=metadata,
        )
        self.batcher.enqueue(item)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event enqueued so far was delivered, rejected or failed."""
        if self._batcher_owner is not None:
            return await self._batcher_owner.flush(timeout)
        return await self._batcher.flush(timeout) if self._batcher is not None else True

    @property
    def batcher(self) -> AsyncFeedbackBatcher:
        """The background batcher (created on first use): ``stats``, ``rejected``, ``failures``."""
        if self._batcher_owner is not None:
            return self._batcher_owner.batcher
        with self._batcher_lock:
            if self._batcher is None:
                self._batcher = AsyncFeedbackBatcher(
                    http=self._client._http, config=self._client._config, options=self._options
                )
            return self._batcher

    def _share_batcher_of(self, owner: AsyncFeedback) -> None:
        """Enqueue into ``owner``'s batcher (one queue per connection pool), and leave closing it
        to ``owner``."""
        self._batcher_owner = owner

    async def _close(self) -> None:
        if self._batcher_owner is None and self._batcher is not None:
            await self._batcher.close()


class AsyncUsers(AsyncAPIResource):
    """End users of the tenant (by your own id) and their consent to be learned from."""

    async def opt_in(self, end_user_id: str) -> EndUser:
        return await self._client._run(_api.user_opt_in(end_user_id))

    async def opt_out(self, end_user_id: str) -> EndUser:
        return await self._client._run(_api.user_opt_out(end_user_id))

    async def get(self, end_user_id: str) -> EndUser:
        return await self._client._run(_api.user_get(end_user_id))

    async def list(
        self,
        *,
        search: str | None = None,
        opted_in: bool | None = None,
        limit: int | None = None,
        offset: int | None = None,
        cursor: str | None = None,
    ) -> Page[EndUser]:
        """One page by id (``limit`` default 50, at most 500). ``search``: any part of the id, any
        case (under 3 characters: its start). Next page: ``cursor=page.next_cursor``, which costs
        what the first page does (``offset=page.next_offset`` still works, slower far in; not
        both). ``count`` stops at a cap (then ``count_capped``)."""
        return await self._client._run(
            _api.user_list(search=search, opted_in=opted_in, limit=limit, offset=offset, cursor=cursor)
        )

    async def import_(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Set many users' opt-in state: items ``{"end_user_id", "opted_in"}``; one verdict each."""
        return await self._client._run(_api.user_import(items))

    async def erase(self, end_user_id: str) -> dict[str, Any]:
        """Delete the user's interactions, feedback and history; the API's report (may be empty)."""
        return await self._client._run(_api.user_erase(end_user_id))


class AsyncEditor(AsyncAPIResource):
    """What editor plugins report (key scope ``ingest``)."""

    async def autocomplete_outcome(self, outcome: Mapping[str, Any], *, user: str | None = None) -> EditorOutcome:
        """Record an autocomplete outcome as an editor plugin posts it: Continue's event envelope
        (``{"name", "data", "schema", "level", "profileId"}``) or a bare ``AutocompleteOutcome``
        (``completionId``, ``prefix``, ``suffix``, ``completion``, ``accepted``...). Its feedback
        lands on the completion Strop served when it can be matched, else it is logged as an
        interaction of its own. ``user``: the developer (sent as ``X-Strop-User``; default the
        outcome's ``userId``, else ``uniqueId``)."""
        return await self._client._run(_api.editor_autocomplete_outcome(outcome, user=user))


class AsyncModels(AsyncAPIResource):
    async def list(self) -> builtins.list[Model]:
        """The model names the completion endpoints take: the tenant's adapters."""
        return await self._client._run(_api.model_list())


class AsyncHealthResource(AsyncAPIResource):
    async def check(self) -> Health:
        """The API is up and reaches its database (no key needed, none checked)."""
        return await self._client._run(_api.health_check())
