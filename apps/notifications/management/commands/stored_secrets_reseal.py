"""Seal every stored secret (webhook signing secrets) under the current STORED_SECRETS_KEY: after a
key rotation, so the old key can leave STORED_SECRETS_KEY_FALLBACKS."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.notifications.services import webhook_secrets_reseal


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: Any, **options: Any) -> None:
        report = webhook_secrets_reseal()
        self.stdout.write(
            f"webhook secrets: {report.resealed} resealed under key {report.key_id}, {report.current} already "
            f"were, {report.dropped} expired previous secrets that no key opens dropped"
        )
        if report.unreadable:
            raise CommandError(
                f"{len(report.unreadable)} webhook(s) hold a secret that opens under none of the configured keys "
                f"(webhooks {', '.join(map(str, sorted(report.unreadable)))}): add the key it was sealed under to "
                "STORED_SECRETS_KEY_FALLBACKS and run this again, or rotate those webhooks' secrets"
            )
