"""Dashboard forms. They check the shape of what was typed; the domain services check the rest,
and their ``ValidationFailed`` messages (``"field: why"``) are shown beside the field they name."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django import forms
from django.contrib.auth.forms import UserCreationForm

from apps.common.exceptions import ValidationFailed
from apps.dashboard.selectors import NO_FEEDBACK, InteractionFilters
from apps.experiments.stats import METRICS, ExperimentConfig
from apps.interactions.models import Feedback
from apps.tenants.models import Membership
from apps.tenants.services import ALL_SCOPES
from apps.training.models import TrainingPolicy
from apps.training.overrides import gate_knobs, trainer_knobs


def attach_service_error(form: forms.Form, exc: ValidationFailed) -> None:
    """Put a service's ``"field: message"`` beside that field, else above the form."""
    name, sep, message = exc.message.partition(":")
    field = name.strip().split(".", 1)[0]  # "trainer_overrides.epochs: ..." belongs beside trainer_overrides
    if sep and field in form.fields:
        form.add_error(field, message.strip() if field == name.strip() else exc.message)
    else:
        form.add_error(None, exc.message)


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Where the key is used, e.g. “editor plugin” or “CI”.")
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in ALL_SCOPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="ingest: log interactions · feedback: send outcomes · serve: completions · admin: manage keys · "
        "editor: for an editor plugin's config (completions and feedback on them; no reads, gives no consent)",
    )
    default_opt_in = forms.TypedChoiceField(
        required=False,
        choices=[("", "The tenant's default"), ("true", "Opted in"), ("false", "Opted out")],
        coerce=lambda value: value == "true",
        empty_value=None,
        label="New end users",
        help_text="The consent of an end user this key names for the first time without saying it.",
    )


class TenantSettingsForm(forms.Form):
    """The tenant's own settings (the API's PATCH /v1/tenant, as a form)."""

    default_opt_in = forms.BooleanField(
        required=False, help_text="End users seen for the first time without a consent flag are opted in."
    )
    experiment_auto_promote = forms.BooleanField(
        required=False, help_text="An experiment that decides 'promote' promotes its candidate by itself."
    )
    experiment_auto_rollback = forms.BooleanField(
        required=False, help_text="An experiment that decides 'rollback' retires its candidate by itself."
    )
    accept_pending_feedback = forms.BooleanField(
        required=False, help_text="Keep feedback that arrives before its interaction, and attach it when it comes."
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
    reward_partial = forms.FloatField(
        help_text="A suggestion taken in part (word by word): the kept tokens earn the accepted reward, the "
        "first untaken one the rejected reward; this is the suggestion's overall value."
    )
    reward_thumbs_up = forms.FloatField(label="Reward thumbs up", help_text="Agents: the user liked the answer.")
    reward_thumbs_down = forms.FloatField(label="Reward thumbs down")
    reward_edit_persisted = forms.FloatField(help_text="Agents: the answer's edit was still there later.")
    reward_edit_reverted = forms.FloatField()
    reward_follow_up_dissatisfied = forms.FloatField(
        label="Reward dissatisfied follow-up", help_text="Agents: the user re-asked or corrected the answer."
    )
    reward_tool_call_failed = forms.FloatField(label="Reward failed tool call")
    show_gate = forms.BooleanField(
        required=False, help_text="Fit a show threshold per version: suggestions the model is unsure of are withheld."
    )
    show_gate_recall = forms.FloatField(
        label="Show gate recall", help_text="Share of the window's accepted suggestions the threshold keeps, 0.5–1."
    )
    show_gate_explore = forms.FloatField(
        label="Show gate exploration",
        help_text="Chance that a withheld suggestion is shown anyway, so the gate keeps learning, 0–1.",
    )
    auto_experiment = forms.BooleanField(
        required=False, help_text="Start an A/B experiment with each candidate that passes the eval gate."
    )
    trainer_overrides = JSONObjectField(
        help_text="PPO settings to override, as a JSON object. Allowed: " + ", ".join(trainer_knobs()) + "."
    )
    gate_overrides = JSONObjectField(
        help_text="Gate settings to override, as a JSON object. Allowed: " + ", ".join(gate_knobs()) + "."
    )

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


class ExperimentStartForm(forms.Form):
    """A candidate against production (the API's experiment create with ``start``, as a form)."""

    candidate_version = forms.TypedChoiceField(coerce=int, label="Candidate version")
    candidate_weight = forms.FloatField(
        initial=0.5,
        min_value=0.01,
        max_value=0.99,
        label="Candidate share",
        help_text="Share of the opted-in users the candidate serves (0.01–0.99); the rest get production.",
    )
    primary_metric = forms.ChoiceField(
        initial="reward_per_request", help_text="The metric a promotion rests on: significantly better to promote."
    )
    guardrails = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Any of these significantly worse rolls the candidate back.",
    )
    min_users_per_arm = forms.IntegerField(
        initial=100, min_value=2, max_value=10**7, label="Minimum users per arm", help_text="Before any promotion."
    )
    max_duration_days = forms.FloatField(
        initial=14,
        min_value=0.01,
        max_value=366,
        label="Maximum duration (days)",
        help_text="Past this, an experiment without a decision ends inconclusive.",
    )
    alpha = forms.FloatField(
        initial=0.05, min_value=0.001, max_value=0.2, label="Significance level α", help_text="0.001–0.2."
    )
    expected_users = forms.IntegerField(
        required=False,
        min_value=2,
        max_value=10**9,
        label="Expected users",
        help_text="Both arms together, by the end; the intervals are tightest there (N*).",
    )

    def __init__(self, *args: Any, candidates: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        metric_choices = [(name, m.label) for name, m in METRICS.items()]
        self.fields["candidate_version"].choices = candidates
        self.fields["primary_metric"].choices = metric_choices
        self.fields["guardrails"].choices = metric_choices
        self.fields["guardrails"].initial = list(ExperimentConfig().guardrails)
        self.fields["expected_users"].initial = int(ExperimentConfig().n_star)
        if candidates:
            self.fields["candidate_version"].initial = candidates[0][0]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        primary, guardrails = data.get("primary_metric"), data.get("guardrails") or []
        if primary and primary in guardrails:
            self.add_error("guardrails", "The primary metric cannot also be a guardrail: untick it here.")
        return data

    def config(self) -> dict[str, Any]:
        """The statistics' settings, as ``experiment_create`` takes them."""
        data = self.cleaned_data
        return {
            "primary_metric": data["primary_metric"],
            "guardrails": list(data["guardrails"]),
            "min_users_per_arm": data["min_users_per_arm"],
            "max_duration_s": data["max_duration_days"] * 86400,
            "alpha": data["alpha"],
            **({"n_star": float(data["expected_users"])} if data.get("expected_users") else {}),
        }


class EndUserSearchForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="End user id", help_text="Part of the tenant's own id.")
    state = forms.ChoiceField(
        required=False, choices=[("", "Anyone"), ("in", "Opted in"), ("out", "Opted out")], label="Consent"
    )


ROLE_LABELS = {
    Membership.Role.VIEWER: "Viewer: reads every page",
    Membership.Role.ADMIN: "Admin: also acts (promotes, trains, manages keys and the team)",
    Membership.Role.OWNER: "Owner: also manages owners",
}


def _role_field(field: forms.ChoiceField, grantable: list[str]) -> None:
    """Offer only the roles the member may give, yet accept any role: the service, not a form
    error, refuses one beyond the member's reach (an admin making an owner is a 403)."""
    field.choices = [(role, ROLE_LABELS[role]) for role in Membership.Role.values]
    field.widget.choices = [(role, ROLE_LABELS[role]) for role in grantable]


class InvitationCreateForm(forms.Form):
    role = forms.ChoiceField(initial=Membership.Role.VIEWER)
    note = forms.CharField(
        required=False,
        max_length=200,
        label="Email or name",
        help_text="Optional, for your team to recognise the invitation. Strop sends nothing: you hand the link over.",
    )

    def __init__(self, *args: Any, roles: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _role_field(self.fields["role"], roles)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label="New role")

    def __init__(self, *args: Any, roles: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _role_field(self.fields["role"], roles)


class InvitationSignupForm(UserCreationForm):
    """A new dashboard account, checked as Django checks one (a free username, two equal passwords
    that pass ``AUTH_PASSWORD_VALIDATORS``); the invitation service creates it."""

    class Meta(UserCreationForm.Meta):
        fields = ("username", "email")
        help_texts = {"email": "Optional: lets you reset a forgotten password by mail."}
