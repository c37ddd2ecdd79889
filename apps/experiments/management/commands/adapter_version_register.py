"""``manage.py adapter_version_register``: an operator's LoRA directory as a new version, loaded, and
promoted with ``--promote`` as a promotion by hand is (``adapter_promote``: the adapter's running
experiment ends first), which is why it lives with the experiments."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import BaseModel
from apps.adapters.selectors import adapter_get_for_tenant, adapter_version_get_for_tenant
from apps.adapters.services import adapter_serve_probe, adapter_source_verify, adapter_version_register
from apps.common.exceptions import ApplicationError
from apps.experiments.services import adapter_promote
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Register a PEFT LoRA directory as a new version of a tenant's adapter, load it in vLLM, optionally promote."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("adapter", help="the adapter's name")
        parser.add_argument("path", help="a PEFT LoRA directory (adapter_config.json + adapter_model.safetensors)")
        parser.add_argument("--parent", type=int, help="the version number it was trained from")
        parser.add_argument("--promote", action="store_true", help="make it production once loaded")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant with slug {options['tenant']!r}")
        try:
            adapter = adapter_get_for_tenant(tenant, name=options["adapter"])
            parent = (
                adapter_version_get_for_tenant(tenant, adapter=adapter, number=options["parent"])
                if options["parent"]
                else None
            )
            # The folder is checked before the probe loads it: a probe of anything but an adapter of
            # this base fails inside torch, with a traceback instead of what is wrong.
            adapter_source_verify(adapter.base_model, source_dir=options["path"])
            probe = self._probe(adapter.base_model, options["path"])
            version = adapter_version_register(
                tenant,
                adapter=adapter,
                source_dir=options["path"],
                parent=parent,
                actor="operator",
                enqueue_load=False,
                metrics={"serve_probe": probe},
            )
            outcome = adapter_version_load(version_id=version.pk)
            version.refresh_from_db()
            if outcome != "loaded":
                raise CommandError(f"vLLM refused {version.vllm_name}: {version.status_message}")
            if options["promote"]:
                adapter_promote(tenant, version=version, actor="operator")
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{version.vllm_name} {'promoted' if options['promote'] else outcome}")

    @staticmethod
    def _probe(base: BaseModel, path: str) -> dict[str, Any]:
        try:
            return adapter_serve_probe(base, path)
        except (RuntimeError, ValueError) as exc:
            # An adapter that names no base here (no strop_train_config.json, and a hub id as its
            # base) is checked only by loading it: PEFT refuses other shapes or modules.
            said = "; ".join([line.strip() for line in str(exc).splitlines() if line.strip()][:2])
            raise CommandError(
                f"adapter {path} does not load on base model {base.name!r} (was it trained on another base?): "
                f"{said or type(exc).__name__}"
            ) from exc
