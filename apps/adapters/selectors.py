from __future__ import annotations

from django.db import connection
from django.db.models import QuerySet

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.common.exceptions import NotFound
from apps.common.lookups import joined_row, model_columns
from apps.common.parsing import parse_id
from apps.tenants.models import Tenant


def base_model_get(*, name: str) -> BaseModel:
    try:
        return BaseModel.objects.get(name=name)
    except BaseModel.DoesNotExist:
        raise NotFound(f"no base model {name!r}") from None


def adapter_list(tenant: Tenant) -> QuerySet[Adapter]:
    return Adapter.objects.filter(tenant=tenant).select_related("base_model", "production_version").order_by("name")


ADAPTER_ROW = (Adapter, BaseModel, AdapterVersion)  # the models adapter_row_sql selects, in order


def adapter_where(*, named: bool, tenant: str = "%s") -> str:
    """Which of a tenant's adapters a request means (alias a): by name when ``named``, else its
    default one. Parameters: the tenant's (``tenant``'s: by default its id), then the name when
    ``named``."""
    return f"a.tenant_id = {tenant} AND {'a.name = %s' if named else 'a.is_default'}"


def adapter_row_sql(*, named: bool, tenant: str = "%s") -> str:
    """The statement that reads a tenant's adapter by name (``named``) or its default one, with its
    base model and production version (the ``ADAPTER_ROW`` models); parameters as adapter_where's."""
    quote = connection.ops.quote_name
    return (
        f"SELECT {model_columns(Adapter, 'a')}, {model_columns(BaseModel, 'b')}, {model_columns(AdapterVersion, 'v')} "
        f"FROM {quote(Adapter._meta.db_table)} a JOIN {quote(BaseModel._meta.db_table)} b ON b.id = a.base_model_id "
        f"LEFT JOIN {quote(AdapterVersion._meta.db_table)} v ON v.id = a.production_version_id "
        f"WHERE {adapter_where(named=named, tenant=tenant)} ORDER BY a.id LIMIT 1"
    )


def model_not_found(tenant: Tenant, *, name: str | None, param: str | None = "model") -> NotFound:
    """The 404 for a ``model`` that names none of the tenant's adapters (or for no default one),
    listing the names it can use: its own adapters only."""
    models = list(Adapter.objects.filter(tenant=tenant).order_by("name").values_list("name", flat=True)[:100])
    usable = (
        f"this tenant's models: {', '.join(models)}" if models else "this tenant has no models yet; create an adapter"
    )
    if not name:
        message = f"this tenant has no default adapter; name one of its models in `model` ({usable})"
    elif BaseModel.objects.filter(name=name).exists():
        message = (
            f"model {name!r} is a base model, not one of this tenant's models; name an adapter, which serves "
            f"its base model until a trained version is promoted ({usable})"
        )
    else:
        message = f"model {name!r} not found ({usable})"
    return NotFound(message, code="model_not_found", param=param, details={"model": name or None, "models": models})


def adapter_of_row(found: list | None, *, tenant: Tenant, name: str | None, param: str | None = "model") -> Adapter:
    """The adapter of a row read with ``adapter_row_sql`` (its first three instances), its base
    model and production version attached. 404 (model_not_found) when there is no row."""
    if found is None:
        raise model_not_found(tenant, name=name, param=param)
    adapter, adapter.base_model, adapter.production_version = found[:3]
    return adapter


def adapter_get_for_tenant(tenant: Tenant, *, name: str | None) -> Adapter:
    """The tenant's adapter by name, or its default one when ``name`` is empty. 404 otherwise."""
    # One plain query (the ORM's compile of these joins costs more than answering them); serving
    # reads the same row with the end user and the experiment (apps.serving.selectors).
    found = joined_row(adapter_row_sql(named=bool(name)), [tenant.pk, name] if name else [tenant.pk], ADAPTER_ROW)
    return adapter_of_row(found, tenant=tenant, name=name, param=None)


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
