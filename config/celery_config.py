"""Celery's broker options and queues, built from the environment by config/settings.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kombu import Exchange, Queue


def broker_transport_options(broker_url: str, celery_dir: Path) -> dict[str, Any] | None:
    """A filesystem broker's folders under ``celery_dir`` (the embedded default), Redis's timeouts."""
    if broker_url == "filesystem://":
        for folder in ("queue", "processed", "control"):
            (celery_dir / folder).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(celery_dir / "queue"),
            "data_folder_out": str(celery_dir / "queue"),
            "processed_folder": str(celery_dir / "processed"),
            "control_folder": str(celery_dir / "control"),
            "store_processed": False,
        }
    if broker_url.startswith(("redis://", "rediss://")):
        # A request that enqueues must not wait long on a broker that is down or hung: a socket
        # operation gives up after half a second, and a publish is tried twice (the second time on
        # a fresh connection, which a restarted Redis needs), so a dead broker costs about a second
        # and the message is logged as lost (apps/common/tasks.py; the sweepers send it again).
        return {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}
    return None


def gpu_pools(spec: str) -> dict[str, str]:
    """Training pools: "pool-a:acme,globex;pool-b:initech" sends the runs of those tenants (by slug) to
    the queue gpu-pool-a or gpu-pool-b, which only that pool's gpu workers take; every other tenant's
    runs go to "gpu". Any number of gpu workers may take one queue (one per accelerator or host).
    Returns tenant slug -> queue."""
    pools: dict[str, str] = {}
    for pool_spec in filter(None, (p.strip() for p in spec.split(";"))):
        pool, _, slugs = pool_spec.partition(":")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", pool.strip()) or not slugs.strip():
            raise ValueError(f"STROP_GPU_POOLS: {pool_spec!r} is not pool-name:tenant-slug[,tenant-slug...]")
        for slug in filter(None, (s.strip() for s in slugs.split(","))):
            pools[slug] = f"gpu-{pool.strip()}"
    return pools


def task_queues(pools: dict[str, str]) -> list[Queue]:
    """Queues by workload: default (ingest follow-ups, stats), serving (vLLM loads), webhooks
    (deliveries), gpu and each pool's (training, eval). Each queue its own exchange and key: bare
    Queue(name)s all bind to the default exchange and key, and then every message lands in every queue."""
    gpu = sorted({"gpu", *pools.values()})
    return [Queue(name, Exchange(name), routing_key=name) for name in ("default", "serving", "webhooks", *gpu)]
