"""The API's and the dashboard's HTTP settings: the content security policy (which reads
CSP_REPORT_URI), DRF's defaults and the published schema's. config/settings.py imports them."""

from __future__ import annotations

import os

from csp.constants import NONE, SELF, UNSAFE_INLINE

# The dashboard's content security policy (django-csp): its own scripts and styles only, from
# /static/ (htmx and axe-core under /static/vendor/). Bars and chart widths are style attributes
# computed per row; nothing else inline. Swagger UI (/api/docs/) starts itself with an inline script.
# The API's JSON answers carry none (apps/dashboard/csp.py).
CONTENT_SECURITY_POLICY = {
    "EXCLUDE_URL_PREFIXES": ["/api/docs/"],
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "style-src-attr": [UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        **({"report-uri": [os.environ["CSP_REPORT_URI"]]} if os.environ.get("CSP_REPORT_URI") else {}),
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.tenants.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["apps.tenants.permissions.HasScope"],
    "DEFAULT_PARSER_CLASSES": ["apps.common.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["apps.common.renderers.FastJSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.common.exception_handler.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Strop API",
    "DESCRIPTION": "Ingest completions and accept/reject feedback; serve per-tenant LoRA adapters.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # An experiment's primary metric and its guardrails choose from the same metrics: one enum.
    "ENUM_NAME_OVERRIDES": {"ExperimentMetricEnum": "apps.experiments.stats.metrics.METRICS"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.common.schema.add_error_responses",
    ],
}
