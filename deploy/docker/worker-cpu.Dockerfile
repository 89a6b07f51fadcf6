# syntax=docker/dockerfile:1.7
# The CPU inference worker (development, tests, small models): vLLM's CPU build as
# inference/requirements-cpu.txt pins it, plus inference/.
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t REGISTRY/dmx-worker-cpu:TAG .
# The node token comes at run time (DMX_NODE_TOKEN or DMX_NODE_TOKEN_FILE), never at build time.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Debian's versions are not pinned (DL3008): the archive drops old ones; the base tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
COPY inference/requirements-cpu.txt /tmp/requirements-cpu.txt
# vLLM's CPU build takes torch's CPU wheels from PyTorch's index.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir \
       --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/requirements-cpu.txt

FROM ${PYTHON_IMAGE} AS runtime
ARG APP_UID=10001
# Debian's versions are not pinned (DL3008): the archive drops old ones; the base tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid ${APP_UID} dmx \
    && useradd --system --uid ${APP_UID} --gid dmx --home-dir /app --shell /usr/sbin/nologin dmx \
    && mkdir -p /app /models /app/.run \
    && chown -R dmx:dmx /app /models
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=dmx:dmx inference inference
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/models \
    VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_CPU_OMP_THREADS_BIND=auto \
    DMX_ENGINE_NICE=10 \
    DMX_WORKER_HOST=0.0.0.0 \
    DMX_WORKER_PORT=8100
USER ${APP_UID}:${APP_UID}
EXPOSE 8100
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('DMX_WORKER_PORT', '8100') + '/health', timeout=2)"]
ENTRYPOINT ["python", "-m", "inference.worker"]
CMD ["--", "--enforce-eager"]
