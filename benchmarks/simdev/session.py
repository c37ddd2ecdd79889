"""Simulated developers at work, through the Python SDK only.

Each task is served by ``client.completions.create(prefix, suffix, ...)`` for an opted-in end
user; the population's developer decides accepted / partial / edited / rejected / not_shown
(``developers.respond``, with the characters taken or the text kept), and the feedback goes back
in batches through ``client.feedback.send_batch``. By default no stop string is sent: where to
stop, and whether to say anything at all, is then what the policy has to learn, ``max_tokens``
caps it. A session may send ``stop`` strings as an editor does (a single-line client stops at
the end of the line); whether to say anything at all is still the policy's to learn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from strop import Strop
from tqdm import tqdm

from .developers import REWARDS, Decision, Outcome, respond
from .stats import Estimate, mean_interval, wilson
from .tasks import Population, Task
from .traits import with_propensity

FEEDBACK_BATCH = 500  # events per send_batch call (the API takes up to 1000)


@dataclass(frozen=True)
class Request:
    """One served suggestion and what the developer did with it."""

    index: int  # the task's place in the session
    task_id: str
    interaction_id: str
    version: str  # the adapter version that answered (``completion.strop.version``)
    user: str
    text: str
    finish_reason: str | None
    outcome: Outcome
    latency_s: float
    accepted_chars: int | None = None  # partial: the characters taken word by word
    kept_text: str | None = None  # edited: the text left where the suggestion went
    accepted_text_chars: int = 0  # characters put in the file at the accept (simdev.persistence)
    retained_chars: int = 0  # of them, still there 10 minutes later

    @classmethod
    def decided(cls, decision: Decision, **fields: Any) -> Request:
        """A request with what the developer did (``developers.respond``)."""
        return cls(
            outcome=decision.outcome,
            accepted_chars=decision.accepted_chars,
            kept_text=decision.kept_text,
            accepted_text_chars=decision.accepted_text_chars,
            retained_chars=decision.retained_chars,
            **fields,
        )

    def decision(self) -> Decision:
        return Decision(self.outcome, self.accepted_chars, self.kept_text)

    @property
    def shown(self) -> bool:
        return self.outcome != "not_shown"

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"

    @property
    def reward(self) -> float:
        return REWARDS[self.outcome]


@dataclass(frozen=True)
class Summary:
    """Figures over a set of requests, each with its 95 % interval: proportions by Wilson
    (accept rate of shown suggestions, shown per request, accepted per request: a request
    shows at most one suggestion), the mean reward per request by the normal approximation."""

    requests: int
    shown: int
    accepted: int
    accept_rate: Estimate  # accepted / shown
    shown_per_request: Estimate
    accepted_per_request: Estimate
    mean_reward: Estimate  # +0.75 accepted, -0.25 rejected, 0 not shown, +0.25 taken in part or fixed
    partial: int = 0  # shown and taken in part, word by word
    edited: int = 0  # shown, accepted and fixed
    retained_chars_per_request: Estimate = Estimate(0.0, 0.0, 0.0, 0)  # characters still there at 10 min
    retained_share: float = 0.0  # retained of the characters accepted (0 when none were)

    def __str__(self) -> str:
        return (
            f"{self.requests} requests, {self.shown} shown, {self.accepted} accepted; "
            f"accept rate of shown {self.accept_rate}; shown/request {self.shown_per_request}; "
            f"accepted/request {self.accepted_per_request}; reward/request {self.mean_reward}"
        )


def summarise(requests: Sequence[Request]) -> Summary:
    shown = sum(r.shown for r in requests)
    accepted = sum(r.accepted for r in requests)
    return Summary(
        requests=len(requests),
        shown=shown,
        accepted=accepted,
        accept_rate=wilson(accepted, shown),
        shown_per_request=wilson(shown, len(requests)),
        accepted_per_request=wilson(accepted, len(requests)),
        mean_reward=mean_interval([r.reward for r in requests]),
        partial=sum(r.outcome == "partial" for r in requests),
        edited=sum(r.outcome == "edited" for r in requests),
        retained_chars_per_request=mean_interval([r.retained_chars for r in requests]),
        retained_share=sum(r.retained_chars for r in requests) / max(1, sum(r.accepted_text_chars for r in requests)),
    )


@dataclass
class SessionResult:
    population: Population
    requests: list[Request] = field(default_factory=list)  # in task order
    feedback_recorded: int = 0  # events the API recorded (0 when the session sent none)

    def summary(self) -> Summary:
        return summarise(self.requests)

    def by_version(self) -> dict[str, Summary]:
        versions = sorted({r.version for r in self.requests})
        return {v: summarise([r for r in self.requests if r.version == v]) for v in versions}

    def feedback_items(self) -> list[dict[str, Any]]:
        """One feedback event per request, in the API's batch shape."""
        return [
            {
                "interaction_id": r.interaction_id,
                **r.decision().feedback(),
                "metadata": {"population": self.population, "task": r.task_id},
            }
            for r in self.requests
        ]


class FeedbackRefused(RuntimeError):
    """The API refused feedback events the session sent (it never should)."""


def deliver_feedback(client: Strop, items: Sequence[dict[str, Any]], *, batch_size: int = FEEDBACK_BATCH) -> int:
    """Send ``items`` with ``client.feedback.send_batch`` in batches; returns how many the API
    recorded. Raises :class:`FeedbackRefused` naming the first refused event."""
    recorded = 0
    for start in range(0, len(items), batch_size):
        result = client.feedback.send_batch(items[start : start + batch_size])
        if result.rejected:
            first = result.rejected[0]
            raise FeedbackRefused(f"{len(result.rejected)} feedback events refused, e.g. #{first.index}: {first.error}")
        recorded += result.counts.get("recorded", 0)
    return recorded


def run_session(
    client: Strop,
    tasks: Sequence[Task],
    population: Population,
    *,
    users: Sequence[str],
    model: str | None = None,
    max_tokens: int = 32,
    stop: Sequence[str] | None = None,
    temperature: float = 1.0,
    seed: int | None = 0,
    concurrency: int = 4,
    opted_in: bool = True,
    send_feedback: bool = True,
    progress: str | None = None,
    traits: bool = False,
) -> SessionResult:
    """Serve every task for ``users`` (task i goes to ``users[i % len(users)]``), decide each
    suggestion as ``population`` would, and (``send_feedback``) send one event per request.

    ``stop`` is sent as a client sends it (a single-line client stops at "\\n").
    At most ``concurrency`` completions are in flight. Request i is sampled with ``seed + i``
    (None: unseeded). ``progress`` labels a tqdm bar. Raises the SDK's error if a completion
    fails (after the SDK's own retries); no feedback is sent then. ``traits``: each developer
    takes a suggestion they would accept with their own propensity (``simdev.traits``).
    """
    if not users:
        raise ValueError("users: at least one end user id")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    result = SessionResult(population=population)
    done: dict[int, Request] = {}
    lock = threading.Lock()
    bar = tqdm(total=len(tasks), desc=progress, unit="req", disable=progress is None)

    def serve(index: int) -> None:
        task, user = tasks[index], users[index % len(users)]
        started = time.monotonic()
        completion = client.completions.create(
            model=model,
            prefix=task.prefix,
            suffix=task.suffix_for(population),
            max_tokens=max_tokens,
            stop=stop,
            temperature=temperature,
            seed=None if seed is None else seed + index,
            user=user,
            opted_in=opted_in,
        )
        choice = completion.choices[0]
        decision = respond(population, choice.text, task)
        if traits:
            decision = with_propensity(decision, user=user, request_key=f"{task.id}:{index}")
        request = Request.decided(
            decision,
            index=index,
            task_id=task.id,
            interaction_id=completion.id,
            version=completion.strop.version or "",
            user=user,
            text=choice.text,
            finish_reason=choice.finish_reason,
            latency_s=time.monotonic() - started,
        )
        with lock:
            done[index] = request
            bar.update(1)
            shown = sum(r.shown for r in done.values())
            bar.set_postfix(shown=shown, accepted=sum(r.accepted for r in done.values()), refresh=False)

    with bar, ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(serve, index) for index in range(len(tasks))]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in finished if f.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            raise failed.exception()  # type: ignore[misc]
    result.requests = [done[index] for index in range(len(tasks))]
    if send_feedback:
        result.feedback_recorded = deliver_feedback(client, result.feedback_items())
    return result
