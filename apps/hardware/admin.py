from django.contrib import admin, messages
from django.http import HttpRequest

from apps.hardware.models import HardwareProfile, Node, NodeToken
from apps.hardware.services import node_token_create, node_token_update


@admin.register(HardwareProfile)
class HardwareProfileAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "display_name",
        "memory_gb",
        "memory_bandwidth_gbps",
        "hourly_price_usd",
    ]
    search_fields = ["name", "display_name"]


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "token_id", "created_at", "revoked_at"]
    fields = ["name", "token_id", "created_at", "revoked_at"]
    readonly_fields = ["token_id", "created_at"]

    def save_model(self, request: HttpRequest, obj: NodeToken, form, change: bool) -> None:
        if change:
            node_token_update(token=obj)
            return
        token, plaintext = node_token_create(name=obj.name)
        obj.pk = token.pk
        messages.warning(
            request,
            f"The node token, shown this once; the worker takes it as DMX_NODE_TOKEN: {plaintext}",
        )


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "status",
        "model_version",
        "url",
        "last_heartbeat_at",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_percent",
        "profile",
    ]
    list_filter = ["status", "model_version__model", "profile"]
    search_fields = ["name", "url"]
    list_select_related = ["model_version__model", "profile"]
    readonly_fields = [
        "name",
        "url",
        "status",
        "model_version",
        "served_model_name",
        "max_model_len",
        "token",
        "registered_at",
        "last_heartbeat_at",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage",
        "resources",
        "engine_args",
    ]
    fields = ["profile", *readonly_fields]

    @admin.display(description="KV cache")
    def kv_cache_percent(self, node: Node) -> str:
        return f"{node.kv_cache_usage:.0%}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # nodes register themselves with a node token
