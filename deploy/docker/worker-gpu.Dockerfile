# syntax=docker/dockerfile:1.7
# The GPU inference worker: vLLM's official image at the version inference/requirements-gpu.txt
# pins, plus inference/ (Django-free; it talks to the platform over HTTP only).
#   docker build -f deploy/docker/worker-gpu.Dockerfile -t REGISTRY/dmx-worker-gpu:TAG .
# The node token comes at run time (DMX_NODE_TOKEN or DMX_NODE_TOKEN_FILE), never at build time.

ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0

FROM ${VLLM_IMAGE} AS deps
# nvidia-ml-py as inference/requirements-gpu.txt pins it (vLLM itself is the base image's).
COPY inference/requirements-gpu.txt /tmp/requirements-gpu.txt
RUN grep -v '^vllm==' /tmp/requirements-gpu.txt > /tmp/requirements-extra.txt \
    && python3 -m pip install --no-cache-dir -r /tmp/requirements-extra.txt

FROM deps AS runtime
ARG APP_UID=10001
RUN groupadd --system --gid ${APP_UID} dmx \
    && useradd --system --uid ${APP_UID} --gid dmx --home-dir /app --shell /usr/sbin/nologin dmx \
    && mkdir -p /app /models /app/.run \
    && chown -R dmx:dmx /app /models
WORKDIR /app
COPY --chown=dmx:dmx inference inference
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/models \
    DMX_WORKER_HOST=0.0.0.0 \
    DMX_WORKER_PORT=8100
USER ${APP_UID}:${APP_UID}
EXPOSE 8100
# vLLM's /health on the port the worker starts it on; the start period covers loading weights.
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('DMX_WORKER_PORT', '8100') + '/health', timeout=2)"]
# vLLM's image starts its API server by default; the worker starts vLLM itself.
ENTRYPOINT ["python3", "-m", "inference.worker"]
CMD []
