"""Webhook secrets stored in the clear before ``notifications.0004`` are sealed by it, and opened
again by its reverse; deliveries go on signing with the same secrets."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.common.stored_secrets import current_key_id, sealed_by

pytestmark = pytest.mark.django_db(transaction=True)  # migrations run outside the test's transaction

BEFORE = [("notifications", "0003_audit_rows_keep_webhook_hosts_only")]
SEALED = [("notifications", "0004_webhook_secrets_sealed")]


def _stored() -> dict[int, tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, secret, previous_secret FROM notifications_webhook")
        return {pk: (secret, previous) for pk, secret, previous in cursor.fetchall()}


def test_the_migration_seals_the_secrets_stored_in_the_clear_and_its_reverse_opens_them(make_tenant, migrate_to):
    tenant = make_tenant("old-hooks")
    webhooks = migrate_to(BEFORE).get_model("notifications", "Webhook").objects
    rotated = webhooks.create(
        tenant_id=tenant.pk, url="https://hooks.example.com/a", events=["run.failed"],
        secret="whsec_new-one", previous_secret="whsec_old-one",
    )  # fmt: skip
    fresh = webhooks.create(tenant_id=tenant.pk, url="https://hooks.example.com/b", events=[], secret="whsec_only")

    new = migrate_to(SEALED).get_model("notifications", "Webhook").objects
    stored = _stored()
    assert sealed_by(stored[rotated.pk][0], current_key_id()) and sealed_by(stored[rotated.pk][1], current_key_id())
    assert sealed_by(stored[fresh.pk][0], current_key_id()) and stored[fresh.pk][1] == ""
    assert not any("whsec_" in value for pair in stored.values() for value in pair)
    assert (new.get(pk=rotated.pk).secret, new.get(pk=rotated.pk).previous_secret) == ("whsec_new-one", "whsec_old-one")

    migrate_to(BEFORE)
    assert _stored() == {rotated.pk: ("whsec_new-one", "whsec_old-one"), fresh.pk: ("whsec_only", "")}
