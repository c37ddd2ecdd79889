"""The vLLM replicas' administration: adapters loaded and unloaded on every replica, the models a
replica lists, its health, and prompt log-probabilities (the serve-probe). Synchronous: called by
Celery tasks, the readiness check and the metrics scrape, never on the serving path.

Every call carries vLLM's key; connection failures and timeouts become :class:`VLLMUnavailable`,
a refused key a :class:`VLLMError`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import httpx

from apps.engines.vllm_errors import (
    AdapterConflict,
    AdapterRejected,
    VLLMError,
    VLLMUnavailable,
    error_parts,
    raise_for,
)
from apps.engines.vllm_transport import Replicas, raise_if_key_refused, shared_http
from apps.engines.vllm_types import ModelCard


class ReplicaAdmin(Replicas):
    """The administrative calls of :class:`apps.engines.vllm_client.VLLMClient`."""

    def _admin(
        self, replica: str, method: str, path: str, body: Any = None, *, timeout: float | None = None
    ) -> httpx.Response:
        """One admin call; connection failures and timeouts become VLLMUnavailable, a refused key
        a VLLMError."""
        try:
            response = shared_http().request(
                method,
                f"{replica}{path}",
                json=body,
                headers=self._headers,
                timeout=self._timeouts(timeout or self._admin_timeout),
            )
        except httpx.TimeoutException as exc:
            raise VLLMUnavailable(f"vLLM at {replica} did not answer {path} in time", replica=replica) from exc
        except httpx.TransportError as exc:
            raise VLLMUnavailable(f"vLLM at {replica} is unreachable: {exc}", replica=replica) from exc
        raise_if_key_refused(response, replica)
        return response

    def prompt_logprobs(self, replica: str, *, model: str, token_ids: Sequence[int]) -> list[float | None]:
        """The log-prob of each given token after those before it (None for the first), on one
        replica: vLLM's ``prompt_logprobs``, read for exactly the tokens sent."""
        body = {
            "model": model,
            "prompt": [int(t) for t in token_ids],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        response = self._admin(replica, "POST", "/v1/completions", body, timeout=self._timeout)
        raise_for(response, replica, what="probe")
        choices = response.json().get("choices") or [{}]
        entries = choices[0].get("prompt_logprobs") or []
        out: list[float | None] = []
        for token, entry in zip(token_ids, entries, strict=False):
            chosen = (entry or {}).get(str(int(token)))
            out.append(float(chosen["logprob"]) if isinstance(chosen, dict) else None)
        return out

    def models(self, replica: str | None = None) -> list[ModelCard]:
        """What one replica serves (default: the first): the base model and every loaded adapter."""
        replica = replica or self.base_urls[0]
        response = self._admin(replica, "GET", "/v1/models")
        raise_for(response, replica, what="model listing")
        return [
            ModelCard(str(m["id"]), m.get("root"), m.get("parent"), m.get("max_model_len"))
            for m in response.json().get("data", [])
        ]

    def health(self, *, timeout: float = 5.0) -> dict[str, bool]:
        """Each replica's ``/health`` (200 means the engine is up)."""
        status: dict[str, bool] = {}
        for replica in self.base_urls:
            try:
                status[replica] = self._admin(replica, "GET", "/health", timeout=timeout).status_code == 200
            except (VLLMUnavailable, VLLMError):
                status[replica] = False
        return status

    def load_adapter(self, name: str, path: str | os.PathLike[str], *, digest: str = "") -> None:
        """Load a LoRA adapter under ``name`` on every replica and confirm it in ``/v1/models``.

        Idempotent: a replica that already has ``name`` from the same path counts as loaded,
        so after a failure on one replica the whole call can simply be repeated.
        Never reload new weights under an old name or path (vLLM's prefix cache is keyed on
        them): every adapter version has its own directory and its own name.
        ``digest`` goes with a load by object-store address (``strop_digest``): the replica's
        plugin refuses files that do not hash to it (``platform/vllm_plugins/strop_vllm_store.py``).
        """
        lora_path = os.fspath(path)
        for replica in self.base_urls:
            self._load_on(replica, name, lora_path, digest)

    def _load_on(self, replica: str, name: str, lora_path: str, digest: str = "") -> None:
        body = {"lora_name": name, "lora_path": lora_path}
        if digest and lora_path.startswith("s3://"):
            body["strop_digest"] = digest
        response = self._admin(replica, "POST", "/v1/load_lora_adapter", body)
        if response.status_code >= 400:
            message, vtype = error_parts(response)
            loaded = {m.id: m for m in self.models(replica)}
            if response.status_code == 400 and name in loaded:
                if _same_source(loaded[name].root, lora_path, name):
                    return
                raise AdapterConflict(
                    f"adapter {name!r} is already loaded from {loaded[name].root}, not {lora_path}",
                    replica=replica,
                    vllm_status=400,
                    vllm_type=vtype,
                )
            if response.status_code in (502, 503, 504):
                raise VLLMUnavailable(f"vLLM at {replica} could not load {name!r}: {message}", replica=replica)
            raise AdapterRejected(
                message,
                replica=replica,
                vllm_status=response.status_code,
                vllm_type=vtype,
                details={"lora_name": name, "lora_path": lora_path},
            )
        card = next((m for m in self.models(replica) if m.id == name), None)
        if card is None or not _same_source(card.root, lora_path, name):
            raise VLLMError(f"vLLM at {replica} accepted {name!r} but does not list it", replica=replica)

    def unload_adapter(self, name: str) -> None:
        """Unload ``name`` from every replica; a replica that does not have it is fine.

        Unloading does not free vLLM's slot at once; prefer letting its LRU evict old versions.
        """
        for replica in self.base_urls:
            response = self._admin(replica, "POST", "/v1/unload_lora_adapter", {"lora_name": name})
            if response.status_code == 404:
                continue
            raise_for(response, replica, what="adapter unload")


def _same_source(root: str | None, lora_path: str, name: str) -> bool:
    """Whether vLLM's ``root`` for an adapter is ``lora_path``: the path itself, or for a version in
    object storage the replica's cached copy, a folder named after the version (never reused)."""
    if root == lora_path:
        return True
    return lora_path.startswith("s3://") and bool(root) and os.path.basename(str(root).rstrip("/")) == name
