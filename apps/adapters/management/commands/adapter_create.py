from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.adapters.models import Adapter
from apps.adapters.selectors import base_model_get
from apps.adapters.services import adapter_create
from apps.common.exceptions import ApplicationError
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant's adapter on a registered base model."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("name", help="the adapter's name (what the tenant sends as `model`)")
        parser.add_argument("--base", required=True, help="the base model's name")
        parser.add_argument("--default", action="store_true", help="serve requests that name no model")
        parser.add_argument("--exists-ok", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant with slug {options['tenant']!r}")
        if options["exists_ok"] and Adapter.objects.filter(tenant=tenant, name=options["name"]).exists():
            return
        try:
            adapter = adapter_create(
                tenant,
                name=options["name"],
                base_model=base_model_get(name=options["base"]),
                is_default=options["default"],
                actor="operator",
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"adapter {adapter}")
