from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.common.exceptions import ApplicationError
from apps.tenants.models import Tenant
from apps.tenants.services import ALL_SCOPES, DEFAULT_SCOPES, api_key_create


class Command(BaseCommand):
    help = "Issue another API key for an existing tenant; prints the key once (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("--name", default="operator key")
        parser.add_argument(
            "--scopes",
            default=",".join(DEFAULT_SCOPES),
            help="comma-separated key scopes, of " + ", ".join(ALL_SCOPES) + " (editor: an editor plugin's key, alone)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant with slug {options['tenant']!r}")
        try:
            issued = api_key_create(
                tenant,
                name=options["name"],
                scopes=[s.strip() for s in options["scopes"].split(",") if s.strip()],
                actor="operator",
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(issued.raw_key)
