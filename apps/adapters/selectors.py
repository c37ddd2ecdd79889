from __future__ import annotations

from django.db.models import QuerySet

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.common.exceptions import NotFound
from apps.common.parsing import parse_id
from apps.tenants.models import Tenant


def base_model_get(*, name: str) -> BaseModel:
    try:
        return BaseModel.objects.get(name=name)
    except BaseModel.DoesNotExist:
        raise NotFound(f"no base model {name!r}") from None


def adapter_list(tenant: Tenant) -> QuerySet[Adapter]:
    return Adapter.objects.filter(tenant=tenant).select_related("base_model", "production_version").order_by("name")


def adapter_get_for_tenant(tenant: Tenant, *, name: str | None) -> Adapter:
    """The tenant's adapter by name, or its default one when ``name`` is empty. 404 otherwise."""
    qs = Adapter.objects.filter(tenant=tenant).select_related("base_model", "production_version")
    adapter = qs.filter(name=name).first() if name else qs.filter(is_default=True).first()
    if adapter is None:
        if name:
            raise NotFound(f"model {name!r} not found", code="model_not_found")
        raise NotFound("this tenant has no default adapter; name one in `model`", code="model_not_found")
    return adapter


def adapter_version_list(tenant: Tenant, *, adapter: Adapter) -> QuerySet[AdapterVersion]:
    return AdapterVersion.objects.filter(tenant=tenant, adapter=adapter).order_by("-number")


def adapter_version_get_for_tenant(tenant: Tenant, *, adapter: Adapter, number: int | str) -> AdapterVersion:
    what = f"adapter {adapter.name} version"
    try:
        return AdapterVersion.objects.select_related("adapter").get(
            tenant=tenant, adapter=adapter, number=parse_id(number, what=what)
        )
    except AdapterVersion.DoesNotExist:
        raise NotFound(f"adapter {adapter.name} has no version {number}") from None
