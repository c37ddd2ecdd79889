"""vLLM replicas fetch Strop's adapter versions from the adapter store by themselves.

Runs inside vLLM's own virtualenv (boto3 is installed there by ``platform/vllm-env.sh``) and imports
nothing from Strop. Active only when ``STROP_ADAPTER_STORE`` is an ``s3://bucket/prefix`` address;
reads the standard AWS settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) as the rest of Strop does.

The bucket is not trusted: whoever can write it could swap a version's files and its manifest
together. What is trusted is the digest Strop keeps in its database for each version
(``sha256:`` over the manifest, ``apps/adapters/store.py``), which Strop sends with every load.

- ``FetchOnLoad`` (an ASGI middleware, ``--middleware strop_vllm_store.FetchOnLoad``): Strop's
  ``POST /v1/load_lora_adapter`` names the version by its store address and carries its digest
  (``strop_digest``); the middleware fetches the version, refuses it with a 400 saying "digest
  mismatch" unless its files hash to that digest, and passes vLLM the cached folder instead, so
  vLLM's own checks and errors apply unchanged. A load by store address without a digest is refused,
  and so is an address that does not end in the version's own name or lies outside the configured
  bucket (one under an earlier prefix of that bucket is taken: ``Store.prefix_of``).
  It sits inside ``strop_vllm_auth.RequireKey``: nothing is read or fetched before the key is checked.
- ``register`` (a ``vllm.general_plugins`` entry point, declared by the ``strop_vllm_plugins``
  dist-info beside this file) adds a LoRA resolver, asked when a request names a version vLLM has
  not loaded. vLLM gives it only the name, and the bucket cannot vouch for itself, so the resolver
  never downloads: it serves a version only from this replica's cache, where a load with Strop's
  digest put it (after a restart with the cache kept, say), checked again against that digest.
  Anything else is vLLM's ordinary 404, on which Strop loads the version with its digest and
  retries (``apps/serving/vllm_calls.py``).

A fetch downloads into a temporary folder, checks every file against the version's manifest
(``strop-manifest.json``, written last by Strop's adapter store when the gpu worker registers the
version, ``apps/adapters/store.py``) and the manifest against Strop's digest,
and renames the folder into the cache, so the cache never holds half a version or an unverified
one. Strop's serve-probe then checks the weights vLLM serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

logger = logging.getLogger("vllm.strop_vllm_store")  # under vLLM's logger, so its handlers print it

MANIFEST = "strop-manifest.json"
# A version's name: tenant--adapter--vN-<random>. Anything else never reaches the store.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# The prefix a version was written under: the configured one, or an earlier one of the same bucket.
# Plain path segments only ("." and ".." start with a dot, which no segment may).
PREFIX = re.compile(r"(?:[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199})(?:/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}){0,15}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Beside the cached versions (a version's name never starts with a dot): the digest Strop sent for
# each, so the resolver can check a cached copy without trusting the bucket.
VERIFIED = ".strop-verified"

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class NotInStore(Exception):
    pass


class BadVersion(Exception):
    pass


class DigestMismatch(BadVersion):
    pass


def store_url() -> str:
    url = os.environ.get("STROP_ADAPTER_STORE", "")
    return url if url.startswith("s3://") else ""


def cache_dir() -> Path:
    default = Path(tempfile.gettempdir()) / "strop-vllm-adapters"
    path = Path(os.environ.get("STROP_VLLM_ADAPTER_CACHE", "") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


class Store:
    def __init__(self, url: str) -> None:
        import boto3
        from botocore.config import Config

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = boto3.client(
            "s3",
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            config=Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}),
        )
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def prefix_of(self, name: str, address: str) -> str | None:
        """The prefix under which ``address`` holds version ``name`` in this store's bucket, or None
        when it is not that version's address. Under the configured prefix, or an earlier one of the
        same bucket: versions written before the store moved to a new prefix stay where they lie.
        The address must end in the name itself, so a name never loads another version's files
        (another tenant's), and must be in the configured bucket, so a request never points this
        replica's credentials elsewhere; the files are then checked against Strop's digest as ever."""
        if not NAME.fullmatch(name) or ".." in name:
            return None
        bucket, _, key = address.removeprefix("s3://").partition("/")
        prefix, slash, last = key.rpartition("/")
        if not address.startswith("s3://") or bucket != self.bucket or last != name or (slash and not prefix):
            return None
        return prefix if prefix in {"", self.prefix} or PREFIX.fullmatch(prefix) else None

    def _key(self, name: str, file_name: str, *, prefix: str | None = None) -> str:
        return "/".join(p for p in (self.prefix if prefix is None else prefix, name, file_name) if p)

    def fetch(self, name: str, *, digest: str, prefix: str | None = None) -> Path:
        """The cached folder of version ``name``, fetched from the store if need be (under ``prefix``,
        by default the configured one), whose files hash to ``digest`` (the one Strop recorded);
        DigestMismatch otherwise."""
        if not NAME.fullmatch(name) or ".." in name:
            raise NotInStore(name)
        prefix = self.prefix if prefix is None else prefix
        if not DIGEST.fullmatch(digest):
            raise BadVersion(f"{name}: no valid digest (strop_digest) was sent, so the version cannot be verified")
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            target = cache_dir() / name
            if target.is_dir() and _checks_out(target, digest):
                _record_verified(name, digest)
                return target
            shutil.rmtree(target, ignore_errors=True)
            started = time.monotonic()
            folder = self._download(name, target, digest, prefix)
            _record_verified(name, digest)
            logger.info("fetched adapter %s from the adapter store in %.2f s", name, time.monotonic() - started)
            return folder

    def _download(self, name: str, target: Path, digest: str, prefix: str) -> Path:
        from botocore.exceptions import ClientError

        try:
            manifest = self.client.get_object(Bucket=self.bucket, Key=self._key(name, MANIFEST, prefix=prefix))
            raw = manifest["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                raise NotInStore(name) from None
            raise
        try:
            files = json.loads(raw)["files"]
            held = manifest_digest(files)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise BadVersion(f"{name}: unreadable manifest") from None
        if held != digest:  # refused before a single weight is downloaded
            raise DigestMismatch(
                f"digest mismatch: the adapter store's copy of {name} is not the version Strop registered "
                f"(Strop recorded {digest}, the store's manifest is {held}); refusing to load it"
            )
        staging = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        try:
            for file_name in files:
                path = staging / file_name
                if not path.resolve().is_relative_to(staging.resolve()):
                    raise BadVersion(f"{name}: the manifest names a file outside the version")
                path.parent.mkdir(parents=True, exist_ok=True)
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(name, file_name, prefix=prefix))["Body"]
                with path.open("wb") as fh:
                    shutil.copyfileobj(body, fh)
            (staging / MANIFEST).write_bytes(raw)
            if not _checks_out(staging, digest):
                raise DigestMismatch(
                    f"digest mismatch: the files of {name} in the adapter store do not hash to the digest Strop "
                    f"recorded ({digest}); refusing to load them"
                )
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def cached(self, name: str) -> Path | None:
        """The cached folder of ``name`` if a load with Strop's digest put it there and it still
        hashes to that digest; None otherwise (nothing is downloaded)."""
        if not NAME.fullmatch(name) or ".." in name:
            return None
        try:
            digest = (cache_dir() / VERIFIED / name).read_text().strip()
        except OSError:
            return None
        target = cache_dir() / name
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            return target if DIGEST.fullmatch(digest) and target.is_dir() and _checks_out(target, digest) else None


def _record_verified(name: str, digest: str) -> None:
    folder = cache_dir() / VERIFIED
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(digest)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_digest(files: dict[str, str]) -> str:
    """The same digest as Strop's ``apps.adapters.store.manifest_digest`` (this file imports nothing of Strop's)."""
    lines = "".join(f"{name}\0{sha}\n" for name, sha in sorted(files.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def _checks_out(folder: Path, digest: str) -> bool:
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        if manifest_digest(files) != digest:
            return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST}
    return present == set(files) and all(_sha256(folder / n) == sha for n, sha in files.items())


_store: Store | None = None


def store() -> Store:
    global _store
    if _store is None:
        _store = Store(store_url())
    return _store


def register() -> None:
    """vLLM's general-plugin hook: add the resolver when an object store is configured."""
    if not store_url():
        return
    from vllm.lora.request import LoRARequest
    from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

    class StoreResolver(LoRAResolver):
        async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
            # Only a copy verified against Strop's digest: vLLM gives us no digest, and the bucket's
            # own manifest proves nothing. Unknown here: vLLM's 404, and Strop loads it with its digest.
            folder = await asyncio.to_thread(store().cached, lora_name)
            if folder is None:
                logger.info("adapter %s is not verified on this replica; waiting for Strop to load it", lora_name)
                return None
            return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=str(folder))

    LoRAResolverRegistry.register_resolver("Strop adapter store", StoreResolver())


def _error(status: int, message: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps({"error": {"message": message, "type": "BadRequestError", "code": status}}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, body


class FetchOnLoad:
    """Rewrites a load request that names a store address to the replica's cached copy."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", "")).rstrip("/")
        if scope["type"] != "http" or scope.get("method") != "POST" or path != "/v1/load_lora_adapter":
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:  # RequireKey, outside this middleware, caps what this can read
            message = await receive()
            if message.get("type") == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            lora_path, lora_name = str(body.get("lora_path", "")), str(body.get("lora_name", ""))
            digest = str(body.pop("strop_digest", "") or "")
        except (ValueError, AttributeError):
            lora_path, lora_name, digest = "", "", ""
        if lora_path.startswith("s3://") and store_url():
            problem = await self._fetch(lora_name, lora_path, digest)
            if isinstance(problem, tuple):
                start, payload = problem
                await send(start)
                await send({"type": "http.response.body", "body": payload})
                return
            body["lora_path"] = problem
            raw = json.dumps(body).encode()
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        await self.app({**scope, "headers": headers}, replay, send)

    async def _fetch(self, name: str, address: str, digest: str) -> str | tuple[dict[str, Any], bytes]:
        prefix = store().prefix_of(name, address)
        if prefix is None:
            return _error(400, "lora_path is not this version's address in the adapter store")
        try:
            return str(await asyncio.to_thread(store().fetch, name, digest=digest, prefix=prefix))
        except NotInStore:
            return _error(404, f"adapter {name} is not in the adapter store")
        except BadVersion as exc:
            return _error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - the store is down: the caller retries later
            logger.exception("fetching adapter %s from the adapter store failed", name)
            return _error(503, f"the adapter store could not be read ({type(exc).__name__})")
