"""The autocomplete outcome an editor plugin reports (Continue's ``AutocompleteOutcome``).

Continue posts every dev-data event to one destination URL inside an envelope
``{"name", "data", "schema", "level", "profileId"}`` (schemas "0.1.0" and "0.2.0"; level "all",
or "noCode" without prefix, suffix, prompt and completion). The bare outcome is taken too.

An outcome becomes feedback on the completion Strop served, when there is one: Continue's
``completionId`` is its own, but the ``prompt`` it logs is exactly the prompt it sent, so the
served interaction is the recent one of this tenant with that prompt whose completion the shown
text begins, served to the same developer (or to nobody named: Continue sends no user with its
completions unless configured to). One developer's outcome never lands on another's completion.
That interaction takes the ``completionId`` as its client id (a replay finds it again), and the
feedback lands on the tokens vLLM sampled. Without such a match the outcome is
logged as an interaction of its own. A noCode outcome has no text: it is recorded, with its
feedback, but there is nothing in it to learn from or to count as a shown suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.cohorts.services import end_users_observe
from apps.common.item_checks import ItemError, item_id, item_text
from apps.common.parsing import end_user_id_problem, json_problem
from apps.interactions.models import Interaction
from apps.interactions.served import SERVED_BY_KEY
from apps.interactions.services import ItemResult, feedback_ingest, interactions_ingest

# The outcome fields Strop maps onto an interaction; everything else is kept in its metadata.
_MAPPED = {
    "completionId",
    "prefix",
    "suffix",
    "prompt",
    "completion",
    "modelName",
    "uniqueId",
    "userId",
    "time",
    "accepted",
    "timestamp",
}
_ENVELOPE = {"name", "data", "schema", "level", "profileId"}
SERVED_MATCH_WINDOW = timedelta(minutes=30)  # Continue logs a rejection 10 s after display


@dataclass
class EditorOutcome:
    """What one posted body became."""

    ignored: str | None = None  # why nothing was stored (an event that is not an autocomplete outcome)
    interaction: ItemResult | None = None
    feedback: ItemResult | None = None
    linked: bool = False  # the feedback landed on a completion Strop served


def _timestamp(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ItemError("timestamp", "must be an ISO 8601 string or milliseconds since the epoch")
    if isinstance(value, str):
        return value
    try:
        return datetime.fromtimestamp(value / 1000, tz=UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        raise ItemError("timestamp", f"{value!r} ms since the epoch is not a date from year 1 to 9999") from None


def _unwrap(payload: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(event name, the outcome, envelope fields worth keeping) of an enveloped or bare body."""
    if not isinstance(payload, dict):
        raise ItemError("body", "must be a JSON object (an autocomplete outcome, or Continue's event envelope)")
    if "data" in payload and "name" in payload and set(payload) <= _ENVELOPE:
        name, data = payload["name"], payload["data"]
        if not isinstance(name, str):
            raise ItemError("name", "must be the event's name, a string")
        if not isinstance(data, dict):
            raise ItemError("data", "must be a JSON object")
        level = payload.get("level", "all")
        if level not in ("all", "noCode"):
            raise ItemError("level", "must be 'all' or 'noCode'")
        envelope = {k: payload[k] for k in ("schema", "level", "profileId") if k in payload}
        return name, data, envelope
    return "autocomplete", payload, {}


def _outcome_user(outcome: dict[str, Any], end_user: str) -> str:
    """The developer an outcome is about: the header's (already checked), else ``userId``, else
    ``uniqueId``; "" when none is sent. An id the API could not address is a 400 naming its field."""
    if end_user:
        return end_user
    for key in ("userId", "uniqueId"):
        value = outcome.get(key)
        if value is None or value == "":
            continue
        problem = end_user_id_problem(value)
        if problem is not None:
            raise ItemError(key, problem)
        return value
    return ""


def _served_match(tenant: Any, outcome: dict[str, Any], user: str, served_by: str | None) -> Interaction | None:
    """The recent completion Strop served for this prompt whose text the shown completion begins,
    served to ``user`` or to nobody named; one served to ``user`` is preferred. ``served_by``: only
    a completion that key asked for (an editor key's outcomes)."""
    prompt, shown = outcome.get("prompt"), outcome.get("completion")
    if not isinstance(prompt, str) or not prompt or not isinstance(shown, str) or not shown.strip():
        return None
    same_user = Q(end_user_id="") | Q(end_user_id=user) if user else Q(end_user_id="")
    candidates = Interaction.objects.filter(
        same_user,
        tenant=tenant,
        source=Interaction.Source.SERVED,
        client_id__isnull=True,
        prompt=prompt,
        received_at__gte=timezone.now() - SERVED_MATCH_WINDOW,
        **({f"metadata__{SERVED_BY_KEY}": served_by} if served_by is not None else {}),
    ).order_by("-received_at")[:20]
    wanted = shown.strip()
    matches = [
        candidate
        for candidate in candidates
        if (served := candidate.completion.strip()) and (served.startswith(wanted) or wanted.startswith(served))
    ]
    return next((c for c in matches if c.end_user_id), matches[0] if matches else None)


def editor_outcome_ingest(
    tenant: Any,
    *,
    payload: Any,
    end_user: str = "",
    opted_in: bool | None = None,
    consent_default: bool = False,
    actor: str = "system",
    served_by: str | None = None,
) -> EditorOutcome:
    """Record one posted outcome (see the module docstring). ``end_user`` (the X-Strop-User header)
    names the developer when the plugin's configuration sends it; else the outcome's user id.
    ``opted_in`` (X-Strop-Opt-In): the developer's consent as the request states it, applied as a
    completion's is (None: their current consent, else ``consent_default``).

    ``served_by`` (an editor key's prefix): the outcome links only to a completion that key served;
    one that matches none is recorded without its text (as a noCode one) and records the key, and
    its feedback reaches only those."""
    name, outcome, envelope = _unwrap(payload)
    if name != "autocomplete":
        return EditorOutcome(ignored=f"event {name[:100]!r} is not an autocomplete outcome; nothing to learn from it")
    accepted = outcome.get("accepted")
    if accepted is not None and not isinstance(accepted, bool):
        raise ItemError("accepted", "must be true, false or absent")
    user = _outcome_user(outcome, end_user)
    no_code = envelope.get("level") == "noCode"
    # Checked before anything is looked up by them, whichever path stores the outcome: what the
    # matching reads (a NUL cannot even be compared in Postgres) and what the link keeps.
    completion_id = item_id(outcome, "completionId")
    for key in ("prompt", "completion"):
        item_text(outcome, key)
    metadata = {key: value for key, value in outcome.items() if key not in _MAPPED}
    if envelope:
        metadata["continue"] = envelope
    for key, value in metadata.items():
        problem = ("outcome", "has a key with a NUL character") if "\x00" in key else json_problem(value, key)
        if problem is not None:
            raise ItemError(*problem)
    own = {SERVED_BY_KEY: served_by} if served_by is not None else {}
    with transaction.atomic():
        # An outcome sent again (a retry) names the interaction it made or linked the first time:
        # recorded below as a duplicate, its feedback replacing the first by the usual rule.
        replay = (
            completion_id is not None and Interaction.objects.filter(tenant=tenant, client_id=completion_id).exists()
        )
        served = None if no_code or replay else _served_match(tenant, outcome, user, served_by)
        if served is not None:
            linked = _link(tenant, served, completion_id, accepted, user, (opted_in, consent_default), metadata, actor)
            if linked is not None:
                return linked
        # Through an editor key, an outcome that matches none of its completions keeps no text: a
        # leaked editor config cannot put text of its choosing into training (counted, not learned).
        withheld = no_code or served_by is not None
        if withheld and not no_code:
            metadata["text_withheld_reason"] = "an editor key's outcome that matches no completion it served"
        interaction = {
            "client_id": outcome.get("completionId"),
            "prompt": outcome.get("prompt") if not withheld else "",
            "prefix": outcome.get("prefix") if not withheld else None,
            "suffix": outcome.get("suffix") if not withheld else None,
            "completion": outcome.get("completion") if not withheld else "",
            "model": outcome.get("modelName"),
            "end_user_id": user or None,
            "opted_in": opted_in,
            "served_at": _timestamp(outcome.get("timestamp")),
            "latency_ms": outcome.get("time"),
            "metadata": {**metadata, "text_withheld": True, **own} if withheld else metadata,
        }
        interaction = {key: value for key, value in interaction.items() if value is not None}
        (stored,) = interactions_ingest(
            tenant, items=[interaction], source=Interaction.Source.EDITOR, consent_default=consent_default, actor=actor
        )
        if stored.status == "duplicate" and served_by is not None and not _made_by(tenant, stored.id, served_by):
            # Another key's or the tenant's own row under that id: an editor key is not told its id,
            # which says when it was served (apps.interactions.ids), as it sees nothing else of it.
            stored.id = None
        if stored.status == "rejected" or accepted is None:
            return EditorOutcome(interaction=stored)
        (feedback,) = feedback_ingest(
            tenant,
            items=[{"client_id": stored.client_id, "outcome": "accepted" if accepted else "rejected"}],
            served_by=served_by,
        )
    return EditorOutcome(interaction=stored, feedback=feedback)


def _made_by(tenant: Any, interaction_id: str | None, served_by: str) -> bool:
    """Whether the interaction was served through, or recorded for, the editor key ``served_by``."""
    own = {f"metadata__{SERVED_BY_KEY}": served_by}
    return interaction_id is not None and Interaction.objects.filter(tenant=tenant, pk=interaction_id, **own).exists()


def _link(
    tenant: Any,
    served: Interaction,
    client_id: str | None,
    accepted: bool | None,
    user: str,
    consent: tuple[bool | None, bool],
    metadata: dict[str, Any],
    actor: str,
) -> EditorOutcome | None:
    """The outcome is about ``served``: name it by the plugin's id, fill in the developer, and put
    the feedback on it. None: the same outcome was linked meanwhile (a retry racing the first)."""
    if client_id is None:
        raise ItemError("completionId", "is required to link an outcome to the completion it is about", "required")
    served.client_id = client_id
    served.metadata = {**served.metadata, "editor_outcome": metadata}
    fields = ["client_id", "metadata"]
    flag, default = consent
    if not served.end_user_id and user:
        # Continue sends no user with completions; the outcome is the first time Strop learns who it was.
        served.end_user_id = user
        (served.end_user_opted_in,) = end_users_observe(
            tenant, observations=[(served.end_user_id, flag)], source="editor", actor=actor, default=default
        )
        fields += ["end_user_id", "end_user_opted_in"]
    elif flag is not None and (user or served.end_user_id):  # the consent stated (an editor key: only a withdrawal)
        stated = [(user or served.end_user_id, flag)]
        end_users_observe(tenant, observations=stated, source="editor", actor=actor, default=default)
    try:
        with transaction.atomic():
            served.save(update_fields=fields)
    except IntegrityError:
        return None
    stored = ItemResult(index=0, status="linked", id=str(served.pk), client_id=client_id)
    if accepted is None:
        return EditorOutcome(interaction=stored, linked=True)
    (feedback,) = feedback_ingest(
        tenant, items=[{"interaction_id": str(served.pk), "outcome": "accepted" if accepted else "rejected"}]
    )
    return EditorOutcome(interaction=stored, feedback=feedback, linked=True)
