from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from apps.adapters.apis import (
    AdapterListApi,
    AdapterVersionDetailApi,
    AdapterVersionListApi,
)
from apps.cohorts.apis import EndUserConsentApi, EndUserImportApi, EndUserListApi
from apps.common.apis import HealthApi
from apps.common.observability.views import metrics_view
from apps.experiments.apis import (
    AdapterHoldoutApi,
    AdapterRollbackApi,
    AdapterVersionPromoteApi,
    ExperimentCollectionApi,
    ExperimentDetailApi,
    ExperimentPromoteApi,
    ExperimentRollbackApi,
    ExperimentSnapshotApi,
    ExperimentSnapshotListApi,
    ExperimentStartApi,
    ExperimentStopApi,
)
from apps.interactions.apis import (
    EditorOutcomeApi,
    FeedbackIngestApi,
    InteractionCollectionApi,
    InteractionDetailApi,
)
from apps.interactions.persistence_apis import InteractionPersistenceApi, PersistenceReportIngestApi
from apps.privacy.apis import AdapterVersionPurgeApi, EndUserDetailApi
from apps.serving.apis import CompletionApi, ModelListApi
from apps.serving.assignment_apis import AssignmentApi
from apps.serving.chat_apis import ChatCompletionApi
from apps.serving.health_apis import HealthReadyApi
from apps.tenants.apis import ApiKeyCollectionApi, ApiKeyDetailApi, AuditEventListApi, TenantMeApi
from apps.training.apis import (
    AdapterRetrainApi,
    EvalSetApi,
    TrainingPolicyApi,
    TrainingRunCollectionApi,
    TrainingRunDetailApi,
    TrainingRunExcludeWindowApi,
)

_public = {"authentication_classes": [], "permission_classes": [AllowAny]}

urlpatterns = [
    path("health", HealthApi.as_view(), name="health"),
    path("health/ready", HealthReadyApi.as_view(), name="health-ready"),
    path("metrics", metrics_view, name="metrics"),
    path("v1/tenant", TenantMeApi.as_view(), name="tenant-me"),
    path("v1/keys", ApiKeyCollectionApi.as_view(), name="api-keys"),
    path("v1/keys/<str:key_id>", ApiKeyDetailApi.as_view(), name="api-key-detail"),
    path("v1/audit-events", AuditEventListApi.as_view(), name="audit-events"),
    path("v1/interactions", InteractionCollectionApi.as_view(), name="interactions"),
    path("v1/interactions/<str:interaction_id>", InteractionDetailApi.as_view(), name="interaction-detail"),
    path(
        "v1/interactions/<str:interaction_id>/persistence",
        InteractionPersistenceApi.as_view(),
        name="interaction-persistence",
    ),
    path("v1/feedback", FeedbackIngestApi.as_view(), name="feedback"),
    path("v1/feedback/persistence", PersistenceReportIngestApi.as_view(), name="feedback-persistence"),
    path("v1/editor/autocomplete", EditorOutcomeApi.as_view(), name="editor-autocomplete"),
    path("v1/completions", CompletionApi.as_view(), name="completions"),
    path("v1/chat/completions", ChatCompletionApi.as_view(), name="chat-completions"),
    path("v1/models", ModelListApi.as_view(), name="models"),
    path("v1/adapters", AdapterListApi.as_view(), name="adapters"),
    path("v1/adapters/<str:adapter_name>/versions", AdapterVersionListApi.as_view(), name="adapter-versions"),
    path(
        "v1/adapters/<str:adapter_name>/versions/<str:number>",
        AdapterVersionDetailApi.as_view(),
        name="adapter-version-detail",
    ),
    path(
        "v1/adapters/<str:adapter_name>/versions/<str:number>/promote",
        AdapterVersionPromoteApi.as_view(),
        name="adapter-version-promote",
    ),
    path(
        "v1/adapters/<str:adapter_name>/versions/<str:number>/purge",
        AdapterVersionPurgeApi.as_view(),
        name="adapter-version-purge",
    ),
    path("v1/adapters/<str:adapter_name>/training-policy", TrainingPolicyApi.as_view(), name="training-policy"),
    path("v1/adapters/<str:adapter_name>/eval-set", EvalSetApi.as_view(), name="eval-set"),
    path("v1/adapters/<str:adapter_name>/training-runs", TrainingRunCollectionApi.as_view(), name="training-runs"),
    path("v1/adapters/<str:adapter_name>/retrain", AdapterRetrainApi.as_view(), name="adapter-retrain"),
    path("v1/training-runs/<str:run_id>", TrainingRunDetailApi.as_view(), name="training-run-detail"),
    path(
        "v1/training-runs/<str:run_id>/exclude-window",
        TrainingRunExcludeWindowApi.as_view(),
        name="training-run-exclude-window",
    ),
    path("v1/users", EndUserListApi.as_view(), name="end-users"),
    path("v1/users/import", EndUserImportApi.as_view(), name="end-users-import"),
    path("v1/users/<str:end_user_id>", EndUserDetailApi.as_view(), name="end-user-detail"),
    path("v1/users/<str:end_user_id>/opt-in", EndUserConsentApi.as_view(opted_in=True), name="end-user-opt-in"),
    path("v1/users/<str:end_user_id>/opt-out", EndUserConsentApi.as_view(opted_in=False), name="end-user-opt-out"),
    path("v1/adapters/<str:adapter_name>/experiments", ExperimentCollectionApi.as_view(), name="experiments"),
    path("v1/adapters/<str:adapter_name>/assignment", AssignmentApi.as_view(), name="assignment"),
    path("v1/adapters/<str:adapter_name>/rollback", AdapterRollbackApi.as_view(), name="adapter-rollback"),
    path("v1/adapters/<str:adapter_name>/holdout", AdapterHoldoutApi.as_view(), name="adapter-holdout"),
    path("v1/experiments/<str:experiment_id>", ExperimentDetailApi.as_view(), name="experiment-detail"),
    path(
        "v1/experiments/<str:experiment_id>/snapshots", ExperimentSnapshotListApi.as_view(), name="experiment-snapshots"
    ),
    *[
        path(f"v1/experiments/<str:experiment_id>/{action}", api.as_view(), name=f"experiment-{action}")
        for action, api in (
            ("start", ExperimentStartApi),
            ("stop", ExperimentStopApi),
            ("promote", ExperimentPromoteApi),
            ("rollback", ExperimentRollbackApi),
            ("snapshot", ExperimentSnapshotApi),
        )
    ],
    path("api/schema/", SpectacularAPIView.as_view(**_public), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema", **_public), name="api-docs"),
    path("admin/", admin.site.urls),
    path("dashboard/", include("apps.dashboard.urls")),
]

handler404 = "apps.common.apis.not_found"
handler500 = "apps.common.apis.server_error"
