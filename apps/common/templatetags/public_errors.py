"""``{{ text|public_error }}``: an error as a tenant may read it (see ``public_text``)."""

from __future__ import annotations

from django import template

from apps.common.exception_handler import public_text

register = template.Library()


@register.filter
def public_error(text: str | None) -> str:
    return public_text(text) if text else ""
