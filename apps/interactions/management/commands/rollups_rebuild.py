from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.interactions.rollups import rollups_rebuild
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Recompute the hourly and daily rollups from the raw interactions and feedback plus what retention "
        "deleted of each hour (every tenant, or one), from the oldest hour that has either."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="one tenant's slug (default: every tenant)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenants = Tenant.objects.order_by("pk")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"no tenant with slug {options['tenant']!r}")
        for tenant in tenants:
            hours = rollups_rebuild(tenant.pk)
            self.stdout.write(f"{tenant.slug}: {hours} hours recomputed")
