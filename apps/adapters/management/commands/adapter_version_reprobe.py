"""Record the synthetic serve probe on versions that have none (those whose probe, cut from a
training sample, the scrub migration removed), so they can be started in an experiment again."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from apps.adapters.models import AdapterVersion
from apps.adapters.selectors import adapter_get_for_tenant, adapter_version_get_for_tenant
from apps.adapters.services import adapter_serve_probe, adapter_version_fetch, adapter_version_probe_record
from apps.common.exceptions import ApplicationError
from apps.tenants.models import Tenant
from gpu_trainer.probe import PROBE_SOURCE

# Versions worth a probe: those that may still be started in an experiment or promoted.
PROBED_STATUSES = (
    AdapterVersion.Status.CANDIDATE,
    AdapterVersion.Status.IN_EXPERIMENT,
    AdapterVersion.Status.PRODUCTION,
    AdapterVersion.Status.RETIRED,
)


class Command(BaseCommand):
    help = (
        "Record the synthetic serve probe on adapter versions that lack one (loads the base model with torch: "
        "run it where the trainer runs)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="only this tenant's versions (its slug)")
        parser.add_argument("--adapter", help="only this adapter's versions (with --tenant)")
        parser.add_argument(
            "--number", type=int, help="only this version number, 1 or more (with --tenant and --adapter)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            versions = self._selected(
                tenant_slug=options["tenant"], adapter=options["adapter"], number=options["number"]
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        done = 0
        for version in versions.order_by("pk"):
            if (version.metrics or {}).get("serve_probe", {}).get("source") == PROBE_SOURCE:
                continue
            with tempfile.TemporaryDirectory(prefix="strop-reprobe-") as scratch:
                try:
                    folder = adapter_version_fetch(version, into=Path(scratch) / version.vllm_name)
                except ApplicationError as exc:
                    raise CommandError(f"{version.vllm_name}: {exc.message}") from exc
                probe = adapter_serve_probe(version.adapter.base_model, folder)
            adapter_version_probe_record(version, probe=probe, actor="operator")
            self.stdout.write(f"{version.vllm_name} probed")
            done += 1
        self.stdout.write(f"{done} version(s) probed")

    @staticmethod
    def _selected(*, tenant_slug: str | None, adapter: str | None, number: int | None) -> QuerySet[AdapterVersion]:
        """The versions the options name; a name that finds nothing is an error, not zero versions."""
        versions = AdapterVersion.objects.filter(status__in=PROBED_STATUSES).select_related("adapter__base_model")
        if adapter and not tenant_slug:
            raise CommandError("--adapter names one tenant's adapter: give --tenant too")
        if number is not None and not adapter:
            raise CommandError("--number names a version of one adapter: give --tenant and --adapter too")
        if number is not None and number < 1:
            raise CommandError(f"--number {number}: version numbers start at 1")
        if not tenant_slug:
            return versions
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise CommandError(f"no tenant with slug {tenant_slug!r}")
        if not adapter:
            return versions.filter(tenant=tenant)
        found = adapter_get_for_tenant(tenant, name=adapter)
        if number is None:
            return versions.filter(tenant=tenant, adapter=found)
        version = adapter_version_get_for_tenant(tenant, adapter=found, number=number)
        if version.status not in PROBED_STATUSES:
            raise CommandError(
                f"{version.vllm_name} is {version.status}: only versions that may serve again "
                f"({', '.join(PROBED_STATUSES)}) are probed"
            )
        return versions.filter(pk=version.pk)
