""" "Forgot your password?" and the page every reset link opens (self-service or handed over).

Django's views, with Strop's rules: the mailed link's token is bound to the account's memberships
and roles (``apps.tenants.reset_tokens``); a request is throttled per client and per e-mail address
(``login_throttle.password_reset_request_allowed``), answered the same way either way; and a link a
team member handed over is checked again, when it is used, against the Team page's refusal rules
for its issuer (``apps.tenants.team.handed_over_link_refusal``): a refused link shows why, never a
password form."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import PasswordResetForm
from django.http import HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse_lazy
from django.utils.cache import add_never_cache_headers

from apps.dashboard.forms import DashboardSetPasswordForm
from apps.dashboard.login_throttle import password_reset_request_allowed
from apps.tenants.reset_tokens import reset_link_tokens, self_service_tokens
from apps.tenants.team import handed_over_link_refusal

_CONFIRM_TEMPLATE = "dashboard/auth/password_reset_confirm.html"


class PasswordResetRequestView(auth_views.PasswordResetView):
    template_name = "dashboard/auth/password_reset_form.html"
    email_template_name = "dashboard/auth/password_reset_email.txt"
    subject_template_name = "dashboard/auth/password_reset_subject.txt"
    success_url = reverse_lazy("dashboard:password-reset-done")
    token_generator = self_service_tokens

    def form_valid(self, form: PasswordResetForm) -> HttpResponse:
        if not password_reset_request_allowed(self.request, form.cleaned_data["email"]):
            return HttpResponseRedirect(self.get_success_url())  # the same answer, and no mail
        return super().form_valid(form)


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    template_name = _CONFIRM_TEMPLATE
    success_url = reverse_lazy("dashboard:password-reset-complete")
    token_generator = reset_link_tokens  # type: ignore[assignment]
    form_class = DashboardSetPasswordForm

    def dispatch(self, *args: Any, **kwargs: Any) -> HttpResponseBase:
        user = self.get_user(kwargs.get("uidb64", ""))
        token = kwargs.get("token")
        if token == self.reset_url_token:
            token = self.request.session.get(auth_views.INTERNAL_RESET_SESSION_TOKEN)
        if user is not None and reset_link_tokens.check_token(user, token):
            refusal = handed_over_link_refusal(user=user, token=token)
            if refusal:
                response = render(self.request, _CONFIRM_TEMPLATE, {"validlink": False, "refusal": refusal}, status=403)
                add_never_cache_headers(response)
                return response
        return super().dispatch(*args, **kwargs)
