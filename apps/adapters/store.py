"""The adapter store: where adapter versions live, written once and never changed.

Two backends behind one interface:

- ``LocalStore``: a folder on this host (``STROP_ADAPTER_ROOT``), the embedded default. A version's
  address is its absolute path, which a vLLM on the same host loads directly.
- ``S3Store``: S3-compatible object storage (``STROP_ADAPTER_STORE=s3://bucket/prefix``). A version's
  address is ``s3://bucket/prefix/<vllm name>``; vLLM replicas fetch it themselves
  (``platform/vllm_plugins/strop_vllm_store.py``) into a cache of their own, and the trainer fetches
  a parent the same way. Nothing else reads adapter files.

Every version carries a manifest (``strop-manifest.json``: each file's SHA-256) and a digest over
it, which the database keeps beside the version; a fetch checks every file against both. The
manifest is written last, so a version without one was never completely written and cannot be
fetched. Only the trainer (through ``adapter_version_register``) writes.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

MANIFEST = "strop-manifest.json"


class StoreError(Exception):
    """The store refused or could not complete an operation (the message says which and why)."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or refuses Strop's credentials."""


class StoreCorrupt(StoreError):
    """A version's files do not match its manifest or its recorded digest."""


class NotStored(StoreError):
    """The store holds no such object."""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            yield path.relative_to(directory).as_posix(), path


def manifest_of(directory: str | Path) -> dict[str, str]:
    """Each file of a version directory (relative POSIX path) and its SHA-256."""
    return {name: _file_sha256(path) for name, path in _files(Path(directory))}


def manifest_digest(manifest: dict[str, str]) -> str:
    """One digest over a manifest: ``sha256:`` and the hash of its sorted name/hash lines."""
    lines = "".join(f"{name}\0{sha}\n" for name, sha in sorted(manifest.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


_SHA256 = re.compile(r"[0-9a-f]{64}")


def manifest_files(raw: bytes | str, *, version: str) -> dict[str, str]:
    """A manifest's ``files`` (relative POSIX path -> SHA-256), or StoreCorrupt when it is not that
    shape. Checked before anything it lists is read: the manifest comes from the store, which does
    not vouch for itself."""
    try:
        files = json.loads(raw)["files"]
    except (ValueError, KeyError, TypeError):
        raise StoreCorrupt(f"{version}: {MANIFEST} is not readable") from None
    if not isinstance(files, dict):
        raise StoreCorrupt(f"{version}: {MANIFEST} does not map file names to their SHA-256")
    for name, sha in files.items():
        parts = name.split("/")
        if (
            not isinstance(sha, str)
            or not _SHA256.fullmatch(sha)
            or parts[-1] == MANIFEST
            or "\\" in name
            or any(part in {"", ".", ".."} for part in parts)
        ):
            raise StoreCorrupt(f"{version}: {MANIFEST} lists {name[:100]!r}, not a file of a version with its SHA-256")
    return files


def verify_directory(directory: str | Path, *, digest: str) -> None:
    """Raise StoreCorrupt unless ``directory`` holds exactly its manifest's files, under ``digest``."""
    directory = Path(directory)
    try:
        raw = (directory / MANIFEST).read_bytes()
    except OSError:
        raise StoreCorrupt(f"{directory.name}: no readable {MANIFEST}") from None
    recorded = manifest_files(raw, version=directory.name)
    if manifest_digest(recorded) != digest:
        raise StoreCorrupt(f"{directory.name}: the manifest's digest is not the one recorded for the version")
    actual = manifest_of(directory)
    if actual != recorded:
        changed = sorted(set(actual.items()) ^ set(recorded.items()))
        raise StoreCorrupt(f"{directory.name}: files differ from the manifest ({', '.join(n for n, _ in changed[:3])})")


def _write_manifest(directory: Path) -> str:
    manifest = manifest_of(directory)
    (directory / MANIFEST).write_text(json.dumps({"files": manifest}, sort_keys=True, indent=1))
    return manifest_digest(manifest)


@dataclass(frozen=True)
class Stored:
    address: str  # what the version row keeps and vLLM is told to load
    digest: str


class LocalStore:
    """Versions as folders under ``root``: ``<tenant>/<adapter>/<slug>``."""

    kind = "local"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def put(self, source: str | Path, *, tenant: str, adapter: str, slug: str, vllm_name: str) -> Stored:
        target = self.root / tenant / adapter / slug
        if target.exists():
            raise StoreError(f"{target.name} is already stored; a version is written once")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        shutil.copytree(source, staging)
        digest = _write_manifest(staging)
        staging.rename(target)  # a crash leaves a .tmp folder that no row points to, never half a version
        return Stored(address=str(target), digest=digest)

    def fetch(self, address: str, *, digest: str, dest: str | Path) -> Path:
        """The version's folder, checked against its digest (on this host it is read in place)."""
        del dest
        directory = Path(address)
        if not directory.is_dir():
            raise StoreError(f"{directory.name} is not in the adapter store")
        if digest:
            verify_directory(directory, digest=digest)
        return directory

    def purge(self, address: str) -> int:
        """Delete the version's folder (a purge: weights trained on an erased end user); how many
        files went. Idempotent: a folder already gone deletes nothing. A root that is missing or
        empty (its volume not mounted on this host) is a StoreError, never "already gone": the
        version's files may well lie where this host cannot see them."""
        directory = Path(address)
        if not directory.resolve().is_relative_to(self.root.resolve()):
            raise StoreError(f"{directory.name} is not in the adapter store")
        try:
            empty = next(self.root.iterdir(), None) is None
        except OSError as exc:
            raise StoreUnavailable(
                f"the adapter folder {self.root} cannot be read ({exc.strerror or exc}); is its volume mounted?"
            ) from None
        if empty:  # every version written leaves its tenant's folder behind, even once purged
            raise StoreUnavailable(f"the adapter folder {self.root} is empty; is its volume mounted?")
        if not directory.is_dir():
            return 0
        files = sum(1 for p in directory.rglob("*") if p.is_file())
        # Renamed first, so no reader ever sees half a folder; then removed.
        doomed = directory.with_name(f"{directory.name}.purge-{uuid.uuid4().hex[:8]}")
        directory.rename(doomed)
        shutil.rmtree(doomed)
        return files

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".ready-{uuid.uuid4().hex[:8]}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StoreUnavailable(f"the adapter folder cannot be written ({exc.strerror or exc})") from None


class S3Store:
    """Versions as objects under ``s3://bucket/prefix/<vllm name>/``, the manifest written last."""

    kind = "s3"

    def __init__(self, url: str, *, client: Any | None = None) -> None:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._client = client
        self._purge_client: tuple[str, Any] | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    @property
    def purge_client(self) -> Any:
        """The client that deletes: built with the purge key (``STROP_STORE_PURGE_KEY_ID``) where one
        is set, so the keys that read and write the store never need to delete; else ``client``."""
        key_id = settings.STROP_STORE_PURGE_KEY_ID
        if not key_id:
            return self.client
        if self._purge_client is None or self._purge_client[0] != key_id:  # a changed key, a new client
            self._purge_client = (key_id, s3_client(key_id=key_id, secret=settings.STROP_STORE_PURGE_SECRET))
        return self._purge_client[1]

    def _key(self, name: str, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, name, *parts) if p)

    def _name(self, address: str) -> str:
        base = f"s3://{self.bucket}/{self.prefix}/" if self.prefix else f"s3://{self.bucket}/"
        if not address.startswith(base) or "/" in address[len(base) :].strip("/"):
            raise StoreError("the version is not in this adapter store")
        return address[len(base) :].strip("/")

    @contextmanager
    def _answers(self, what: str, *, of_object: bool) -> Iterator[None]:
        """Turn what boto3 raises inside the block (a request, or reading a body it returned) into a
        StoreError saying ``what`` failed; ``of_object``: the block reads one object, whose absence
        is NotStored rather than a missing bucket."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "error"))
            if code in {"NoSuchBucket", "404"} and not of_object:
                raise StoreUnavailable(f"{what}: bucket {self.bucket!r} does not exist") from None
            if code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}:
                raise StoreUnavailable(f"{what}: the object store refused Strop's credentials ({code})") from None
            if code in {"NoSuchKey", "404", "NotFound"} and of_object:
                raise NotStored(f"{what}: the object store answered {code}") from None
            raise StoreError(f"{what}: the object store answered {code}") from None
        except BotoCoreError as exc:  # no connection, or one broken off while a body was read
            raise StoreUnavailable(f"{what}: the object store cannot be reached ({type(exc).__name__})") from None

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        with self._answers(what, of_object="Key" in kwargs):
            return fn(Bucket=self.bucket, **kwargs)

    def put(self, source: str | Path, *, tenant: str, adapter: str, slug: str, vllm_name: str) -> Stored:
        del tenant, adapter, slug  # the vLLM name already holds them, and replicas look versions up by it
        source = Path(source)
        manifest_key = self._key(vllm_name, MANIFEST)
        try:
            self._call("look for the version", self.client.head_object, Key=manifest_key)
        except NotStored:
            pass
        else:
            raise StoreError(f"{vllm_name} is already stored; a version is written once")
        manifest = manifest_of(source)
        for name, path in _files(source):
            with path.open("rb") as fh:
                self._call(f"upload {name}", self.client.put_object, Key=self._key(vllm_name, name), Body=fh)
        body = json.dumps({"files": manifest}, sort_keys=True, indent=1).encode()
        self._call("upload the manifest", self.client.put_object, Key=manifest_key, Body=body)
        return Stored(address=f"s3://{self.bucket}/{self._key(vllm_name)}", digest=manifest_digest(manifest))

    def fetch(self, address: str, *, digest: str, dest: str | Path) -> Path:
        """Download a version into ``dest`` (replaced if it exists but does not check out). The
        manifest is checked against ``digest`` before a single file is downloaded."""
        name = self._name(address)
        dest = Path(dest)
        if dest.is_dir():
            try:
                verify_directory(dest, digest=digest)
                return dest
            except StoreCorrupt:
                shutil.rmtree(dest)
        with self._answers("read the manifest", of_object=True):
            raw = self.client.get_object(Bucket=self.bucket, Key=self._key(name, MANIFEST))["Body"].read()
        files = manifest_files(raw, version=name)
        if manifest_digest(files) != digest:
            raise StoreCorrupt(f"{name}: the manifest's digest is not the one recorded for the version")
        staging = dest.with_name(f"{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        try:
            for file_name in files:
                target = staging / file_name
                if not target.resolve().is_relative_to(staging.resolve()):
                    raise StoreCorrupt(f"{name}: the manifest names a file outside the version")
                target.parent.mkdir(parents=True, exist_ok=True)
                with self._answers(f"download {file_name}", of_object=True), target.open("wb") as fh:
                    obj = self.client.get_object(Bucket=self.bucket, Key=self._key(name, file_name))
                    shutil.copyfileobj(obj["Body"], fh)
            (staging / MANIFEST).write_bytes(raw)
            verify_directory(staging, digest=digest)
            staging.rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dest

    def purge(self, address: str) -> int:
        """Delete every object version (and delete marker) under the version's prefix: with bucket
        versioning on, a plain delete would only hide the objects behind a marker. How many object
        versions went. Idempotent; an object the store keeps (object lock) raises StoreError."""
        prefix = self._key(self._name(address)) + "/"
        deleted = 0
        while True:  # each round lists afresh, so versions written meanwhile are not missed
            listing = self._call("list the version's objects", self.purge_client.list_object_versions, Prefix=prefix)
            doomed = [
                {"Key": item["Key"], "VersionId": item["VersionId"]}
                for item in [*listing.get("Versions", []), *listing.get("DeleteMarkers", [])]
            ][:1000]
            if not doomed:
                return deleted
            answer = self._call(
                "delete the version's objects",
                self.purge_client.delete_objects,
                Delete={"Objects": doomed, "Quiet": True},
            )
            errors = answer.get("Errors", [])
            if errors:
                first = errors[0]
                raise StoreError(
                    f"the object store kept {len(errors)} object version(s) of {self._name(address)} "
                    f"({first.get('Code', 'error')}: {first.get('Message', '')[:200]})"
                )
            deleted += len(doomed)

    def check(self) -> None:
        self._call("check the bucket", self.client.head_bucket)


def s3_client(*, key_id: str = "", secret: str = "") -> Any:
    """A boto3 S3 client from the standard AWS settings (or the key given), with short timeouts and a
    few retries."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=settings.AWS_ENDPOINT_URL or None,
        aws_access_key_id=(key_id or settings.AWS_ACCESS_KEY_ID) or None,
        aws_secret_access_key=(secret if key_id else settings.AWS_SECRET_ACCESS_KEY) or None,
        region_name=settings.AWS_DEFAULT_REGION,
        config=Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}),
    )


AdapterStore = LocalStore | S3Store


@cache
def _store(url: str, root: str, endpoint: str, key_id: str) -> AdapterStore:
    del endpoint, key_id  # part of the cache key only: a changed setting gets a new client
    return S3Store(url) if url else LocalStore(root)


def adapter_store() -> AdapterStore:
    """The configured store (``STROP_ADAPTER_STORE``; empty = the local folder)."""
    return _store(
        settings.STROP_ADAPTER_STORE,
        str(settings.STROP_ADAPTER_ROOT),
        settings.AWS_ENDPOINT_URL,
        settings.AWS_ACCESS_KEY_ID,
    )


def store_for(address: str) -> AdapterStore:
    """The store holding a version at ``address`` (an ``s3://`` address or a local path), rooted where
    the address lies, so a version written before the store moved (another bucket, another prefix of
    the same bucket, another folder) is still read, fetched and purged from where it lies."""
    current = adapter_store()
    if address.startswith("s3://"):
        # s3://bucket/prefix/<vllm name>: the version's own bucket and prefix, whatever is set now.
        bucket_prefix = address.removeprefix("s3://").rsplit("/", 1)[0]
        bucket, _, prefix = bucket_prefix.partition("/")
        if isinstance(current, S3Store) and (current.bucket, current.prefix) == (bucket, prefix.strip("/")):
            return current
        return S3Store(f"s3://{bucket_prefix}", client=current.client if isinstance(current, S3Store) else None)
    path = Path(address)
    if isinstance(current, LocalStore) and path.resolve().is_relative_to(current.root.resolve()):
        return current
    # <root>/<tenant>/<adapter>/<slug>, as LocalStore.put writes it: the root the version was written under.
    parents = path.parents
    return LocalStore(parents[min(2, len(parents) - 1)] if parents else path)
