"""Every dashboard route, read from the URL resolver, and the URL of each for a test world."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver, reverse

# Routes anyone may open.
PUBLIC = {
    "login",
    "password-reset",
    "password-reset-done",
    "password-reset-confirm",
    "password-reset-complete",
    "invitation-accept",
}
# Routes of the signed-in user, not of a tenant.
ACCOUNT = {"home", "logout", "password-change", "password-change-done"}
# Tenant pages a viewer reads (GET).
READ = {
    "overview",
    "adapter-overview",
    "overview-live",
    "versions",
    "training-policy",
    "runs",
    "run-detail",
    "run-status",
    "interactions",
    "interaction-detail",
    "keys",
    "audit",
    "experiments",
    "experiment",
    "experiment-live",
    "cohorts",
    "end-user",
    "training-status",
    "interactions-csv",
    "experiment-results-csv",
    "team",
    "webhooks",
    "settings",
    "eval-set",
}
# Tenant actions: route -> (method, form data, audit action the service writes).
ACTIONS: dict[str, tuple[str, dict[str, Any], str]] = {
    "version-promote": ("post", {}, "adapter.promote"),
    "run-start": ("post", {}, "training_run.start"),
    "lineage-retrain": ("post", {}, "training_run.retrain"),
    "run-exclude-window": ("post", {}, "training_run.exclude_window"),
    "version-purge": ("post", {}, "adapter_version.purge"),
    "training-policy": (
        "post",
        {
            "enabled": "on",
            "min_new_events": "64",
            "max_wait_s": "600",
            "heldout_fraction": "0.2",
            "reward_accepted": "1.0",
            "reward_rejected": "-0.5",
            "reward_not_shown": "0",
            "reward_edited": "0.25",
            "reward_partial": "0.25",
            "reward_thumbs_up": "1.0",
            "reward_thumbs_down": "-1.0",
            "reward_edit_persisted": "0.75",
            "reward_edit_reverted": "-0.5",
            "reward_follow_up_dissatisfied": "-0.5",
            "reward_tool_call_failed": "-0.5",
            "show_gate": "on",
            "show_gate_recall": "0.95",
            "show_gate_explore": "0.05",
            "trainer_overrides": "{}",
        },
        "training_policy.update",
    ),
    "keys": ("post", {"name": "new key", "scopes": ["ingest"]}, "api_key.create"),
    "webhooks": ("post", {"url": "https://hooks.example.com/strop", "events": ["run.failed"]}, "webhook.create"),
    "webhook-delete": ("post", {}, "webhook.delete"),
    "webhook-rotate": ("post", {}, "webhook.secret_rotate"),
    "settings": ("post", {"default_opt_in": "on", "accept_pending_feedback": "on"}, "tenant.settings"),
    "eval-set": ("post", {"cases": '{"prefix": "def f(", "suffix": "):", "middle": "x"}'}, "eval_set.upload"),
    "key-revoke": ("post", {}, "api_key.revoke"),
    "version-rollback": ("post", {}, "adapter.rollback"),
    "experiment-new": (
        "post",
        {
            "candidate_version": "3",
            "candidate_weight": "0.3",
            "primary_metric": "reward_per_request",
            "guardrails": ["error_rate"],
            "min_users_per_arm": "50",
            "max_duration_days": "7",
            "alpha": "0.05",
            "expected_users": "400",
        },
        "experiment.create",
    ),
    "experiment-promote": ("post", {"reason": "looks better"}, "experiment.promote"),
    "experiment-rollback": ("post", {}, "experiment.rollback"),
    "experiment-stop": ("post", {}, "experiment.stop"),
    "experiment-start": ("post", {}, "experiment.start"),
    "experiments-holdout": ("post", {"holdout_percent": "5"}, "adapter.holdout"),
    "end-user-consent": ("post", {"end_user_id": "dev-1", "opted_in": "false"}, "end_user.opt_out"),
    "end-user-erase": ("post", {"end_user_id": "dev-2"}, "end_user.erase"),
    "invitation-new": ("post", {"role": "viewer", "note": "dana@example.com"}, "invitation.create"),
    "invitation-revoke": ("post", {}, "invitation.revoke"),
    "member-role": ("post", {"role": "admin"}, "membership.role_change"),
    "member-remove": ("post", {}, "membership.remove"),
    "member-password-reset": ("post", {}, "membership.password_reset_link"),
}
# Action routes whose GET is a confirmation page or a form (only for those who may act).
CONFIRM = {
    "webhook-delete",
    "webhook-rotate",
    "version-promote",
    "key-revoke",
    "version-rollback",
    "version-purge",
    "experiment-new",
    "experiment-promote",
    "experiment-rollback",
    "experiment-stop",
    "experiment-start",
    "end-user-erase",
    "invitation-new",
    "invitation-revoke",
    "member-role",
    "member-remove",
    "member-password-reset",
}
# Actions that load a version into vLLM: their success test takes the real vLLM server.
# version-promote: v2 is the running experiment's candidate, so promoting it decides the experiment, which
# loads it on every replica first (as experiment-promote does).
NEEDS_VLLM = {"experiment-promote", "version-promote", "version-rollback", "experiment-new", "experiment-start"}
# The query string a route reads its end user from.
QUERY = {"end-user": "?end_user_id=dev-1", "end-user-erase": "?end_user_id=dev-2"}


def prepare(name: str, world: Any) -> None:
    """What an action needs beyond the shared world before an admin may succeed at it."""
    from apps.adapters.services import adapter_serve_probe, adapter_version_promote, adapter_version_register

    if name == "version-rollback":  # production must be later than the version rolled back to
        adapter_version_promote(world.a, version=world.v2, actor="system")
    elif name == "run-exclude-window":  # a rejected run's events
        from apps.training.models import TrainingRun

        world.run = TrainingRun.objects.create(tenant=world.a, adapter=world.adapter, status="rejected")
    elif name in ("lineage-retrain", "version-purge"):  # v2's run learned from an end user erased since
        from apps.training.models import TrainingRunErasure

        TrainingRunErasure.objects.create(tenant=world.a, run=world.run, user_hash="0" * 64, trained_on=True)
        if name == "version-purge":  # replaced: the experiment that tests it is stopped
            from apps.experiments.services import experiment_stop

            experiment_stop(world.a, experiment=world.experiment, actor="system")
    elif name == "experiments-holdout":  # the holdout changes only while no experiment runs
        from apps.experiments.services import experiment_stop

        experiment_stop(world.a, experiment=world.experiment, actor="system")
    elif name in ("experiment-new", "experiment-start"):  # a gated candidate, no experiment running
        from apps.experiments.services import experiment_create, experiment_stop

        experiment_stop(world.a, experiment=world.experiment, actor="system")
        source = Path(world.v2.artifact_path)
        probe = adapter_serve_probe(world.adapter.base_model, source)
        v3 = adapter_version_register(
            world.a, adapter=world.adapter, source_dir=source, enqueue_load=False, metrics={"serve_probe": probe}
        )
        if name == "experiment-start":  # a draft of it, started from its page
            world.experiment = experiment_create(world.a, adapter=world.adapter, candidate_version=v3, actor="system")


def dashboard_routes() -> dict[str, set[str]]:
    """Route name -> the URL parameters it takes, for every route under the dashboard namespace."""
    resolver = get_resolver().namespace_dict["dashboard"][1]
    routes: dict[str, set[str]] = {}

    def walk(patterns: list[Any], params: set[str]) -> None:
        for pattern in patterns:
            own = set(getattr(pattern.pattern, "converters", {}))
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, params | own)
            elif isinstance(pattern, URLPattern) and pattern.name:
                routes[pattern.name] = params | own

    walk(resolver.url_patterns, set())
    return routes


def url_for(name: str, world: Any) -> str:
    values = {
        "tenant_slug": world.a.slug,
        "adapter_name": world.adapter.name,
        "number": world.v1.number if name == "version-rollback" else world.v2.number,
        "experiment_id": world.experiment.pk,
        "run_id": world.run.pk,
        "interaction_id": world.interaction_id,
        "key_id": world.key.pk,
    }
    params = dashboard_routes()[name]
    values.update(_team_values(name, params, world))
    if "webhook_id" in params:
        values["webhook_id"] = _world_webhook(world).pk
    return reverse(f"dashboard:{name}", kwargs={p: values[p] for p in params}) + QUERY.get(name, "")


def tenant_routes() -> list[str]:
    return sorted(name for name, params in dashboard_routes().items() if "tenant_slug" in params)


def _team_values(name: str, params: set[str], world: Any) -> dict[str, Any]:
    """The team routes' parameters: the viewer's membership; the world's pending invitation (for a
    viewer) and its raw token; a password-reset link of the viewer. The invitation is made on first
    use with the model itself, without the audit row its service writes, so that the walls' before
    and after snapshots see only what the request did."""
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    from apps.tenants.models import Membership
    from apps.tenants.reset_tokens import self_service_tokens

    viewer = world.users["viewer"]
    if name == "password-reset-confirm":
        uidb64 = urlsafe_base64_encode(force_bytes(viewer.pk))
        return {"uidb64": uidb64, "token": self_service_tokens.make_token(viewer)}
    values: dict[str, Any] = {}
    if "membership_id" in params:
        values["membership_id"] = Membership.objects.get(tenant=world.a, user=viewer).pk
    if "invitation_id" in params or name == "invitation-accept":
        invitation, raw_token = _world_invitation(world)
        values.update(invitation_id=invitation.pk, token=raw_token)
    return values


def _world_invitation(world: Any) -> tuple[Any, str]:
    if getattr(world, "invitation", None) is None:
        import secrets
        from datetime import timedelta

        from django.utils import timezone

        from apps.tenants.keys import hash_key
        from apps.tenants.models import Invitation

        raw_token = secrets.token_urlsafe(32)
        world.invitation = Invitation.objects.create(
            tenant=world.a,
            role="viewer",
            note="dana@example.com",
            token_hash=hash_key(raw_token),
            created_by=world.users["owner"],
            expires_at=timezone.now() + timedelta(days=7),
        )
        world.invitation_token = raw_token
    return world.invitation, world.invitation_token


def _world_webhook(world: Any) -> Any:
    """Tenant A's webhook, made on first use with the model itself (no audit row), like the invitation."""
    if getattr(world, "webhook", None) is None:
        from apps.notifications.models import Webhook

        world.webhook = Webhook.objects.create(
            tenant=world.a, url="https://hooks.example.com/a", events=["run.failed"], secret="whsec_world"
        )
    return world.webhook
