"""Dashboard forms. They check the shape of what was typed; the domain services check the rest,
and their ``ValidationFailed`` messages (``"field: why"``) are shown beside the field they name."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django import forms

from apps.common.exceptions import ValidationFailed
from apps.dashboard.selectors import NO_FEEDBACK, InteractionFilters
from apps.interactions.models import Feedback
from apps.tenants.services import ALL_SCOPES
from apps.training.models import TrainingPolicy


def attach_service_error(form: forms.Form, exc: ValidationFailed) -> None:
    """Put a service's ``"field: message"`` beside that field, else above the form."""
    name, sep, message = exc.message.partition(":")
    if sep and name.strip() in form.fields:
        form.add_error(name.strip(), message.strip())
    else:
        form.add_error(None, exc.message)


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Where the key is used, e.g. “editor plugin” or “CI”.")
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in ALL_SCOPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="ingest: log interactions · feedback: send outcomes · serve: completions · admin: manage keys",
    )


class JSONObjectField(forms.JSONField):
    widget = forms.Textarea(attrs={"rows": 4, "spellcheck": "false"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        if value in (None, ""):
            return {}
        result = super().to_python(value)
        if not isinstance(result, dict):
            raise forms.ValidationError('Enter a JSON object, e.g. {"learning_rate": 0.0001}.')
        return result


class TrainingPolicyForm(forms.Form):
    """The TrainingPolicy fields a tenant admin may change (the API's PATCH, as a form)."""

    enabled = forms.BooleanField(required=False, help_text="Start runs on their own when enough events arrive.")
    min_new_events = forms.IntegerField(min_value=0, help_text="New labelled events that start a run.")
    max_wait_s = forms.IntegerField(
        min_value=0, label="Max wait (s)", help_text="Start with fewer events once the oldest has waited this long."
    )
    heldout_fraction = forms.FloatField(help_text="Share of each window kept out of training for the gate, 0–0.9.")
    reward_accepted = forms.FloatField()
    reward_rejected = forms.FloatField()
    reward_not_shown = forms.FloatField(label="Reward not shown")
    reward_edited = forms.FloatField()
    trainer_overrides = JSONObjectField(help_text="PPO settings to override, as a JSON object.")
    gate_overrides = JSONObjectField(help_text="Gate settings to override, as a JSON object.")

    @classmethod
    def for_policy(cls, policy: TrainingPolicy, data: Any = None) -> TrainingPolicyForm:
        initial = {name: getattr(policy, name) for name in cls.base_fields}
        return cls(data=data, initial=initial)

    def changes(self, policy: TrainingPolicy) -> dict[str, Any]:
        """Only what differs from the stored policy, so the audit row says what really changed."""
        return {name: value for name, value in self.cleaned_data.items() if value != getattr(policy, name)}


OUTCOME_CHOICES = [("", "Any outcome"), *Feedback.Outcome.choices, (NO_FEEDBACK, "No feedback yet")]


class InteractionFilterForm(forms.Form):
    user = forms.CharField(required=False, max_length=200, label="End user")
    version = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, label="Version")
    outcome = forms.ChoiceField(required=False, choices=OUTCOME_CHOICES)
    since = forms.DateTimeField(
        required=False, label="From (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, label="To (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )

    def __init__(self, *args: Any, versions: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = [("", "Any version"), *versions]

    def filters(self) -> InteractionFilters:
        data = self.cleaned_data if self.is_valid() else {}
        return InteractionFilters(
            end_user_id=data.get("user") or "",
            version_id=data.get("version"),
            outcome=data.get("outcome") or "",
            since=_utc(data.get("since")),
            until=_utc(data.get("until")),
        )


def _utc(value: Any) -> Any:
    # The inputs say UTC (TIME_ZONE is UTC): an aware value is converted, never reinterpreted.
    return value.astimezone(UTC) if value is not None else None


class AuditFilterForm(forms.Form):
    action = forms.ChoiceField(required=False)
    actor = forms.CharField(required=False, max_length=200, help_text="e.g. user:3, key:ab12…, system")

    def __init__(self, *args: Any, actions: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["action"].choices = [("", "Any action"), *((a, a) for a in actions)]
