"""Log completions your own server made, then your users' feedback on them: one now, the rest
batched in the background (``feedback.enqueue`` never blocks your server).

    STROP_BASE_URL=http://127.0.0.1:8000 STROP_API_KEY=strop_... python sdk/examples/log_and_feedback.py

The key needs the ``ingest`` and ``feedback`` scopes. Each run logs new interactions (its client
ids carry a random run id), so it can be run again.
"""

from __future__ import annotations

import sys
import uuid
from datetime import datetime, timezone

from strop import BatcherOptions, Strop

PREFIX = "def mean(values):\n    "


def main() -> int:
    run = uuid.uuid4().hex[:8]
    # Small batches sent quickly, as an editor's server would want; the defaults suit most.
    batching = BatcherOptions(batch_size=50, flush_interval=0.5)
    with Strop(feedback_batching=batching) as client:  # STROP_BASE_URL and STROP_API_KEY
        # A completion served elsewhere, with what Strop learns from: the tokens and their logprobs.
        first = client.interactions.log(
            client_id=f"example-{run}-0",
            prefix=PREFIX,
            suffix="\n",
            completion="return sum(values) / len(values)",
            completion_token_ids=[689, 2629, 20103, 8, 608, 2422, 20103, 8],
            completion_logprobs=[-0.05, -0.3, -0.1, -0.02, -0.4, -0.2, -0.1, -0.02],
            model="my-model-v3",
            end_user_id="dev-1",
            opted_in=True,
            served_at=datetime.now(timezone.utc),
            latency_ms=38,
            metadata={"language": "python"},
        )
        print(f"logged interaction {first.id} (client id {first.client_id}, created {first.created})")

        # Many at once: one verdict per item.
        suggestions = ["return statistics.mean(values)", "total = 0", ""]
        items = [
            {"client_id": f"example-{run}-{n}", "prefix": PREFIX, "completion": text, "end_user_id": "dev-2"}
            for n, text in enumerate(suggestions, start=1)
        ]
        batch = client.interactions.log_batch(items)
        print(f"logged a batch of {len(batch.results)}: {batch.counts}")

        # Feedback now (the answer says it was recorded)...
        sent = client.feedback.send(interaction_id=first.id, outcome="accepted")
        print(f"feedback on {first.client_id}: accepted, {sent.status}")

        # ...or queued, by your own client ids, and sent in batches by a background thread.
        outcomes = [("rejected", None), ("edited", "total = 0.0"), ("not_shown", None)]
        for n, (outcome, kept_text) in enumerate(outcomes, start=1):
            client.feedback.enqueue(client_id=f"example-{run}-{n}", outcome=outcome, kept_text=kept_text)
            print(f"queued feedback on example-{run}-{n}: {outcome}")
        delivered = client.feedback.flush(timeout=30)
        stats = client.feedback.batcher.stats
        print(
            f"queued feedback: {stats.delivered} delivered, {stats.rejected} rejected, {stats.failed} failed, "
            f"{stats.dropped} dropped"
        )
        return 0 if delivered and stats.delivered == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
