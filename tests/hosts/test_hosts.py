"""One learning round across separate hosts that share no filesystem (``make test-hosts``).

The API (with its default and serving workers), the gpu worker and a vLLM replica each run on a host
of their own (tests/hosts/netns.py: a network namespace and a private filesystem each), reaching
only Postgres, Redis and the object store over the network. Feedback sent to the API trains a
version on the gpu host, which uploads it to the object store; the replica fetches it, loads it and
answers with it. Then a second replica, started fresh on a new host and reached through a second API
host, serves the tenant's current version after fetching it itself.

The object store is moto's server mode, the stand-in for S3 that nothing here provides.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from apps.adapters.models import AdapterVersion, BaseModel
from apps.adapters.services import adapter_create, base_model_register
from apps.tenants.services import ALL_SCOPES, api_key_create, tenant_create
from apps.training.models import TrainingPolicy, TrainingRun
from benchmarks.common import free_port, gunicorn_argv, stop
from tests.fixtures.object_store import start_object_store
from tests.fixtures.services import tail
from tests.fixtures.vllm import SESSION_API_KEY, _ensure_vllm_venv
from tests.fixtures.workers import CPU_QUEUES, wait_until, worker_argv
from tests.hosts.netns import HOST_ROOT, MODEL_PATH, REPO_ROOT, Host, Network, can_make_hosts

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

PORT = 8000
TERMINAL = ("candidate", "rejected", "failed")


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(condition, *, timeout: float, what: str, logs: list[Path]) -> object:  # noqa: ANN001
    """wait_until, failing with the tails of the hosts' logs (the test's folder may be gone by then)."""
    try:
        return wait_until(condition, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(f"--- {p.name}\n{tail(p)}" for p in logs)) from None


def _start_vllm(host: Host, env: dict[str, str], log: Path) -> None:
    host.start(
        ["bash", "platform/vllm.sh", str(MODEL_PATH)],
        env={
            **env,
            "VLLM_PORT": str(PORT),
            "VLLM_BIND_HOST": host.address,
            "VLLM_SERVED_MODEL_NAME": "base",
            "VLLM_MAX_LORAS": "4",
            "VLLM_MAX_CPU_LORAS": "16",
            "VLLM_MAX_MODEL_LEN": "1024",
            "VLLM_KV_CACHE_BYTES": "256M",
        },
        log=log,
    )


def _start_api(host: Host, env: dict[str, str], log: Path) -> None:
    host.start(gunicorn_argv(f"{host.address}:{PORT}", 1), env=env, log=log)


def test_a_round_runs_across_hosts_that_share_no_filesystem(settings, tiny_starter_model, tmp_path, capsys):
    reason = can_make_hosts()
    if reason:
        pytest.skip(reason)
    from config.celery import app

    _ensure_vllm_venv()
    app.control.purge()
    times: dict[str, float] = {}

    def logs_of(*names: str) -> list[Path]:
        return [tmp_path / f"{name}.log" for name in names] + ([tmp_path / "api-workers.log"] if "api" in names else [])

    net = Network(model_dir=tiny_starter_model)
    forwarder = None
    moto = None
    try:
        # The shared services: Postgres and Redis (forwarded from loopback), and the object store.
        db = settings.DATABASES["default"]
        redis_url = settings.REDIS_URL
        redis_port, redis_db = re.match(r"redis://[^:/]+:(\d+)/(\d+)", redis_url).groups()
        pg_port = str(db["PORT"] or 5432)
        forwarder = subprocess.Popen(
            [sys.executable, "-m", "tests.hosts.forward",
             f"{net.gateway}:{pg_port}=127.0.0.1:{pg_port}", f"{net.gateway}:{redis_port}=127.0.0.1:{redis_port}"],
            cwd=REPO_ROOT, stdout=(tmp_path / "forward.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(lambda: _listening(net.gateway, int(pg_port)), timeout=30, what="the port forwarder")
        moto, store = start_object_store(tmp_path / "moto.log", host=net.gateway, port=free_port())
        bucket = store.new_bucket("strop-hosts")
        store_url = f"s3://{bucket}/adapters"
        for name, value in store.env(store_url).items():
            setattr(settings, name, value)

        # The tenant, as an operator and a tenant admin would set it up; the base model sits at the
        # same path on every host that needs it.
        tenant = tenant_create(name="Hosts", slug=f"hosts-{uuid.uuid4().hex[:6]}")
        base_model_register(name="base", path=tiny_starter_model)
        BaseModel.objects.filter(name="base").update(path=str(MODEL_PATH))
        adapter = adapter_create(tenant, name="tab", base_model=BaseModel.objects.get(name="base"), is_default=True)
        TrainingPolicy.objects.create(
            tenant=tenant, adapter=adapter, min_new_events=12, heldout_fraction=0.25,
            trainer_overrides={"epochs": 1, "num_minibatches": 2},
        )  # fmt: skip
        raw_key = api_key_create(tenant, name="hosts", scopes=list(ALL_SCOPES)).raw_key

        vllm_1, api, gpu = net.add_host("vllm-1"), net.add_host("api"), net.add_host("gpu")
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("STROP_", "DATABASE_", "REDIS_", "VLLM_"))}
        env = {
            **keep,
            **store.env(store_url),
            "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{net.gateway}:{pg_port}/{db['NAME']}",
            "REDIS_URL": f"redis://{net.gateway}:{redis_port}/{redis_db}",
            "VLLM_BASE_URLS": f"http://{vllm_1.address}:{PORT}",
            "VLLM_API_KEY": SESSION_API_KEY,
            "VLLM_MAX_LORA_RANK": "16",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONPATH": str(REPO_ROOT),
            "TRAINING_HEARTBEAT_S": "1",
            "TRAINER_CPU_THREADS": "1",
            "LOG_FORMAT": "plain",
            "ALLOWED_HOSTS": ",".join(str(net.subnet.network_address + i) for i in range(2, 12)),
        }
        started = time.monotonic()
        _start_vllm(vllm_1, env, tmp_path / "vllm-1.log")
        _start_api(api, env, tmp_path / "api.log")
        api_workers = worker_argv("default", CPU_QUEUES, "threads", concurrency=1)
        api.start(api_workers, env=env, log=tmp_path / "api-workers.log")
        gpu.start(worker_argv("gpu", "gpu", "prefork", concurrency=1), env=env, log=tmp_path / "gpu.log")
        _wait(
            lambda: _healthy(f"http://{api.address}:{PORT}/health"),
            timeout=180,
            what="the API host",
            logs=logs_of("api"),
        )
        _wait(
            lambda: _healthy(f"http://{vllm_1.address}:{PORT}/health"),
            timeout=300,
            what="vLLM on vllm-1",
            logs=logs_of("vllm-1"),
        )
        times["hosts up"] = time.monotonic() - started

        # Feedback through the API host, from opted-in users.
        client = httpx.Client(
            base_url=f"http://{api.address}:{PORT}", headers={"Authorization": f"Bearer {raw_key}"}, timeout=120
        )
        started = time.monotonic()
        ids = []
        for i in range(12):
            body = {"prompt": f"def f{i}(x):\n    ", "max_tokens": 6, "user": f"dev-{i % 4}", "opted_in": True}
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, (answer.text, tail(tmp_path / "api.log"))
            ids.append(answer.json()["id"])
        for k, interaction_id in enumerate(ids):
            outcome = "accepted" if k % 3 == 0 else "rejected"
            sent = client.post("/v1/feedback", json={"interaction_id": interaction_id, "outcome": outcome})
            assert sent.status_code == 200, sent.text
        times["serve + feedback"] = time.monotonic() - started

        def finished() -> TrainingRun | None:
            return TrainingRun.objects.filter(adapter=adapter, status__in=TERMINAL).first()

        run = _wait(
            finished, timeout=600, what="the round's training run", logs=logs_of("gpu", "api-workers", "vllm-1")
        )
        run.refresh_from_db()
        assert run.status == "candidate", (run.error, run.gate, tail(tmp_path / "gpu.log"))
        times["feedback to candidate"] = time.monotonic() - started
        for stage in ("export", "train", "gate", "probe", "upload", "load"):
            times[stage] = float(run.stage_seconds.get(stage, 0.0))
        version = run.output_version
        assert version.artifact_path == f"{store_url}/{version.vllm_name}" and version.loaded_at is not None
        vllm_log = (tmp_path / "vllm-1.log").read_text(errors="replace")
        fetched = re.search(rf"fetched adapter {re.escape(version.vllm_name)} .* in ([0-9.]+) s", vllm_log)
        assert fetched, tail(tmp_path / "vllm-1.log")
        times["replica fetch"] = float(fetched.group(1))

        started = time.monotonic()
        assert client.post(f"/v1/adapters/tab/versions/{version.number}/promote").status_code == 200
        answer = client.post("/v1/completions", json={"prompt": "def g(x):\n    ", "max_tokens": 6})
        assert answer.status_code == 200 and answer.json()["strop"]["version"] == version.vllm_name
        times["promote + first answer"] = time.monotonic() - started

        # A second replica on a new host, reached through a second API host: it has never been told
        # about the version, and serves it after fetching it from the store itself (its first 404
        # makes Strop load it there, with the digest the replica checks the fetched files against).
        vllm_2, api_2 = net.add_host("vllm-2"), net.add_host("api-2")
        env_2 = {**env, "VLLM_BASE_URLS": f"http://{vllm_2.address}:{PORT}"}
        started = time.monotonic()
        _start_vllm(vllm_2, env_2, tmp_path / "vllm-2.log")
        _start_api(api_2, env_2, tmp_path / "api-2.log")
        _wait(
            lambda: _healthy(f"http://{vllm_2.address}:{PORT}/health"),
            timeout=300,
            what="vLLM on vllm-2",
            logs=logs_of("vllm-2"),
        )
        _wait(
            lambda: _healthy(f"http://{api_2.address}:{PORT}/health"),
            timeout=180,
            what="the second API host",
            logs=logs_of("api-2"),
        )
        times["fresh replica up"] = time.monotonic() - started
        asked = time.monotonic()
        client_2 = httpx.Client(
            base_url=f"http://{api_2.address}:{PORT}", headers={"Authorization": f"Bearer {raw_key}"}, timeout=120
        )
        answer = client_2.post("/v1/completions", json={"prompt": "def h(x):\n    ", "max_tokens": 6})
        assert answer.status_code == 200, (answer.text, tail(tmp_path / "vllm-2.log"))
        assert answer.json()["strop"]["version"] == version.vllm_name
        times["fresh replica first answer"] = time.monotonic() - asked
        vllm_log = (tmp_path / "vllm-2.log").read_text(errors="replace")
        fetched = re.search(rf"fetched adapter {re.escape(version.vllm_name)} .* in ([0-9.]+) s", vllm_log)
        assert fetched, tail(tmp_path / "vllm-2.log")  # by the replica itself, on the first request
        times["fresh replica fetch"] = float(fetched.group(1))
        times["fresh replica start to first answer"] = time.monotonic() - started

        # Nothing any host wrote is visible outside it: the hosts' private roots are empty here.
        assert not any(HOST_ROOT.iterdir())
        assert AdapterVersion.objects.filter(pk=version.pk, artifact_path__startswith="s3://").exists()
        with capsys.disabled():
            print(f"\nhosts: {len(net.hosts)}, shared filesystem: none, round: ok")
            for stage, seconds in times.items():
                print(f"  {stage}: {seconds:.1f} s")
    finally:
        net.destroy()
        if forwarder is not None:
            forwarder.terminate()
        if moto is not None:
            stop(moto)
        app.control.purge()
