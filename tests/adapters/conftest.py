from __future__ import annotations

import pytest

from apps.adapters.models import BaseModel
from apps.adapters.services import adapter_create, base_model_register


@pytest.fixture
def tiny_base(db, tiny_starter_model) -> BaseModel:
    return base_model_register(name="starter-tiny", path=tiny_starter_model)


@pytest.fixture
def adapter(tenant, tiny_base):
    return adapter_create(tenant, name="autocomplete", base_model=tiny_base, is_default=True)
