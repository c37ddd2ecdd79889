"""Webhook signing secrets stored encrypted under STORED_SECRETS_KEY (apps.common.stored_secrets): the
columns become text (a sealed value is longer than the 80 characters a secret took), then every
secret stored so far in the clear is sealed. Back: each one opened and written in the clear again."""

from django.db import migrations

import apps.common.stored_secrets

COLUMNS = ("secret", "previous_secret")
PURPOSE = "webhook.secret"


def _rows(schema_editor):
    table = schema_editor.quote_name("notifications_webhook")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT id, secret, previous_secret FROM {table}")
        return cursor.fetchall()


def _rewrite(schema_editor, rows, change):
    """Each row's two columns as ``change`` makes them, in one statement a row (a second update of a
    row this transaction wrote queues a foreign-key check, which the reverse's ALTER TABLE refuses)."""
    table = schema_editor.quote_name("notifications_webhook")
    with schema_editor.connection.cursor() as cursor:
        for pk, *values in rows:
            pairs = zip(COLUMNS, values, strict=True)
            new = [change(pk, column, stored) if stored else stored for column, stored in pairs]
            if new != values:
                cursor.execute(f"UPDATE {table} SET secret = %s, previous_secret = %s WHERE id = %s", [*new, pk])


def seal_existing(apps, schema_editor):
    """Each secret in the clear, sealed in place (one sealed already is left as it is)."""
    from apps.common.stored_secrets import is_sealed, sealed

    def seal(pk, column, stored):
        return stored if is_sealed(stored) else sealed(stored, purpose=PURPOSE)

    _rewrite(schema_editor, _rows(schema_editor), seal)


def open_all(apps, schema_editor):
    """Each sealed secret written in the clear again; one no configured key opens stops it."""
    from apps.common.stored_secrets import Unreadable, is_sealed, opened

    def open_(pk, column, stored):
        if not is_sealed(stored):
            return stored
        plain = opened(stored, purpose=PURPOSE)
        if isinstance(plain, Unreadable):
            raise RuntimeError(f"webhook {pk}: its {column} opens under no configured key: {plain}")
        return plain

    _rewrite(schema_editor, _rows(schema_editor), open_)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0003_audit_rows_keep_webhook_hosts_only"),
    ]

    operations = [
        migrations.AlterField(
            model_name="webhook",
            name="previous_secret",
            field=apps.common.stored_secrets.SealedTextField(
                blank=True,
                help_text="the secret before the last rotation: it also signs until its expiry",
                purpose="webhook.secret",
            ),
        ),
        migrations.AlterField(
            model_name="webhook",
            name="secret",
            field=apps.common.stored_secrets.SealedTextField(
                help_text="signs deliveries (HMAC-SHA256); shown once", purpose="webhook.secret"
            ),
        ),
        migrations.RunPython(seal_existing, open_all),
    ]
