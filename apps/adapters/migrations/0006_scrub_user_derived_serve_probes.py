"""Versions made before the synthetic serve probe kept one cut from a training sample: the token ids
of an end user's prompt and completion (and the trainer's log-probs of them). Those go. The version
then has no probe: it keeps serving (loading checks the digest, not the probe), and an experiment
with it as candidate is refused until an operator records the synthetic probe with
``manage.py adapter_version_reprobe``. ``serve_probe_scrubbed`` says why the probe is missing."""

from django.db import migrations

SYNTHETIC = "synthetic"


def scrub_serve_probes(apps, schema_editor):
    version_model = apps.get_model("adapters", "AdapterVersion")
    for version in version_model.objects.filter(metrics__has_key="serve_probe").only("pk", "metrics").iterator():
        metrics = dict(version.metrics or {})
        probe = metrics.get("serve_probe")
        if isinstance(probe, dict) and probe.get("source") == SYNTHETIC:
            continue
        metrics.pop("serve_probe", None)
        metrics["serve_probe_scrubbed"] = True
        version_model.objects.filter(pk=version.pk).update(metrics=metrics)


class Migration(migrations.Migration):
    dependencies = [("adapters", "0005_version_store_digest_steps")]

    operations = [migrations.RunPython(scrub_serve_probes, migrations.RunPython.noop)]
