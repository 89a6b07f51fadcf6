"""The ASGI application: Channels routes /v1 to the gateway, everything else to Django, and
the WebSockets (the portal's playground, the console's fleet dashboard) to their consumers.

Django's handler (and its sync middleware) never sees a /v1 request or a node heartbeat; the
admin, the rest of the internal node API, /health and /metrics go through it as usual.
"""

import os

# Each gateway process serves on one core; the thread pools numerical libraries start for
# themselves (OpenBLAS's, the tokenizers' rayon) only spin against its event loop. Set before
# Django imports the apps that import them.
for _pool in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from django.core.asgi import get_asgi_application  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")
django_application = get_asgi_application()  # sets Django up before the imports below

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from apps.batches import consumers as batches  # noqa: E402
from apps.console.consumers import FleetDashboardConsumer  # noqa: E402
from apps.console.dashboard import FLEET_SOCKET_PATH  # noqa: E402
from apps.gateway.consumers import (  # noqa: E402
    CompletionsEndpoint,
    Lifespan,
    LivenessEndpoint,
    ModelsEndpoint,
    ReadinessEndpoint,
    ResponsesSocket,
    StoredResponseEndpoint,
    TokenCountEndpoint,
    UnknownPathEndpoint,
)
from apps.gateway.schemas import Endpoint  # noqa: E402
from apps.hardware.consumers import NodeHeartbeatEndpoint  # noqa: E402
from apps.portal.consumers import PlaygroundConsumer  # noqa: E402

gateway_routes = [
    path("v1/chat/completions", CompletionsEndpoint(Endpoint.CHAT)),
    path("v1/completions", CompletionsEndpoint(Endpoint.COMPLETIONS)),
    path("v1/responses", CompletionsEndpoint(Endpoint.RESPONSES)),
    path("v1/responses/input_tokens", TokenCountEndpoint(Endpoint.RESPONSES)),
    # Compaction returns OpenAI's opaque, encrypted items: not served (README, "Responses").
    path("v1/responses/compact", UnknownPathEndpoint()),
    path("v1/responses/<str:response_id>", StoredResponseEndpoint()),
    path("v1/responses/<str:response_id>/input_items", StoredResponseEndpoint("input_items")),
    path("v1/responses/<str:response_id>/cancel", StoredResponseEndpoint("cancel")),
    path("v1/messages", CompletionsEndpoint(Endpoint.MESSAGES)),
    path("v1/messages/count_tokens", TokenCountEndpoint(Endpoint.MESSAGES)),
    path("v1/embeddings", CompletionsEndpoint(Endpoint.EMBEDDINGS)),
    path("v1/files", batches.files),
    path("v1/files/<str:file_id>", batches.file),
    path("v1/files/<str:file_id>/content", batches.file_content),
    path("v1/batches", batches.batches),
    path("v1/batches/<str:batch_id>", batches.batch),
    path("v1/batches/<str:batch_id>/cancel", batches.batch_cancel),
    path("v1/models", ModelsEndpoint()),
    path("v1/models/<path:model>", ModelsEndpoint()),
    re_path(r"^v1/", UnknownPathEndpoint()),
    # Probes, off Django's handler: a liveness probe must not wait on the database.
    path("livez", LivenessEndpoint()),
    path("readyz", ReadinessEndpoint()),
    # Every node, every few seconds: kept off Django's handler like /v1 (apps.hardware.consumers).
    path("internal/v1/nodes/<int:node_id>/heartbeat", NodeHeartbeatEndpoint()),
    re_path(r"", django_application),
]

# The session cookie signs the user in; the Origin check keeps another site's page from using
# it (a WebSocket handshake is not covered by CSRF protection).
websocket_routes = [
    path("ws/playground", PlaygroundConsumer.as_asgi()),
    path(FLEET_SOCKET_PATH, FleetDashboardConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": URLRouter(gateway_routes),
        "websocket": URLRouter(
            [
                # The API's socket: a key authenticates it, no cookie, so no Origin to check.
                path("v1/responses", ResponsesSocket.as_asgi()),
                re_path(
                    r"",
                    AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_routes))),
                ),
            ]
        ),
        "lifespan": Lifespan(),
    }
)
