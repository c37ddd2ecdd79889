"""Audit rows of webhooks keep the host, not the URL: a URL often carries a token, and every member
(viewers included) reads the audit log. Rows written before this keep the host of their URL."""

from urllib.parse import urlsplit

from django.db import migrations


def _hosts_only(apps, schema_editor):
    AuditEvent = apps.get_model("tenants", "AuditEvent")
    for event in AuditEvent.objects.filter(action__startswith="webhook.", data__has_key="url").iterator():
        data = dict(event.data)
        url = str(data.pop("url"))
        data["host"] = urlsplit(url).netloc.rpartition("@")[2] or url[:40]
        event.data = data
        event.save(update_fields=["data"])


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0002_webhook_secret_rotation_and_delivery_claims"),
        ("tenants", "0004_invitations"),
    ]

    operations = [migrations.RunPython(_hosts_only, migrations.RunPython.noop)]
