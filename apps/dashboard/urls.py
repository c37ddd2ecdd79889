"""The dashboard's pages, under /dashboard/. Tenant pages live under t/<tenant_slug>/."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path, reverse_lazy

from apps.dashboard.forms import DashboardPasswordChangeForm
from apps.dashboard.views import (
    adapters,
    cohorts,
    eval_sets,
    experiments,
    exports,
    home,
    interactions,
    keys,
    overview,
    password_reset,
    runs,
    settings,
    team,
    webhooks,
)

app_name = "dashboard"

tenant_patterns = [
    path("", overview.overview, name="overview"),
    path("adapters/<slug:adapter_name>/", overview.overview, name="adapter-overview"),
    path("adapters/<slug:adapter_name>/live/", overview.overview_live, name="overview-live"),
    path("adapters/<slug:adapter_name>/versions/", adapters.versions, name="versions"),
    path(
        "adapters/<slug:adapter_name>/versions/<int:number>/promote/",
        adapters.version_promote,
        name="version-promote",
    ),
    path(
        "adapters/<slug:adapter_name>/versions/<int:number>/rollback/",
        adapters.version_rollback,
        name="version-rollback",
    ),
    path(
        "adapters/<slug:adapter_name>/versions/<int:number>/purge/",
        adapters.version_purge,
        name="version-purge",
    ),
    path("adapters/<slug:adapter_name>/experiments/", experiments.experiments, name="experiments"),
    path("adapters/<slug:adapter_name>/experiments/new/", experiments.experiment_new, name="experiment-new"),
    path(
        "adapters/<slug:adapter_name>/experiments/holdout/", experiments.experiments_holdout, name="experiments-holdout"
    ),
    path("experiments/<int:experiment_id>/", experiments.experiment_detail, name="experiment"),
    path("experiments/<int:experiment_id>/live/", experiments.experiment_live, name="experiment-live"),
    path(
        "experiments/<int:experiment_id>/results.csv",
        exports.experiment_results_export,
        name="experiment-results-csv",
    ),
    path("experiments/<int:experiment_id>/promote/", experiments.experiment_promote_view, name="experiment-promote"),
    path("experiments/<int:experiment_id>/rollback/", experiments.experiment_rollback_view, name="experiment-rollback"),
    path("experiments/<int:experiment_id>/start/", experiments.experiment_start_view, name="experiment-start"),
    path("experiments/<int:experiment_id>/stop/", experiments.experiment_stop_view, name="experiment-stop"),
    path("cohorts/", cohorts.cohorts, name="cohorts"),
    path("cohorts/user/", cohorts.end_user, name="end-user"),
    path("cohorts/user/consent/", cohorts.end_user_consent, name="end-user-consent"),
    path("cohorts/user/erase/", cohorts.end_user_erase_view, name="end-user-erase"),
    path("adapters/<slug:adapter_name>/training-policy/", adapters.training_policy, name="training-policy"),
    path("adapters/<slug:adapter_name>/runs/start/", adapters.training_run_start_view, name="run-start"),
    path("adapters/<slug:adapter_name>/retrain/", adapters.lineage_retrain_view, name="lineage-retrain"),
    path("adapters/<slug:adapter_name>/training-status/", runs.training_status, name="training-status"),
    path("adapters/<slug:adapter_name>/eval-set/", eval_sets.eval_set, name="eval-set"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/<int:run_id>/", runs.run_detail, name="run-detail"),
    path("runs/<int:run_id>/status/", runs.run_status, name="run-status"),
    path("runs/<int:run_id>/exclude-window/", runs.run_exclude_window, name="run-exclude-window"),
    path("interactions/", interactions.interaction_list, name="interactions"),
    path("interactions/export.csv", exports.interactions_export, name="interactions-csv"),
    path("interactions/<uuid:interaction_id>/", interactions.interaction_detail, name="interaction-detail"),
    path("keys/", keys.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", keys.key_revoke, name="key-revoke"),
    path("audit/", keys.audit_log, name="audit"),
    path("settings/", settings.tenant_settings, name="settings"),
    path("webhooks/", webhooks.webhooks, name="webhooks"),
    path("webhooks/<int:webhook_id>/delete/", webhooks.webhook_delete_view, name="webhook-delete"),
    path("webhooks/<int:webhook_id>/rotate/", webhooks.webhook_rotate_view, name="webhook-rotate"),
    path("team/", team.team, name="team"),
    path("team/invite/", team.invitation_new, name="invitation-new"),
    path("team/invitations/<int:invitation_id>/revoke/", team.invitation_revoke_view, name="invitation-revoke"),
    path("team/members/<int:membership_id>/role/", team.member_role, name="member-role"),
    path("team/members/<int:membership_id>/remove/", team.member_remove, name="member-remove"),
    path("team/members/<int:membership_id>/password-reset/", team.member_password_reset, name="member-password-reset"),
]

urlpatterns = [
    path("", home.home, name="home"),
    path("login/", auth_views.LoginView.as_view(template_name="dashboard/auth/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password/",
        auth_views.PasswordChangeView.as_view(
            template_name="dashboard/auth/password_change.html",
            form_class=DashboardPasswordChangeForm,
            success_url=reverse_lazy("dashboard:password-change-done"),
        ),
        name="password-change",
    ),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="dashboard/auth/password_change_done.html"),
        name="password-change-done",
    ),
    path(
        "password/reset/",
        password_reset.PasswordResetRequestView.as_view(),
        name="password-reset",
    ),
    path(
        "password/reset/sent/",
        auth_views.PasswordResetDoneView.as_view(template_name="dashboard/auth/password_reset_done.html"),
        name="password-reset-done",
    ),
    path(
        "password/reset/<uidb64>/<token>/",
        password_reset.PasswordResetConfirmView.as_view(),
        name="password-reset-confirm",
    ),
    path(
        "password/reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(template_name="dashboard/auth/password_reset_complete.html"),
        name="password-reset-complete",
    ),
    path("invite/<str:token>/", team.invitation_accept_view, name="invitation-accept"),
    path("t/<slug:tenant_slug>/", include(tenant_patterns)),
]
