"""An adapter's FIM eval set, which the gate checks each candidate on: see it, replace it.

A replacement's body is read only once the sender is known to be an admin or owner and its
declared size is under ``STROP_EVAL_SET_MAX_BYTES`` (and a little for the form around it): Django's
CSRF check reads (parses) a form body, so it runs after those two checks, not in the middleware.
A viewer's upload is refused unread, whatever its size; an oversize one gets a 413 page."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from apps.common.exceptions import ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import json_loads_strict
from apps.dashboard.views.common import tenant_render
from apps.training.selectors import eval_set_get
from apps.training.services import eval_set_upload

# Room for the multipart framing and the form's other fields around a file of the largest size.
_FORM_OVERHEAD_BYTES = 64 * 1024


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"


class EvalSetForm(forms.Form):
    file = forms.FileField(
        required=False,
        label="Cases file",
        help_text='JSON Lines (one {"prefix", "suffix", "middle"} object a line) or one JSON list, at most '
        + _mib(settings.STROP_EVAL_SET_MAX_BYTES)
        + ".",
    )
    cases = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        label="Or paste the cases",
        help_text="The same formats as the file.",
    )

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        upload = data.get("file")
        limit = settings.STROP_EVAL_SET_MAX_BYTES
        if upload is not None:
            if upload.size > limit:
                raise forms.ValidationError({"file": f"the file is {upload.size:,} bytes; at most {limit:,}"})
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                raise forms.ValidationError({"file": "the file is not UTF-8 text"}) from None
            field = "file"
        else:
            text, field = data.get("cases") or "", "cases"
            if len(text.encode()) > limit:
                raise forms.ValidationError({"cases": f"the cases are over {limit:,} bytes; upload at most that"})
        if not text.strip():
            raise forms.ValidationError({"file": "choose a file or paste the cases"})
        data["parsed"] = _parse(text, field)
        return data


def _parse(text: str, field: str) -> list[Any]:
    # Strictly, as the API reads JSON: a lone surrogate or a thousand levels of nesting is a form error.
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            cases = json_loads_strict(stripped)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError({field: f"not valid JSON: {exc.msg} at line {exc.lineno}"}) from None
        return cases if isinstance(cases, list) else []
    cases = []
    for number, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cases.append(json_loads_strict(line))
        except json.JSONDecodeError as exc:
            raise forms.ValidationError({field: f"line {number}: not valid JSON ({exc.msg})"}) from None
    return cases


@csrf_exempt  # checked in _eval_set_replace, once the role and the size are (it reads the body)
@tenant_page()
def eval_set(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """GET shows the adapter's eval set; POST (admins) replaces it with uploaded or pasted cases."""
    adapter = ctx.adapter(adapter_name)
    if request.method != "POST":
        return _page(request, ctx, adapter, EvalSetForm())
    if not ctx.can_act:
        return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
    limit = settings.STROP_EVAL_SET_MAX_BYTES
    if _declared_length(request) > limit + _FORM_OVERHEAD_BYTES:
        refusal = f"The upload is larger than {_mib(limit)}: nothing was read or changed."
        return _page(request, ctx, adapter, EvalSetForm(), status=413, refusal=refusal)
    return _eval_set_replace(request, ctx, adapter)


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


@csrf_protect
def _eval_set_replace(request: HttpRequest, ctx: TenantContext, adapter: Any) -> HttpResponse:
    form = EvalSetForm(request.POST, request.FILES)
    if form.is_valid():
        try:
            stored = eval_set_upload(ctx.tenant, adapter=adapter, cases=form.cleaned_data["parsed"], actor=ctx.actor)
        except ValidationFailed as exc:
            form.add_error("file" if request.FILES else "cases", exc.message)
        else:
            messages.success(request, f"Eval set of {adapter.name} replaced: {len(stored.cases)} cases.")
            return redirect("dashboard:eval-set", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    return _page(request, ctx, adapter, form, status=400)


def _page(
    request: HttpRequest, ctx: TenantContext, adapter: Any, form: EvalSetForm, *, status: int = 200, refusal: str = ""
) -> HttpResponse:
    current = eval_set_get(adapter)
    context = {"form": form, "adapter": adapter, "nav_adapter": adapter, "current": current, "refusal": refusal}
    return tenant_render(request, ctx, "dashboard/training/eval_set.html", context, section="runs", status=status)
