"""An adapter's FIM eval set, which the gate checks each candidate on: see it, replace it."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.common.exceptions import ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.views.common import tenant_render
from apps.training.models import EvalSet
from apps.training.services import eval_set_upload

MAX_FILE_BYTES = 5 * 1024 * 1024


class EvalSetForm(forms.Form):
    file = forms.FileField(
        required=False,
        label="Cases file",
        help_text='JSON Lines (one {"prefix", "suffix", "middle"} object a line) or one JSON list, at most 5 MB.',
    )
    cases = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        label="Or paste the cases",
        help_text="The same formats as the file.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        upload = data.get("file")
        if upload is not None:
            if upload.size > MAX_FILE_BYTES:
                raise forms.ValidationError({"file": f"the file is {upload.size:,} bytes; at most {MAX_FILE_BYTES:,}"})
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                raise forms.ValidationError({"file": "the file is not UTF-8 text"}) from None
            field = "file"
        else:
            text, field = data.get("cases") or "", "cases"
        if not text.strip():
            raise forms.ValidationError({"file": "choose a file or paste the cases"})
        data["parsed"] = _parse(text, field)
        return data


def _parse(text: str, field: str) -> list[Any]:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            cases = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError({field: f"not valid JSON: {exc.msg} at line {exc.lineno}"}) from None
        return cases if isinstance(cases, list) else []
    cases = []
    for number, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cases.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise forms.ValidationError({field: f"line {number}: not valid JSON ({exc.msg})"}) from None
    return cases


@tenant_page()
def eval_set(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """GET shows the adapter's eval set; POST (admins) replaces it with uploaded or pasted cases."""
    adapter = ctx.adapter(adapter_name)
    form = EvalSetForm(request.POST or None, request.FILES or None)
    if request.method == "POST":
        if not ctx.can_act:
            return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
        if form.is_valid():
            try:
                stored = eval_set_upload(
                    ctx.tenant, adapter=adapter, cases=form.cleaned_data["parsed"], actor=ctx.actor
                )
            except ValidationFailed as exc:
                field = "file" if request.FILES else "cases"
                form.add_error(field, exc.message)
            else:
                messages.success(request, f"Eval set of {adapter.name} replaced: {len(stored.cases)} cases.")
                return redirect("dashboard:eval-set", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    current = EvalSet.objects.filter(adapter=adapter).first()
    context = {"form": form, "adapter": adapter, "nav_adapter": adapter, "current": current}
    status = 400 if form.is_bound and form.errors else 200
    return tenant_render(request, ctx, "dashboard/training/eval_set.html", context, section="runs", status=status)
