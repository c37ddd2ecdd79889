"""The simulated developers' tests: the serving fixtures (a tenant, the session's base model, a
default adapter) for the end-to-end session through the SDK."""

