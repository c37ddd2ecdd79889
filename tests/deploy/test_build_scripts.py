"""The images' build and run scripts, run here on the bare machine as the Dockerfiles run them:
the static files (npm only at build time, WhiteNoise serving them after), the entry point, the
health checks, the adapter store's bucket, the CUDA lock, and the release tags build-images.sh gives."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.deploy.layout import COMPOSE, COMPOSE_GPU, DOCKER, ROOT, compose, pyproject_version
from tests.fixtures.workers import wait_until
from tests.test_deploy_settings import bare_env


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def with_venv_on_path(env: dict[str, str]) -> dict[str, str]:
    """As in the image: Strop's environment first on PATH (python, celery, gunicorn)."""
    return {**env, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """build-static.sh all, into a folder of its own (var/vendor from `make assets` is reused)."""
    out = tmp_path_factory.mktemp("static")
    done = run(["bash", str(DOCKER / "build-static.sh"), "all", str(out)], {**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_static_build_writes_the_vendored_libraries_and_every_static_file(static_dir):
    assert sorted(p.name for p in static_dir.iterdir()) == ["staticfiles", "vendor"]
    collected = static_dir / "staticfiles"
    for library in ("htmx.min.js", "axe.min.js"):
        assert (static_dir / "vendor" / "static" / library).stat().st_size > 10_000
        assert (collected / "vendor" / library).read_bytes() == (
            static_dir / "vendor" / "static" / library
        ).read_bytes()
        assert (collected / "vendor" / f"{library}.gz").is_file(), "WhiteNoise's compressed copy"
    own = [p for p in ROOT.glob("apps/*/static/**/*") if p.is_file()]
    assert own
    for path in own:
        relative = path.relative_to(next(parent for parent in path.parents if parent.name == "static"))
        assert (collected / relative).is_file(), relative
    assert (collected / "admin" / "css" / "base.css").is_file()
    assert list(collected.glob("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"))


def test_the_static_build_leaves_no_secret_behind(static_dir):
    names = [p.name.lower() for p in static_dir.rglob("*")]
    assert not [n for n in names if "secret" in n or "pepper" in n or "mark_key" in n]


def test_whitenoise_serves_the_built_files_with_no_vendored_folder_at_run_time(static_dir, tmp_path):
    """The image's case: the files come from STATIC_ROOT, built ahead; nothing to fetch or find."""
    empty_vendor = tmp_path / "no-vendor"
    empty_vendor.mkdir()
    env = bare_env(
        tmp_path,
        STROP_VAR_DIR=str(static_dir),
        STROP_VENDOR_STATIC_DIR=str(empty_vendor),
        CELERY_BROKER_URL="memory://",
        SECRET_KEY=os.environ["SECRET_KEY"],
        API_KEY_PEPPER=os.environ["API_KEY_PEPPER"],
        ERASURE_MARK_KEY=os.environ["ERASURE_MARK_KEY"],
        STORED_SECRETS_KEY=os.environ["STORED_SECRETS_KEY"],
    )
    code = (
        "import django; django.setup(); from django.test import Client; "
        "r = Client().get('/static/vendor/htmx.min.js', HTTP_ACCEPT_ENCODING='gzip'); "
        "print(r.status_code, r.get('Content-Encoding'), r.get('Content-Type'))"
    )
    done = run([sys.executable, "-c", code], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "gzip", "text/javascript;", 'charset="utf-8"']
    assert sorted(p.name for p in static_dir.iterdir()) == ["staticfiles", "vendor"]


def test_the_entry_point_runs_a_procfile_line_with_its_variables_and_arguments(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text("# a comment: names no process\nhello: echo hello ${GREETING:-world} from $PWD\n")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "counter_123.db").write_bytes(b"stale")
    env = with_venv_on_path(
        bare_env(tmp_path, STROP_PROCFILE=str(procfile), GREETING="there", PROMETHEUS_MULTIPROC_DIR=str(metrics))
    )
    done = run(["bash", str(DOCKER / "entrypoint.sh"), "hello", "and", "more"], env)
    assert (done.returncode, done.stdout) == (0, f"hello there from {ROOT} and more\n"), done.stderr
    assert list(metrics.iterdir()) == [], "a stale metrics file of an earlier start is gone"


def test_the_entry_point_runs_manage_and_any_other_command(tmp_path):
    env = with_venv_on_path(bare_env(tmp_path))
    done = run(["bash", str(DOCKER / "entrypoint.sh"), "manage", "--version"], env)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"5\.2\.\d+\n", done.stdout)
    done = run(["bash", str(DOCKER / "entrypoint.sh"), "echo", "as given"], env)
    assert (done.returncode, done.stdout) == (0, "as given\n")


def test_the_api_runs_from_its_procfile_line_and_passes_the_image_health_check(tmp_path):
    """entrypoint.sh api on the embedded default: the Procfile's gunicorn line, exec'd (the container's
    signals reach gunicorn itself), answering the image's liveness check with a Host it allows."""
    from benchmarks.common import free_port

    port = free_port()
    env = with_venv_on_path(
        bare_env(tmp_path, API_BIND=f"127.0.0.1:{port}", API_WORKERS="1", ALLOWED_HOSTS="strop.example.com")
    )
    with (tmp_path / "api.log").open("wb") as log:
        api = subprocess.Popen(
            ["bash", str(DOCKER / "entrypoint.sh"), "api"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: (
                healthcheck(
                    tmp_path, "http", "/health", "API_BIND", API_BIND=env["API_BIND"], ALLOWED_HOSTS="strop.example.com"
                ).returncode
                == 0
                or api.poll() is not None
            ),
            timeout=90,
            what="the API started by entrypoint.sh to pass its health check",
        )
        assert api.poll() is None, (tmp_path / "api.log").read_text()
        assert "gunicorn" in Path(f"/proc/{api.pid}/cmdline").read_text()
        api.send_signal(signal.SIGTERM)
        assert api.wait(timeout=30) == 0
    finally:
        if api.poll() is None:
            os.killpg(api.pid, signal.SIGKILL)
            api.wait()


class Probe(BaseHTTPRequestHandler):
    """/health 200, /health/ready 503, /moved 301; remembers the headers of the last request."""

    seen: dict[str, str] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Probe.seen = dict(self.headers)
        status = {"/health": 200, "/health/ready": 503, "/moved": 301}.get(self.path, 404)
        self.send_response(status)
        if status == 301:
            self.send_header("Location", "https://strop.example.com/moved")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def probe_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Probe)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def healthcheck(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(DOCKER / "healthcheck.py"), *args], bare_env(tmp_path, **env), timeout=30)


def test_the_http_check_passes_on_200_with_a_host_the_api_allows_and_the_proxy_header(tmp_path, probe_port):
    done = healthcheck(
        tmp_path,
        "http",
        "/health",
        str(probe_port),
        ALLOWED_HOSTS=".strop.example.com,localhost",
        SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https",
    )
    assert (done.returncode, done.stdout) == (0, "healthy\n")
    assert Probe.seen["Host"] == "strop.example.com"
    assert Probe.seen["X-Forwarded-Proto"] == "https"


def test_the_http_check_reads_the_port_from_a_variable(tmp_path, probe_port):
    assert healthcheck(tmp_path, "http", "/health", API_BIND=f"0.0.0.0:{probe_port}").returncode == 0
    assert healthcheck(tmp_path, "http", "/health", "VLLM_PORT", VLLM_PORT=str(probe_port)).returncode == 0


@pytest.mark.parametrize("path", ["/health/ready", "/moved", "/missing"])
def test_the_http_check_fails_on_anything_but_200(tmp_path, probe_port, path):
    done = healthcheck(tmp_path, "http", path, str(probe_port))
    assert done.returncode == 1
    assert done.stdout.startswith(f"unhealthy: GET {path} on port {probe_port} answered")


def test_the_http_check_fails_when_nothing_listens(tmp_path):
    from benchmarks.common import free_port

    done = healthcheck(tmp_path, "http", "/health", str(free_port()))
    assert done.returncode == 1 and done.stdout.startswith("unhealthy: GET /health")


def test_the_broker_check_pings_redis(tmp_path):
    assert healthcheck(tmp_path, "broker", REDIS_URL=os.environ["REDIS_URL"]).returncode == 0
    done = healthcheck(tmp_path, "broker", REDIS_URL="redis://127.0.0.1:1/0")
    assert done.returncode == 1 and done.stdout.startswith("unhealthy: the broker does not answer PING")


def test_store_init_creates_the_bucket_with_versioning_and_can_run_again(tmp_path, object_store):
    bucket = f"strop-deploy-{os.urandom(4).hex()}"
    env = bare_env(tmp_path, **object_store.env(f"s3://{bucket}/adapters"))
    first = run([sys.executable, str(DOCKER / "create-bucket.py")], env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.strip().endswith(f"bucket {bucket} created, versioning on")
    assert object_store.client().get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    again = run([sys.executable, str(DOCKER / "create-bucket.py")], env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.strip().endswith(f"bucket {bucket} already there, versioning on")


def pins(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith(("#", "-e "))]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.+-]+", line) for line in lines), path.name
    return {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower(): line.split("==")[1] for line in lines}


def test_the_cuda_lock_pins_the_torch_of_requirements_lock_and_nothing_it_pins_again():
    lock, cuda = pins(ROOT / "requirements.lock"), pins(ROOT / "requirements-cuda.lock")
    assert cuda["torch"] == lock["torch"] == "2.13.0"
    assert set(cuda) & set(lock) == {"torch"}
    assert {"triton", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= set(cuda)


def build_images(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = bare_env(tmp_path, DRY_RUN="1")
    return run(["bash", str(DOCKER / "build-images.sh"), *args], env)


def this_commit() -> str:
    git = ["git", "-C", str(ROOT)]
    short = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--"], check=False).returncode != 0
    return short.stdout.strip() + ("-dirty" if dirty else "")


@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_build_images_tags_both_images_with_the_release_and_the_commit_that_compose_runs(tmp_path, variant):
    done = build_images(tmp_path, variant)
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    version, commit = pyproject_version(), this_commit()
    built = {}
    for command in commands:
        assert command[:2] == ["docker", "build"] and command[-1] == ".", command
        dockerfile = command[command.index("-f") + 1]
        tags = [command[i + 1] for i, word in enumerate(command) if word == "-t"]
        built[dockerfile] = (command[command.index("--build-arg") + 1], tags)
    assert built == {
        "platform/docker/app.Dockerfile": (
            f"TORCH_VARIANT={variant}",
            [f"strop-app:{version}-{variant}", f"strop-app:{version}-{commit}-{variant}"],
        ),
        "platform/docker/vllm.Dockerfile": (
            f"VLLM_VARIANT={variant}",
            [f"strop-vllm:{version}-{variant}", f"strop-vllm:{version}-{commit}-{variant}"],
        ),
    }
    # What compose runs when STROP_VERSION is unset, or set to the commit's tag (the override for cuda).
    services = compose(COMPOSE if variant == "cpu" else COMPOSE_GPU)["services"]
    for service, dockerfile in {"api": "app", "vllm": "vllm"}.items():
        if service not in services:
            continue
        tags = built[f"platform/docker/{dockerfile}.Dockerfile"][1]
        for value, tag in ((version, tags[0]), (f"{version}-{commit}", tags[1])):
            assert services[service]["image"].replace(f"${{STROP_VERSION:-{version}}}", value) == tag


def test_build_images_refuses_a_variant_it_does_not_know(tmp_path):
    done = build_images(tmp_path, "rocm")
    assert (done.returncode, done.stdout) == (2, "")
    assert "usage: platform/docker/build-images.sh [cpu|cuda]" in done.stderr
