"""The consent a request states for the end user it names, with the editor key's limit: a module of its
own, as ``apps.tenants.permissions`` is loaded by DRF's settings before its views can be imported."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request

from apps.common.apis import end_user_of_request
from apps.common.exceptions import Forbidden
from apps.tenants.permissions import acts_as_editor


def end_user_and_consent(request: Request, attrs: dict[str, Any], *, required: str) -> tuple[str, bool | None]:
    """The end user a request names and the consent it states (``end_user_of_request``), on every view
    that records an end user's completions (serving, editor outcomes; ``required``: the view's scope).

    An editor key (a config file on every developer's machine, shared by a team) cannot say who the
    developer is with any proof, so it never gives consent: ``opted_in: true`` (or ``X-Strop-Opt-In:
    true``) through it is a 403. Withdrawing (false) is always taken; a user it is the first to see
    gets the key's ``default_opt_in``, else the tenant's."""
    user, flag = end_user_of_request(request, attrs)
    if flag is True and acts_as_editor(request.user, required):
        raise Forbidden(
            "an editor key cannot give an end user's consent to learning (opted_in / X-Strop-Opt-In: true): "
            "leave it out (a new developer gets the key's default_opt_in) and have an admin opt people in; "
            "opting out (false) is allowed",
            code="permission_denied",
        )
    return user, flag
