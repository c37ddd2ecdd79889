"""The training policy form: the TrainingPolicy fields a tenant admin may change on the adapter
page (the API's PATCH, as a form), with the eval gate's knobs in plain words."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.forms.fields import InvalidJSONInput

from apps.dashboard.forms import json_loads_strict
from apps.training.models import TrainingPolicy
from apps.training.overrides import Knob, gate_knobs, trainer_knobs
from gpu_trainer.gate_config import GateConfig


class JSONObjectField(forms.JSONField):
    """A JSON object, read strictly as the API reads one (:func:`json_loads_strict`): Django's field
    uses ``json.loads``, which takes lone surrogates (no page can show them) and fails outside its
    ``JSONDecodeError`` on deep nesting or an integer of thousands of digits."""

    widget = forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "placeholder": '{"learning_rate": 0.0001}'})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        if value in (None, ""):
            return {}
        if isinstance(value, str):
            try:
                value = json_loads_strict(value)
            except json.JSONDecodeError as exc:
                raise forms.ValidationError(
                    f"Not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): enter an object, "
                    'e.g. {"learning_rate": 0.0001}.',
                    code="invalid",
                ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError('Enter a JSON object, e.g. {"learning_rate": 0.0001}.')
        return value

    def bound_data(self, data: Any, initial: Any) -> Any:
        """What the page shows again after an error: the text as typed, unless it reads strictly."""
        if data is None:
            return None
        try:
            return json_loads_strict(data)
        except json.JSONDecodeError:
            return InvalidJSONInput(data)


# The eval gate's knobs in plain words (apps/training/overrides.py bounds them; GateConfig holds
# what each means in full). Each is its own optional field: empty keeps the default.
GATE_KNOB_TEXT = {
    "max_kl": ("How far a new version may move from its parent", "Mean per-token KL divergence, in nats."),
    "reward_margin": (
        "How much lower its reward may be",
        "On feedback kept aside, in reward units, against the version it was trained from.",
    ),
    "importance_cap": (
        "Most weight one kept-aside example may carry",
        "Caps any single example's influence on the reward estimate.",
    ),
    "min_heldout": (
        "Kept-aside examples needed to judge reward",
        "With fewer, the reward check is skipped (recorded as such), not failed.",
    ),
    "fim_margin": (
        "How much worse it may fill in the eval set",
        "Edit similarity, 0–1, against its parent, case by case: it is stopped only when it is clearly "
        "worse by more than this (the 95 % interval of the difference lies wholly below minus this value; "
        "under 5 cases, the mean difference). 1 turns the check off.",
    ),
    "feedback_direction_z": (
        "How far feedback may run against the model",
        "Stops a run whose accepted suggestions are those the model was least sure of (standard errors below "
        "chance, by the model's confidence): outcomes reported the wrong way round, which would teach it to "
        "unlearn. 0 turns the check off.",
    ),
    "max_fim_samples": ("Eval-set cases checked", "The first this many cases of the eval set."),
    "max_new_tokens": ("Longest eval-set answer (tokens)", "Each case's middle is decoded up to this length."),
}
GATE_FIELD_PREFIX = "gate_"
# The signals an agent's user gives (chat completions); a tab-completion adapter never receives them.
AGENT_REWARD_FIELDS = (
    "reward_thumbs_up",
    "reward_thumbs_down",
    "reward_tool_call_failed",
    "reward_edit_persisted",
    "reward_edit_reverted",
    "reward_follow_up_dissatisfied",
)
# Behind the page's "Advanced" disclosure: how learning is checked and tuned.
ADVANCED_FIELDS = ("heldout_fraction", "show_gate_recall", "show_gate_explore", "trainer_overrides")


def _gate_field(name: str, knob: Knob, default: Any) -> forms.Field:
    label, help_text = GATE_KNOB_TEXT.get(name, (name.replace("_", " ").capitalize(), ""))
    bounds = f"{knob.low:g}–{knob.high:g}, default {default:g}."
    # An integer knob's bounds are whole numbers held as floats (the knob table's one type).
    field_class: Any = forms.IntegerField if knob.kind is int else forms.FloatField
    return field_class(
        required=False,
        min_value=knob.low,
        max_value=knob.high,
        label=label,
        help_text=f"{help_text} {bounds}".strip(),
        widget=forms.NumberInput(attrs={"placeholder": f"{default:g}", "step": "any"}),
    )


class TrainingPolicyForm(forms.Form):
    """The TrainingPolicy fields a tenant admin may change (the API's PATCH, as a form). Labels say
    what a setting does; the ML terms are in the help and behind "Advanced"."""

    enabled = forms.BooleanField(
        required=False,
        label="Train automatically",
        help_text="Start a training run by itself once enough new feedback has arrived.",
    )
    min_new_events = forms.IntegerField(
        min_value=0,
        label="New feedback before a run",
        help_text="Feedback events from opted-in users since the last run.",
    )
    max_wait_s = forms.IntegerField(
        min_value=0,
        label="Or at most wait (seconds)",
        help_text="Start with less feedback once the oldest has waited this long.",
    )
    reward_accepted = forms.FloatField(label="Accepted", help_text="The suggestion was taken as it was.")
    reward_rejected = forms.FloatField(label="Rejected", help_text="It was dismissed or typed over.")
    reward_edited = forms.FloatField(label="Edited", help_text="Taken, then changed (the kept part counts).")
    reward_partial = forms.FloatField(
        label="Taken in part",
        help_text="Taken word by word: the kept words earn the accepted reward, the first untaken one the "
        "rejected reward; this is the suggestion's overall value.",
    )
    reward_not_shown = forms.FloatField(label="Not shown", help_text="The editor never displayed it.")
    reward_thumbs_up = forms.FloatField(label="Thumbs up", help_text="The user liked the answer.")
    reward_thumbs_down = forms.FloatField(label="Thumbs down", help_text="The user disliked it.")
    reward_tool_call_failed = forms.FloatField(label="A tool call failed", help_text="A call the answer made failed.")
    reward_edit_persisted = forms.FloatField(
        label="Its edit stayed", help_text="The code the answer wrote was still in the file later."
    )
    reward_edit_reverted = forms.FloatField(label="Its edit was undone", help_text="The user reverted it.")
    reward_follow_up_dissatisfied = forms.FloatField(
        label="The user was not satisfied", help_text="They asked again or corrected the answer."
    )
    show_gate = forms.BooleanField(
        required=False,
        label="Hold back unsure suggestions",
        help_text="Each version learns a threshold: suggestions it is unsure of are not shown.",
    )
    auto_experiment = forms.BooleanField(
        required=False,
        label="Test each new version on some users first",
        help_text="Start an A/B experiment with each candidate that passes its checks.",
    )
    credit_retained = forms.BooleanField(
        required=False,
        label="Reward what developers keep",
        help_text="An accepted suggestion earns its reward only for the characters still in the file at its "
        "latest persistence report, token by token (editors that send persistence reports).",
    )
    heldout_fraction = forms.FloatField(
        label="Feedback kept aside to check a new version",
        help_text="Share of each run's feedback not trained on, for the eval gate, 0–0.9.",
    )
    show_gate_recall = forms.FloatField(
        label="Accepted suggestions still shown",
        help_text="Share of the accepted suggestions the held-back threshold must keep, 0.5–1 (show gate recall).",
    )
    show_gate_explore = forms.FloatField(
        label="Chance to show a held-back suggestion",
        help_text="So that the threshold keeps learning from what it holds back, 0–1 (show gate exploration).",
    )
    trainer_overrides = JSONObjectField(
        label="Trainer settings (PPO)",
        help_text='A JSON object of settings to override, e.g. {"learning_rate": 0.0001, "epochs": 2}. '
        "Allowed: " + ", ".join(trainer_knobs()) + ".",
    )

    def __init__(self, *args: Any, agent: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent = agent
        defaults = GateConfig()
        for name, knob in gate_knobs().items():
            self.fields[GATE_FIELD_PREFIX + name] = _gate_field(name, knob, getattr(defaults, name))
        if not agent:  # not on the page: the stored values stay as they are
            for name in AGENT_REWARD_FIELDS:
                self.fields[name].required = False

    @classmethod
    def for_policy(cls, policy: TrainingPolicy, data: Any = None, *, agent: bool = True) -> TrainingPolicyForm:
        initial = {name: getattr(policy, name) for name in cls.base_fields}
        initial.update({GATE_FIELD_PREFIX + k: v for k, v in (policy.gate_overrides or {}).items()})
        # An agent reward someone set is shown even where no agent has been seen yet.
        agent = agent or any(getattr(policy, name) != _model_default(name) for name in AGENT_REWARD_FIELDS)
        return cls(data=data, initial=initial, agent=agent)

    @property
    def gate_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name.startswith(GATE_FIELD_PREFIX)]

    @property
    def agent_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in AGENT_REWARD_FIELDS]

    @property
    def advanced_has_errors(self) -> bool:
        return any(name in self.errors for name in ADVANCED_FIELDS) or any(f.errors for f in self.gate_fields)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        gate = {}
        for name in list(data):
            if name.startswith(GATE_FIELD_PREFIX):
                value = data.pop(name)
                if value is not None:
                    gate[name.removeprefix(GATE_FIELD_PREFIX)] = value
        data["gate_overrides"] = gate
        return data

    def error_field_for(self, name: str) -> str:
        """The field beside which a service's error on ``name`` is shown (a gate knob has its own)."""
        if name.startswith("gate_overrides."):
            knob = GATE_FIELD_PREFIX + name.split(".", 1)[1]
            if knob in self.fields:
                return knob
        return name.split(".", 1)[0]

    def changes(self, policy: TrainingPolicy) -> dict[str, Any]:
        """Only what differs from the stored policy, so the audit row says what really changed
        (an agent's reward left off the page is not a change)."""
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if value is not None and value != getattr(policy, name)
        }


def _model_default(name: str) -> Any:
    """The default of the training policy's field ``name``."""
    field: Any = TrainingPolicy._meta.get_field(name)
    return field.default
