"""Separate hosts on one machine: a network namespace and a private filesystem per host.

Each host is a Linux network namespace joined to a bridge of its own (its own address, its own
loopback: a process there reaches another host only over the bridge), and every process on it runs
in a mount namespace where:

- ``/run/strop-host`` is a tmpfs of the host's own: its var folder, temporary files, home, caches,
  run folders and vLLM's adapter cache, which no other host can see;
- the checkout (code and virtualenvs, as a container image would hold them) is mounted read-only,
  and the checkout's ``var/`` is hidden under an empty tmpfs;
- the base model is mounted read-only at the same path on every host (``/run/strop-host/models/base``),
  as an image or a provisioning step would place it.

The machine's Postgres and Redis listen on loopback only, so the root namespace forwards the bridge
address's ports to them (``tests/hosts/forward.py``); the object store listens on the bridge itself.
Needs root (``ip netns``), which this machine and CI have.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

HOST_ROOT = Path("/run/strop-host")
MODEL_PATH = HOST_ROOT / "models" / "base"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def can_make_hosts() -> str | None:
    """None when this process can make hosts, else why not."""
    if os.geteuid() != 0:
        return "separate hosts need root (ip netns, mount namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "separate hosts need the ip and unshare commands"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    for _ in range(200):
        second, third = 200 + secrets.randbelow(50), secrets.randbelow(250)
        if f" 10.{second}.{third}." not in used:
            return ipaddress.IPv4Network(f"10.{second}.{third}.0/24")
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test hosts")


@dataclass
class Host:
    name: str
    netns: str
    address: str
    network: Network
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host (in its own process group), output to ``log``."""
        setup = "; ".join(
            [
                "set -e",
                f"mount -t tmpfs -o size=2g,mode=0755 strop-host {HOST_ROOT}",
                f"mkdir -p {MODEL_PATH} {HOST_ROOT}/var/prometheus {HOST_ROOT}/tmp {HOST_ROOT}/home",
                f"mount --bind {shlex.quote(str(self.network.model_dir))} {MODEL_PATH}",
                f"mount -o remount,bind,ro {MODEL_PATH}",
                f"mount --bind {shlex.quote(str(REPO_ROOT))} {shlex.quote(str(REPO_ROOT))}",
                f"mount -o remount,bind,ro {shlex.quote(str(REPO_ROOT))}",
                f"mount -t tmpfs -o size=16m strop-empty {shlex.quote(str(REPO_ROOT / 'var'))}",
                'exec "$@"',
            ]
        )
        private = {
            "HOME": f"{HOST_ROOT}/home",
            "TMPDIR": f"{HOST_ROOT}/tmp",
            "XDG_CACHE_HOME": f"{HOST_ROOT}/home/.cache",
            "HF_HOME": f"{HOST_ROOT}/home/.cache/huggingface",
            "STROP_VAR_DIR": f"{HOST_ROOT}/var",
            "STROP_ADAPTER_ROOT": f"{HOST_ROOT}/var/adapters",
            "STROP_RUN_ROOT": f"{HOST_ROOT}/var/runs",
            "PROMETHEUS_MULTIPROC_DIR": f"{HOST_ROOT}/var/prometheus",
            "STROP_VLLM_ADAPTER_CACHE": f"{HOST_ROOT}/var/vllm-adapters",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        command = [
            "ip", "netns", "exec", self.netns,
            "unshare", "--mount", "--propagation", "private", "--",
            "bash", "-c", setup, "strop-host", *argv,
        ]  # fmt: skip
        with log.open("ab") as out:
            proc = subprocess.Popen(
                command,
                env={**env, **private},
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


@dataclass
class Network:
    """A bridge and the hosts on it; ``gateway`` is the root namespace's address on the bridge."""

    model_dir: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.subnet = _free_subnet()
        self.gateway = str(self.subnet.network_address + 1)
        self.bridge = f"sbr{self.tag}"
        HOST_ROOT.mkdir(parents=True, exist_ok=True)  # the mount point; each host mounts its own tmpfs there
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 2
        netns, outside, inside = f"strop-{self.tag}-{name}", f"sv{self.tag}{index}", f"sp{self.tag}{index}"
        address = str(self.subnet.network_address + index)
        _ip("netns", "add", netns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "link", "set", inside, "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "route", "add", "default", "via", self.gateway)
        host = Host(name=name, netns=netns, address=address, network=self)
        self.hosts.append(host)
        return host

    def destroy(self) -> None:
        for host in self.hosts:
            host.stop()
            subprocess.run(["ip", "netns", "delete", host.netns], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
