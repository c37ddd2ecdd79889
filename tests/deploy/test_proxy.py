"""platform/nginx-strop.conf, the TLS proxy example in front of the API and the dashboard: the Strop
settings it documents are ones Strop reads, with the values that match what the proxy sends; it
reaches the port compose publishes, allows at least the bodies the API allows, and does not buffer
server-sent events. Where nginx is installed, the file passes `nginx -t` and is run: the client's own
X-Forwarded-Proto is replaced, its X-Forwarded-For is appended to so that Strop's hop count finds the
real address, and an event reaches the client before the answer ends."""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import RequestFactory, override_settings

from apps.dashboard.login_throttle import client_address
from tests.deploy.layout import ROOT, compose
from tests.fixtures.workers import wait_until
from tests.test_env_example import settings_read

PROXY = ROOT / "platform" / "nginx-strop.conf"
UNLOGGED = r"^/(dashboard/invite|dashboard/password/reset|v1/users)/"
NGINX = shutil.which("nginx")
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (make browser installs nginx-light)")


def documented_settings() -> dict[str, str]:
    """The Strop settings the file's opening comment says to put in compose.env."""
    return dict(re.findall(r"^#   ([A-Z][A-Z0-9_]+)=(\S+)$", PROXY.read_text(), re.MULTILINE))


def directives(text: str) -> list[tuple[str, list[str], tuple[str, ...]]]:
    """Every directive as (name, arguments, the blocks it is in), comments dropped."""
    found, blocks = [], []
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    for token in re.findall(r"[^;{}]+[;{]|}", code):
        if token == "}":
            blocks.pop()
            continue
        name, *args = token[:-1].split()
        if token.endswith("{"):
            blocks.append(" ".join([name, *args]))
        else:
            found.append((name, args, tuple(blocks)))
    assert not blocks, "every block is closed"
    return found


def directive(name: str, block: str | None = None) -> list[list[str]]:
    found = directives(PROXY.read_text())
    return [args for n, args, inside in found if n == name and (block is None or block in inside)]


def test_the_settings_it_names_are_strops_and_match_what_the_proxy_sends():
    documented = documented_settings()
    assert set(documented) <= settings_read(), f"Strop reads none of {sorted(set(documented) - settings_read())}"
    (host,) = {name for args in directive("server_name") for name in args}
    assert documented["ALLOWED_HOSTS"] == host
    assert documented["CSRF_TRUSTED_ORIGINS"] == f"https://{host}"
    header, value = documented["SECURE_PROXY_SSL_HEADER"].split(",")
    assert (header, value) == ("HTTP_X_FORWARDED_PROTO", "https")
    assert ["X-Forwarded-Proto", "$scheme"] in directive("proxy_set_header"), "always set: the client's never passes"
    assert documented["SECURE_SSL_REDIRECT"] == "true" and int(documented["SECURE_HSTS_SECONDS"]) > 0
    compose_hops = compose()["services"]["api"]["environment"]["STROP_TRUSTED_PROXY_HOPS"]
    assert compose_hops == f"${{STROP_TRUSTED_PROXY_HOPS:-{documented['STROP_TRUSTED_PROXY_HOPS']}}}"
    assert ["X-Forwarded-For", "$proxy_add_x_forwarded_for"] in directive("proxy_set_header")
    assert ["Host", "$host"] in directive("proxy_set_header")


def test_it_reaches_the_port_compose_publishes_the_api_on():
    (published,) = compose()["services"]["api"]["ports"]
    default = re.fullmatch(r"\$\{API_PUBLISH:-([\d.]+:\d+)\}:\d+", published)
    assert default
    assert directive("server", "upstream strop_api") == [[default.group(1)]]
    for args in directive("proxy_pass"):
        assert args == ["http://strop_api"]


def test_it_allows_every_body_the_api_allows_so_the_api_answers_413_in_its_own_shape():
    (limit,) = directive("client_max_body_size")
    size = re.fullmatch(r"(\d+)m", limit[0])
    assert size
    allowed = int(size.group(1)) * 1024 * 1024
    assert settings.STROP_MAX_BODY_BYTES <= allowed <= settings.STROP_MAX_BODY_BYTES + 1024 * 1024


def test_paths_that_carry_a_token_or_an_end_users_id_stay_out_of_the_access_log():
    """What "Erase means gone" asks of a proxy: invitation and reset links, and /v1/users/<id>."""
    assert directive("access_log", f"location ~ {UNLOGGED}") == [["off"]]
    pattern = re.compile(UNLOGGED)
    for path in ("/dashboard/invite/abc123/", "/dashboard/password/reset/MQ/a1b2-c3d4/", "/v1/users/dev-42/opt-out"):
        assert pattern.match(path), path
    for path in ("/v1/completions", "/dashboard/", "/dashboard/team/"):
        assert not pattern.match(path), path
    guide = (ROOT / "docs" / "security.md").read_text()
    assert "`/dashboard/invite/`, `/dashboard/password/reset/` and `/v1/users/`" in guide


def test_server_sent_events_are_not_buffered_and_may_run_long():
    locations = {inside[-1] for name, _, inside in directives(PROXY.read_text()) if name == "proxy_pass"}
    assert locations == {"location /", "location /v1/", f"location ~ {UNLOGGED}"}
    assert directive("proxy_buffering", "location /v1/") == [["off"]]
    (timeout,) = directive("proxy_read_timeout", "location /v1/")
    assert int(timeout[0].rstrip("s")) >= 300
    # A location with headers of its own would drop the server's: nginx inherits them only as a whole.
    assert all(len(inside) == 1 for name, _, inside in directives(PROXY.read_text()) if name == "proxy_set_header")


@dataclass
class Proxy:
    https_port: int
    upstream: type[BaseHTTPRequestHandler]


class Upstream(BaseHTTPRequestHandler):
    """What the API would be: remembers the headers it got; /v1/stream sends one event, then waits
    for the test to have read it through the proxy before it sends the last and ends."""

    protocol_version = "HTTP/1.1"
    seen: dict[str, str] = {}
    first_event_read = threading.Event()
    stream_ended = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Upstream.seen = dict(self.headers)
        if self.path != "/v1/stream":
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.chunk(b"data: first\n\n")
        Upstream.first_event_read.wait(timeout=60)
        self.chunk(b"data: [DONE]\n\n")
        self.chunk(b"")
        Upstream.stream_ended.set()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    """The example as an operator installs it, on free ports, with a self-signed certificate, in front
    of Upstream where the API's port would be."""
    from benchmarks.common import free_port

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    Upstream.first_event_read.clear()
    Upstream.stream_ended.clear()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=strop.example.com"]
        + ["-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
        capture_output=True,
        check=True,
        timeout=60,
    )
    https_port, http_port = free_port(), free_port()
    text = PROXY.read_text()
    for old, new in {
        "listen [::]:80;": "",
        "listen [::]:443 ssl;": "",
        "listen 80;": f"listen 127.0.0.1:{http_port};",
        "listen 443 ssl;": f"listen 127.0.0.1:{https_port} ssl;",
        "/etc/letsencrypt/live/strop.example.com/fullchain.pem": str(tmp_path / "cert.pem"),
        "/etc/letsencrypt/live/strop.example.com/privkey.pem": str(tmp_path / "key.pem"),
        "server 127.0.0.1:8000;": f"server 127.0.0.1:{upstream.server_address[1]};",
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "strop.conf").write_text(text)
    (tmp_path / "nginx.conf").write_text(
        f"daemon off;\npid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
        f"http {{\n access_log off;\n client_body_temp_path {tmp_path}/body;\n proxy_temp_path {tmp_path}/proxy;\n"
        f" include {tmp_path}/strop.conf;\n}}\n"
    )
    assert NGINX
    command = [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    with (tmp_path / "nginx.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_until(
            lambda: (tmp_path / "nginx.pid").exists() or server.poll() is not None, timeout=60, what="nginx to start"
        )
        assert server.poll() is None, (tmp_path / "nginx.log").read_text()
        yield Proxy(https_port=https_port, upstream=Upstream)
    finally:
        Upstream.first_event_read.set()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        upstream.shutdown()


def client() -> httpx.Client:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the test's own self-signed certificate
    return httpx.Client(verify=context, timeout=60, headers={"Host": "strop.example.com"})


@needs_nginx
def test_nginx_replaces_the_clients_proto_and_appends_the_address_strop_then_trusts(proxy):
    with client() as http:
        answer = http.get(
            f"https://127.0.0.1:{proxy.https_port}/dashboard/",
            headers={"X-Forwarded-Proto": "http", "X-Forwarded-For": "203.0.113.9"},
        )
    assert answer.status_code == 200
    seen = {name.lower(): value for name, value in proxy.upstream.seen.items()}
    assert seen["host"] == "strop.example.com"
    assert seen["x-forwarded-proto"] == "https"
    assert seen["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    request = RequestFactory().get("/", HTTP_X_FORWARDED_FOR=seen["x-forwarded-for"], REMOTE_ADDR="172.18.0.1")
    with override_settings(STROP_TRUSTED_PROXY_HOPS=int(documented_settings()["STROP_TRUSTED_PROXY_HOPS"])):
        assert client_address(request) == "127.0.0.1", "the address nginx saw, not the one the client made up"


@needs_nginx
def test_nginx_passes_each_event_on_before_the_stream_ends(proxy):
    with client() as http, http.stream("GET", f"https://127.0.0.1:{proxy.https_port}/v1/stream") as answer:
        lines = answer.iter_lines()
        assert next(lines) == "data: first"
        # The upstream sends nothing more until the test has read this one: a buffering proxy would
        # have handed it over only once the upstream gave up waiting and ended the answer.
        assert not proxy.upstream.stream_ended.is_set(), "the first event came only with the end of the answer"
        proxy.upstream.first_event_read.set()
        assert [line for line in lines if line] == ["data: [DONE]"]
