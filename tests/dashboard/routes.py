"""Every dashboard route, read from the URL resolver, and the URL of each for a test world."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver, reverse

# Routes anyone may open.
PUBLIC = {"login"}
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
}
# Tenant actions: route -> (method, form data, audit action the service writes).
ACTIONS: dict[str, tuple[str, dict[str, Any], str]] = {
    "version-promote": ("post", {}, "adapter.promote"),
    "run-start": ("post", {}, "training_run.start"),
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
            "trainer_overrides": "{}",
            "gate_overrides": "{}",
        },
        "training_policy.update",
    ),
    "keys": ("post", {"name": "new key", "scopes": ["ingest"]}, "api_key.create"),
    "key-revoke": ("post", {}, "api_key.revoke"),
}
# Action routes whose GET is a confirmation page (only for those who may act).
CONFIRM = {"version-promote", "key-revoke"}


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
        "number": world.v2.number,
        "run_id": world.run.pk,
        "interaction_id": world.interaction_id,
        "key_id": world.key.pk,
    }
    params = dashboard_routes()[name]
    return reverse(f"dashboard:{name}", kwargs={p: values[p] for p in params})


def tenant_routes() -> list[str]:
    return sorted(name for name, params in dashboard_routes().items() if "tenant_slug" in params)
