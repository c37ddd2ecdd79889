from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.common.exceptions import ApplicationError, Conflict
from apps.tenants.services import ALL_SCOPES, DEFAULT_SCOPES, tenant_create_with_key


class Command(BaseCommand):
    help = "Create a tenant and its first API key (printed once; only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the tenant's display name")
        parser.add_argument("--slug", help="URL-safe identifier (default: from the name)")
        parser.add_argument(
            "--scopes",
            default=",".join(DEFAULT_SCOPES),
            help="comma-separated key scopes, of " + ", ".join(ALL_SCOPES) + " (editor: an editor plugin's key, alone)",
        )
        parser.add_argument("--rate-limit", type=int, default=0, help="requests per minute (0 = platform default)")
        parser.add_argument("--key-only", action="store_true", help="print only the key (for scripts)")
        parser.add_argument(
            "--exists-ok", action="store_true", help="do nothing if the slug (given, or made from the name) exists"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant, issued = tenant_create_with_key(
                name=options["name"],
                slug=options["slug"],
                rate_limit_per_minute=options["rate_limit"],
                scopes=[s.strip() for s in options["scopes"].split(",") if s.strip()],
                key_name="first key",
            )
        except Conflict as exc:
            # The service made the slug (given, or from the name) and found it taken; it wrote nothing.
            if options["exists_ok"] and exc.code == "tenant_exists":
                return
            raise CommandError(exc.message) from exc
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        if options["key_only"]:
            self.stdout.write(issued.raw_key)
            return
        self.stdout.write(f"tenant: {tenant.slug}\nscopes: {','.join(issued.api_key.scopes)}")
        self.stdout.write(f"API key (shown once, store it now): {issued.raw_key}")
