"""The typed results carry every field the API answers with (and no other), and the calls that
send settings take every field the API accepts: checked against the server's own serializers,
so a field added to the API fails here until the SDK has it."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import strop
from strop._async_experiments import AsyncExperiments
from strop._async_management import AsyncTenantResource, AsyncTrainingPolicies
from strop._experiments import Experiments
from strop._management import TenantResource, TrainingPolicies

from apps.adapters.apis import AdapterOut, AdapterVersionOut
from apps.cohorts.apis import EndUserOut
from apps.experiments.apis import ExperimentCreateIn, ExperimentOut, HoldoutIn, HoldoutOut, SnapshotOut
from apps.interactions.apis import InteractionOut
from apps.interactions.persistence_apis import InteractionPersistenceOut, PersistenceCheckpointOut
from apps.serving.assignment import Assignment
from apps.tenants.apis import ApiKeyCreatedOut, AuditEventOut, TenantOut, TenantSettingsIn
from apps.training.apis import TrainingPolicyOut, TrainingRunOut
from apps.training.services import POLICY_FIELDS

pytestmark = pytest.mark.django_db


def fields_of(result: type) -> set[str]:
    return {field.name for field in dataclasses.fields(result)} - {"raw"}


def keywords_of(method: Any, *positional: str) -> set[str]:
    return set(inspect.signature(method).parameters) - {"self", *positional}


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        (strop.Tenant, {*TenantOut().fields, "key"}),
        (strop.ApiKey, set(ApiKeyCreatedOut().fields)),
        (strop.AuditEvent, set(AuditEventOut().fields)),
        (strop.Adapter, set(AdapterOut().fields)),
        (strop.AdapterVersion, set(AdapterVersionOut().fields)),
        (strop.TrainingPolicy, set(TrainingPolicyOut().fields)),
        (strop.TrainingRun, set(TrainingRunOut().fields)),
        (strop.Experiment, set(ExperimentOut().fields)),
        (strop.Snapshot, set(SnapshotOut().fields)),
        (strop.Holdout, set(HoldoutOut().fields)),
        (strop.Assignment, {field.name for field in dataclasses.fields(Assignment)}),
        (strop.Interaction, {*InteractionOut().fields, "created"}),
        (strop.InteractionPersistence, set(InteractionPersistenceOut().fields)),
        (strop.PersistenceCheckpoint, set(PersistenceCheckpointOut().fields)),
        (strop.EndUser, set(EndUserOut().fields)),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_a_typed_result_has_the_fields_of_the_answer(result, answer):
    assert fields_of(result) == answer


@pytest.mark.parametrize(
    ("method", "positional", "accepted"),
    [
        (TenantResource.update, (), set(TenantSettingsIn().fields)),
        (AsyncTenantResource.update, (), set(TenantSettingsIn().fields)),
        (TrainingPolicies.update, ("adapter",), set(POLICY_FIELDS)),
        (AsyncTrainingPolicies.update, ("adapter",), set(POLICY_FIELDS)),
        (Experiments.create, ("adapter",), set(ExperimentCreateIn().fields)),
        (AsyncExperiments.create, ("adapter",), set(ExperimentCreateIn().fields)),
        (Experiments.set_holdout, ("adapter",), set(HoldoutIn().fields)),
        (AsyncExperiments.set_holdout, ("adapter",), set(HoldoutIn().fields)),
    ],
    ids=lambda value: value.__qualname__ if callable(value) else "",
)
def test_a_call_that_sends_settings_takes_every_field_the_api_accepts(method, positional, accepted):
    assert keywords_of(method, *positional) == accepted
