"""Record the synthetic serve probe on versions that have none (those whose probe, cut from a
training sample, the scrub migration removed), so they can be started in an experiment again."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.adapters.models import AdapterVersion
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
        parser.add_argument("--number", type=int, help="only this version number (with --tenant and --adapter)")

    def handle(self, *args: Any, **options: Any) -> None:
        versions = AdapterVersion.objects.filter(status__in=PROBED_STATUSES).select_related("adapter__base_model")
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"no tenant with slug {options['tenant']!r}")
            versions = versions.filter(tenant=tenant)
        if options["adapter"]:
            versions = versions.filter(adapter__name=options["adapter"])
        if options["number"]:
            versions = versions.filter(number=options["number"])
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
