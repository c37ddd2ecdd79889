from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from apps.common.exceptions import ApplicationError
from apps.tenants.models import Membership, Tenant
from apps.tenants.services import membership_create


class Command(BaseCommand):
    help = (
        "Create a dashboard user with a role in a tenant (an existing user gets the role). "
        "Prints the password when it was generated."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--role", default=Membership.Role.VIEWER, choices=Membership.Role.values)
        parser.add_argument(
            "--password", help="default: a generated one, printed once; checked by AUTH_PASSWORD_VALIDATORS"
        )
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant with slug {options['tenant']!r}")
        users = get_user_model().objects
        generated = None
        with transaction.atomic():
            user = users.filter(username=options["username"]).first()
            if options["password"]:
                # The same validators as the dashboard's password change, against this user's name and email.
                candidate = user or users.model(username=options["username"], email=options["email"])
                try:
                    validate_password(options["password"], user=candidate)
                except ValidationError as exc:
                    raise CommandError("password refused: " + " ".join(exc.messages)) from exc
            if user is None:
                password = options["password"] or (generated := secrets.token_urlsafe(12))
                user = users.create_user(username=options["username"], email=options["email"], password=password)
            elif options["password"]:
                user.set_password(options["password"])
                user.save(update_fields=["password"])
            existing = Membership.objects.filter(tenant=tenant, user=user).first()
            if existing is not None and existing.role != options["role"]:
                raise CommandError(
                    f"{user.get_username()} is already {existing.role} of {tenant.slug}; change the role on the "
                    f"Team page (/dashboard/t/{tenant.slug}/team/)"
                )
            if existing is None:
                try:
                    membership_create(tenant, user=user, role=options["role"], actor="operator")
                except ApplicationError as exc:
                    raise CommandError(exc.message) from exc
        self.stdout.write(f"user {user.get_username()} is {options['role']} of {tenant.slug}")
        if generated:
            self.stdout.write(f"password (shown once): {generated}")
