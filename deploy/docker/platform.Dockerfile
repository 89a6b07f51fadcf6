# syntax=docker/dockerfile:1.7
# The platform image: one image, four roles chosen by the command (deploy/kubernetes/base):
#   gateway     python -m config.serve --host 0.0.0.0 --port 8000   (the default)
#   worker      celery -A config worker --queues default,ledger,fleet --without-gossip --without-mingle --without-heartbeat
#   beat        celery -A config beat --schedule /tmp/celerybeat-schedule
#   migrations  python manage.py migrate --noinput
# Build from the repository root:
#   docker build -f deploy/docker/platform.Dockerfile -t REGISTRY/dmx-platform:TAG .
# No secret is baked in: DJANGO_SECRET_KEY, DMX_KEY_PEPPER, DATABASE_URL, REDIS_URL come from the
# environment at run time (the Kubernetes Secret).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG NODE_IMAGE=node:22.21.1-bookworm-slim

# The portal's front-end libraries (Chart.js), as package-lock.json pins them.
FROM ${NODE_IMAGE} AS front
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --omit=dev

# The locked tree in a virtualenv, and the project installed in place (as scripts/bootstrap.sh
# does): settings find templates/ and node_modules/ beside the code (dmxplatform.env.BASE_DIR),
# and the intent classifier's C extension is compiled there. Same path as the runtime stage.
FROM ${PYTHON_IMAGE} AS build
# Debian's versions are not pinned (DL3008): the archive drops old ones; the base tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY requirements/lock.txt requirements/lock.txt
COPY dmxplatform dmxplatform
COPY config config
COPY apps apps
COPY inference inference
COPY templates templates
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -c requirements/lock.txt -e '.[tracing,s3]'

FROM ${PYTHON_IMAGE} AS runtime
# The uid the Kubernetes manifests run as (runAsUser); no login shell, no home to write secrets to.
ARG APP_UID=10001
RUN groupadd --system --gid ${APP_UID} dmx \
    && useradd --system --uid ${APP_UID} --gid dmx --no-create-home --shell /usr/sbin/nologin dmx
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
COPY --from=front /src/node_modules/chart.js/dist node_modules/chart.js/dist
# Static files collected at build time; DMX_DEBUG=1 lends this one command the development
# secret settings need to import, and nothing of it stays in the image's environment.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=dmxplatform.settings \
    DMX_STATIC_ROOT=/app/static \
    DMX_SPOOL_DIR=/var/lib/dmx/spool \
    DMX_GATEWAY_HOST=0.0.0.0 \
    DMX_GATEWAY_PORT=8000
RUN DMX_DEBUG=1 python manage.py collectstatic --noinput >/dev/null \
    && mkdir -p /var/lib/dmx/spool \
    && chown -R dmx:dmx /var/lib/dmx
USER ${APP_UID}:${APP_UID}
EXPOSE 8000
# The gateway's liveness (its event loop answers); Celery roles override the command, and
# Kubernetes uses its own probes rather than this.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('DMX_GATEWAY_PORT', '8000') + '/livez', timeout=2)"]
CMD ["python", "-m", "config.serve", "--host", "0.0.0.0", "--port", "8000"]
