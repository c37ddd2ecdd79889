"""Dashboard forms. They check the shape of what was typed; the domain services check the rest,
and their ``ValidationFailed`` messages (``"field: why"``) are shown beside the field they name."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm, UserCreationForm

from apps.common.exceptions import ValidationFailed
from apps.common.parsers import parse_json_bytes
from apps.dashboard.selectors import NO_FEEDBACK, InteractionFilters
from apps.experiments.stats import METRICS, ExperimentConfig
from apps.interactions.models import Feedback
from apps.notifications.models import EVENTS
from apps.tenants.models import RETENTION_DAYS_MOST, Membership
from apps.tenants.services import ALL_SCOPES


def choice_field(form: forms.BaseForm, name: str) -> forms.ChoiceField:
    """The form's field ``name``, a choice field whose choices are set per instance."""
    field = form.fields[name]
    if not isinstance(field, forms.ChoiceField):
        raise TypeError(f"{type(form).__name__}.{name} is not a choice field")
    return field


def attach_service_error(form: forms.BaseForm, exc: ValidationFailed) -> None:
    """Put a service's ``"field: message"`` beside that field, else above the form."""
    name, sep, message = exc.message.partition(":")
    name = name.strip()
    # "trainer_overrides.epochs: ..." belongs beside trainer_overrides, unless the form has a field of its own.
    error_field_for = getattr(form, "error_field_for", None)
    field = error_field_for(name) if error_field_for else name.split(".", 1)[0]
    if sep and field in form.fields:
        # A field of the name's own shows the reason alone; a parent field, the whole message naming the key.
        own = field == name or field != name.split(".", 1)[0]
        form.add_error(field, message.strip() if own else exc.message)
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


class WebhookCreateForm(forms.Form):
    url = forms.CharField(
        max_length=500, label="Endpoint URL", help_text="https, on a public address; Strop POSTs JSON to it."
    )
    events = forms.MultipleChoiceField(
        choices=list(EVENTS.items()),
        widget=forms.CheckboxSelectMultiple,
        initial=list(EVENTS),
        help_text="What Strop tells this endpoint about.",
    )


class TenantSettingsForm(forms.Form):
    """The tenant's own settings (the API's PATCH /v1/tenant, as a form)."""

    default_opt_in = forms.BooleanField(
        required=False,
        label="Opt new end users in",
        help_text="End users seen for the first time without a consent flag are opted in.",
    )
    experiment_auto_promote = forms.BooleanField(
        required=False,
        label="Promote winners automatically",
        help_text="An experiment that decides 'promote' promotes its candidate by itself.",
    )
    experiment_auto_rollback = forms.BooleanField(
        required=False,
        label="Roll back losers automatically",
        help_text="An experiment that decides 'rollback' retires its candidate by itself.",
    )
    accept_pending_feedback = forms.BooleanField(
        required=False,
        label="Keep early feedback",
        help_text="Keep feedback that arrives before its interaction, and attach it when it comes.",
    )
    retention_days = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=RETENTION_DAYS_MOST,
        label="Keep interactions for (days)",
        help_text="Older interactions and their feedback are deleted within the hour, except what a running "
        "experiment, a training window or a live version's erase report needs; the charts keep their history. "
        "Empty: the operator's maximum, or forever.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        most = int(settings.STROP_RETENTION_MAX_DAYS)
        if most:  # the bound that applies, stated where it is set (the service refuses more)
            field = self.fields["retention_days"]
            field.help_text = field.help_text.replace(
                "Empty: the operator's maximum, or forever.",
                f"At most {most} (the operator's maximum), which a stored value above it is cut to; empty: {most}.",
            )


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
        choice_field(self, "version").choices = [("", "Any version"), *versions]

    def clean_since(self) -> datetime | None:
        return _utc(self.cleaned_data["since"])

    def clean_until(self) -> datetime | None:
        return _utc(self.cleaned_data["until"])

    def filters(self) -> InteractionFilters | None:
        """The filters typed (none typed: every interaction), or None when one is invalid: its error is
        on the form, and neither the page nor the download may list more than was asked for."""
        if not self.is_bound:
            return InteractionFilters()
        if not self.is_valid():
            return None
        data = self.cleaned_data
        return InteractionFilters(
            end_user_id=data["user"],
            version_id=data["version"],
            outcome=data["outcome"],
            since=data["since"],
            until=data["until"],
        )


def _utc(value: datetime | None) -> datetime | None:
    # The inputs say UTC (TIME_ZONE is UTC): an aware value is converted, never reinterpreted.
    if value is None:
        return None
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-01:00 is in the year 10000 in UTC, which no datetime holds
        raise forms.ValidationError("This time is outside the years 1 to 9999 once converted to UTC.") from None


def json_loads_strict(text: str) -> Any:
    """``text`` read as the API reads a JSON body (:func:`parse_json_bytes`, orjson): NaN, Infinity,
    a lone surrogate, a number beyond a double's range and nesting past 1,024 levels are refused,
    where ``json.loads`` lets them through to the database or fails with an error no form expects
    (RecursionError, ValueError). Raises json.JSONDecodeError only, saying what and where."""
    try:
        return parse_json_bytes(text.encode("utf-8", "surrogatepass"))
    except ValidationFailed as exc:
        cause = exc.__cause__
        if not isinstance(cause, json.JSONDecodeError):  # an empty text, which callers check first
            raise json.JSONDecodeError(exc.message, text, 0) from None
        # orjson's own words ("number is infinity when parsed as double" for 1e400), but for NaN, which
        # it calls an "unexpected character", the API's.
        nan = exc.code == "non_finite_number" and "infinity" not in cause.msg.lower()
        what = "NaN and Infinity are not JSON numbers" if nan else cause.msg
        raise json.JSONDecodeError(what, cause.doc, cause.pos) from None


class AuditFilterForm(forms.Form):
    action = forms.ChoiceField(required=False)
    actor = forms.CharField(required=False, max_length=200, help_text="e.g. user:3, key:ab12…, system")

    def __init__(self, *args: Any, actions: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choice_field(self, "action").choices = [("", "Any action"), *((a, a) for a in actions)]


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
    secondary_metrics = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Secondary metrics",
        help_text="Reported beside the primary, deciding nothing (for an agent adapter: the positive rates).",
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
        choice_field(self, "candidate_version").choices = candidates
        choice_field(self, "primary_metric").choices = metric_choices
        choice_field(self, "guardrails").choices = metric_choices
        choice_field(self, "secondary_metrics").choices = metric_choices
        self.fields["guardrails"].initial = list(ExperimentConfig().guardrails)
        self.fields["secondary_metrics"].initial = list(ExperimentConfig().secondary_metrics)
        self.fields["expected_users"].initial = int(ExperimentConfig().n_star)
        if candidates:
            self.fields["candidate_version"].initial = candidates[0][0]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
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
            "secondary_metrics": list(data["secondary_metrics"]),
            "min_users_per_arm": data["min_users_per_arm"],
            "max_duration_s": data["max_duration_days"] * 86400,
            "alpha": data["alpha"],
            **({"n_star": float(data["expected_users"])} if data.get("expected_users") else {}),
        }


class EndUserSearchForm(forms.Form):
    q = forms.CharField(
        required=False,
        max_length=200,
        label="End user id",
        help_text="Part of the tenant's own id; 1 or 2 characters find ids that start with them.",
    )
    state = forms.ChoiceField(
        required=False, choices=[("", "Anyone"), ("in", "Opted in"), ("out", "Opted out")], label="Consent"
    )


ROLE_LABELS: dict[str, str] = {
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
        _role_field(choice_field(self, "role"), roles)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label="New role")

    def __init__(self, *args: Any, roles: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _role_field(choice_field(self, "role"), roles)


class StrengthBesidePasswordMixin:
    """Django checks a new password's strength on its confirmation field; the dashboard says why a
    password is refused beside the password itself (a mismatch stays beside the confirmation)."""

    FIRST_OF = {"password2": "password1", "new_password2": "new_password1"}

    def validate_password_for_user(self, user: Any, password_field_name: str = "password2", **kwargs: Any) -> None:
        first = self.FIRST_OF.get(password_field_name, password_field_name)
        super().validate_password_for_user(user, password_field_name=first, **kwargs)  # type: ignore[misc]


class DashboardSetPasswordForm(StrengthBesidePasswordMixin, SetPasswordForm):
    """Setting a password from a reset link."""


class DashboardPasswordChangeForm(StrengthBesidePasswordMixin, PasswordChangeForm):
    """Changing one's own password."""


class InvitationSignupForm(StrengthBesidePasswordMixin, UserCreationForm):
    """A new dashboard account, checked as Django checks one (a free username, two equal passwords
    that pass ``AUTH_PASSWORD_VALIDATORS``); the invitation service creates it."""

    class Meta(UserCreationForm.Meta):
        fields = ("username", "email")
        help_texts = {"email": "Optional: lets you reset a forgotten password by mail."}
