"""A run whose parent leaves the lineage while it trains (the parent lost its A/B test, or an alarm or
a person rolled it back) registers nothing: what it learned on top of the retired version would
become the head every later run builds on. It ends failed, saying why, and a run from the adapter's
current head is queued in its place."""

from __future__ import annotations

import pytest

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_register
from apps.training.models import TrainingRun
from apps.training.services import RERUN_FROM_HEAD_TRIGGER, training_schedule


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_parent_is_retired_while_it_trains_registers_nothing_and_reruns_from_the_head(
    tenant, tiny_adapter, add_events, make_lora_adapter, monkeypatch, execute_run
):
    import apps.training.pipeline as pipeline

    v1 = adapter_version_register(tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(1), enqueue_load=False)
    add_events(20)
    run = training_schedule(tiny_adapter, force=True)
    assert run.parent_version_id == v1.pk  # the head: the newest version fit to serve
    real_export = pipeline.dataset_export

    def export_then_retire(run_, **kwargs):
        window = real_export(run_, **kwargs)
        AdapterVersion.objects.filter(pk=v1.pk).update(status=AdapterVersion.Status.RETIRED)  # its A/B test lost
        return window

    monkeypatch.setattr(pipeline, "dataset_export", export_then_retire)
    assert execute_run(run) == "failed"

    run.refresh_from_db()
    assert run.status == "failed" and run.output_version is None
    assert run.error.startswith("discarded: version 1, which it trained from, became retired while it ran")
    assert list(AdapterVersion.objects.values_list("number", flat=True)) == [1]  # no child of the retired one
    rerun = TrainingRun.objects.exclude(pk=run.pk).get()
    assert (rerun.status, rerun.trigger, rerun.parent_version_id) == ("queued", RERUN_FROM_HEAD_TRIGGER, None)
