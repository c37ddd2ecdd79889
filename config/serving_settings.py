"""The serving path's settings (apps.serving.admission, apps.serving.sync_work, config/asgi.py; the
process model in docs/operate.md). config/settings.py imports them."""

from __future__ import annotations

import os

from config.env import env_int

__all__ = [
    "STROP_API_SYNC_THREADS",
    "STROP_SERVING_DB_THREADS",
    "STROP_SERVING_MAX_IN_FLIGHT",
    "STROP_SERVING_MAX_STREAMS_PER_TENANT",
    "STROP_SERVING_RECORD_EVERY_S",
    "STROP_SERVING_STALE_STREAM_S",
    "STROP_SERVING_STREAM_LEASE_S",
]

# Completions one API process serves at once, streamed or not; past it 503 server_busy. Capped at the
# connections of the process's pool to vLLM (apps.engines.vllm_transport.ASYNC_MAX_CONNECTIONS, 2048).
STROP_SERVING_MAX_IN_FLIGHT = int(os.environ.get("STROP_SERVING_MAX_IN_FLIGHT", "1024"))
# A tenant's streams at once over every API process; past it 429 too_many_streams (0: no cap).
STROP_SERVING_MAX_STREAMS_PER_TENANT = int(os.environ.get("STROP_SERVING_MAX_STREAMS_PER_TENANT", "256"))
# How long a stream's lease outlives a process that died without returning it.
STROP_SERVING_STREAM_LEASE_S = float(os.environ.get("STROP_SERVING_STREAM_LEASE_S", "600"))
# An open stream's parts (what it served since the last write) are written at most this often, so a
# worker killed outright loses only what its streams served since (apps.serving.stream_record).
STROP_SERVING_RECORD_EVERY_S = float(os.environ.get("STROP_SERVING_RECORD_EVERY_S", "0.5"))
# A stream whose parts nobody wrote for this long lost its worker: the sweeper records it as a partial
# interaction (apps.interactions.stream_parts).
STROP_SERVING_STALE_STREAM_S = float(os.environ.get("STROP_SERVING_STALE_STREAM_S", "120"))
# Threads a process gives the serving path's database work (each keeps its connection).
STROP_SERVING_DB_THREADS = env_int(
    "STROP_SERVING_DB_THREADS", 8, minimum=1, hint="at least 1: every completion's database work runs on these threads"
)
# Threads a process gives the rest of the API and the dashboard (synchronous views), each with its
# own database connection: a request holds one for its whole length, as a gthread worker's thread.
STROP_API_SYNC_THREADS = env_int(
    "STROP_API_SYNC_THREADS", 4, minimum=1, hint="at least 1: every request but a completion runs on these threads"
)
