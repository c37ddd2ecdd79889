"""Serve a completion through Strop (your tenant's adapter on vLLM), show it, send the user's
feedback on it (what Strop learns from), and read the recorded interaction back.

    STROP_BASE_URL=http://127.0.0.1:8000 STROP_API_KEY=strop_... python sdk/examples/serve_through_strop.py

The key needs the ``serve``, ``feedback`` and ``ingest`` scopes (``ingest`` to read the interaction
back); the tenant needs a default adapter.
"""

from __future__ import annotations

import sys

from strop import Strop


def main() -> int:
    with Strop() as client:  # STROP_BASE_URL and STROP_API_KEY
        print(f"models: {', '.join(model.id for model in client.models.list())}")
        completion = client.completions.create(
            prefix="def add(a, b):\n    ",
            suffix="\n",
            max_tokens=16,
            temperature=0.2,
            stop=["\n\n"],
            user="dev-42",  # your end user: cohorts and experiments go by it
            opted_in=True,  # they agreed to be learned from
        )
        print(f"completion {completion.id} from {completion.strop.version}: {completion.text!r}")

        # An empty suggestion is a real answer, but nothing was shown: say so.
        outcome = "accepted" if completion.text.strip() else "not_shown"
        result = client.feedback.send(interaction_id=completion.id, outcome=outcome)
        print(f"feedback on {completion.id}: {outcome}, {result.status}")

        stored = client.interactions.get(completion.id)
        recorded = stored.feedback.outcome if stored.feedback else None
        print(f"Strop holds it: source {stored.source}, user {stored.end_user_id}, feedback {recorded}")
        return 0 if recorded == outcome else 1


if __name__ == "__main__":
    sys.exit(main())
