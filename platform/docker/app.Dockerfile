# syntax=docker/dockerfile:1
# Strop's one image for the API, the Celery workers, beat and the one-shot jobs; the command names
# what the container runs (platform/docker/entrypoint.sh: a process of platform/Procfile, or
# migrate, base-model, store-init, manage ...). Built from the repository root:
#   docker build -f platform/docker/app.Dockerfile -t strop-app:cpu .
#   docker build -f platform/docker/app.Dockerfile --build-arg TORCH_VARIANT=cuda -t strop-app:cuda .
# Every build step is a script under platform/docker/, which CI also runs on a bare machine.
# No secret is baked in: every setting comes from the environment when the container starts.

# The dashboard's front-end libraries, with npm, in a stage of their own: the image has no npm.
FROM node:22-bookworm-slim AS vendor
WORKDIR /src
COPY Makefile ./
COPY platform/vendor-assets.sh platform/
COPY platform/docker/build-static.sh platform/docker/
RUN bash platform/docker/build-static.sh vendor /out

FROM python:3.11-slim-bookworm
# cpu: torch's CPU build; cuda: torch with its CUDA libraries, for a gpu worker on a GPU host.
ARG TORCH_VARIANT=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/app/.venv/bin:$PATH \
    STROP_VAR_DIR=/app/var \
    API_BIND=0.0.0.0:8000
WORKDIR /app
# Dependencies first, so a change to the code rebuilds only the layers after them.
COPY requirements.lock requirements-cuda.lock ./
COPY sdk/ sdk/
COPY platform/docker/install-app.sh platform/docker/add-user.sh platform/docker/
RUN bash platform/docker/install-app.sh "$TORCH_VARIANT"
COPY . .
COPY --from=vendor /out/vendor/static var/vendor/static
# collectstatic into /app/var/staticfiles (STATIC_ROOT), which WhiteNoise serves.
RUN bash platform/docker/build-static.sh collect /app/var
USER 10001:10001
EXPOSE 8000
# Liveness: /health (the process answers and reaches its database). Compose asks /health/ready.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "platform/docker/healthcheck.py", "http", "/health"]
ENTRYPOINT ["bash", "platform/docker/entrypoint.sh"]
CMD ["api"]
