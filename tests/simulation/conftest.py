"""The simulated developers' tests: the serving fixtures (a tenant, the session's base model, a
default adapter) for the end-to-end session through the SDK."""

from tests.serving.conftest import base_model, serving_adapter, serving_tenant  # noqa: F401
