"""Container health checks (the images' HEALTHCHECK, compose's healthcheck), the standard library
only for HTTP, so the same file runs under Strop's Python and under vLLM's.

    healthcheck.py http PATH [PORT]   GET http://127.0.0.1:PORT/PATH answers 200 (redirects fail).
                                      PORT is a number, or the name of the variable that holds it
                                      or a HOST:PORT (default API_BIND, else 8000; vLLM: VLLM_PORT).
    healthcheck.py broker             the Celery broker (CELERY_BROKER_URL, else REDIS_URL, a Redis)
                                      answers PING; for beat, which serves nothing to ask.

Exit 0 when healthy, 1 otherwise, with one line saying why.
"""

from __future__ import annotations

import http.client
import os
import sys
from urllib.parse import urlparse

TIMEOUT_S = 5.0


def _host_header() -> str:
    """A Host the API accepts: Django answers 400 to a Host outside ALLOWED_HOSTS, /health included."""
    allowed = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
    if not allowed or allowed[0] == "*":
        return "localhost"
    return allowed[0].lstrip(".")


def _proxy_headers() -> dict[str, str]:
    """The header the TLS proxy sets (SECURE_PROXY_SSL_HEADER), so SECURE_SSL_REDIRECT does not send
    the probe to https: the probe stands where the proxy would, on the container's own port."""
    parts = [p.strip() for p in os.environ.get("SECURE_PROXY_SSL_HEADER", "").split(",") if p.strip()]
    if len(parts) != 2 or not parts[0].startswith("HTTP_"):
        return {}
    return {parts[0].removeprefix("HTTP_").replace("_", "-").title(): parts[1]}


def check_http(path: str, port: int) -> str | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", path, headers={"Host": _host_header(), **_proxy_headers()})
        status = connection.getresponse().status
    except OSError as exc:
        return f"GET {path} on port {port}: {exc}"
    finally:
        connection.close()
    return None if status == 200 else f"GET {path} on port {port} answered {status}"


def check_broker() -> str | None:
    # Strop's image only (beat), so its redis client: TLS (rediss://) and credentials as Celery uses them.
    import redis

    url = os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL", "")
    if urlparse(url).scheme not in {"redis", "rediss"}:
        return f"the broker is not a Redis URL ({urlparse(url).scheme or 'unset'})"
    try:
        redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S).ping()
    except redis.RedisError as exc:
        return f"the broker does not answer PING: {exc}"
    return None


def _port(given: str) -> int:
    if given.isdigit():
        return int(given)
    return int(os.environ.get(given, "").rpartition(":")[2] or 8000)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "http":
        problem = check_http(argv[1], _port(argv[2] if len(argv) > 2 else "API_BIND"))
    elif argv == ["broker"]:
        problem = check_broker()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if problem:
        print(f"unhealthy: {problem}")
        return 1
    print("healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
