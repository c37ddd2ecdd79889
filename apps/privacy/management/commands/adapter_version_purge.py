"""Purge the weights of adapter versions that learned from an erased end user, once replaced."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.adapters.models import Adapter, AdapterVersion
from apps.common.exceptions import ApplicationError
from apps.privacy.purge import adapter_version_purge, version_purge_states
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Delete from the adapter store every stored object version of the weights of versions that learned "
        "from an erased end user (not production, in no open experiment, no active run's parent); audited."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("adapter", help="the adapter's name")
        parser.add_argument("numbers", nargs="*", type=int, help="version numbers (none: every purgeable one)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        adapter = Adapter.objects.filter(tenant=tenant, name=options["adapter"]).first() if tenant else None
        if tenant is None or adapter is None:
            raise CommandError(f"no adapter {options['adapter']!r} of a tenant {options['tenant']!r}")
        versions = AdapterVersion.objects.filter(adapter=adapter).order_by("number")
        if options["numbers"]:
            versions = versions.filter(number__in=options["numbers"])
            missing = set(options["numbers"]) - set(versions.values_list("number", flat=True))
            if missing:
                raise CommandError(f"{adapter.name} has no version {', '.join(map(str, sorted(missing)))}")
        else:
            states = version_purge_states(adapter)
            versions = versions.filter(pk__in=[pk for pk, s in states.items() if s.state == "purgeable"])
        purged = 0
        for version in versions:
            try:
                adapter_version_purge(tenant, version=version, actor="operator")
            except ApplicationError as exc:
                raise CommandError(f"v{version.number}: {exc.message}") from exc
            self.stdout.write(f"{version.vllm_name} purged")
            purged += 1
        self.stdout.write(f"{purged} version(s) purged")
