import logging
from collections.abc import Callable

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from redis.exceptions import RedisError

from apps.hardware.models import HardwareProfile, Node, NodeToken
from apps.hardware.nodestate import NodeSnapshot
from apps.hardware.resources import NodeHardware, describe
from apps.hardware.selectors import fleet_snapshots
from apps.hardware.services import (
    hardware_profile_update,
    node_drain,
    node_token_create,
    node_token_update,
    node_undrain,
)
from dmxplatform.admin import OperatorActions, ReadOnlyAdminMixin

logger = logging.getLogger(__name__)

# What the in-flight column says when Redis cannot be read: the rows' figures lag a sync, and
# after a drain they would show requests that already finished.
NOT_READ = "-"


def _in_flight(running: int, waiting: int) -> str:
    return f"{running + waiting} ({running} running, {waiting} waiting)"


def _in_flight_column(request: HttpRequest) -> Callable[[Node], str]:
    """The in-flight column of one request's list: the live figures, read from Redis at the
    first row shown and kept on the request for the rest."""

    def live() -> dict[int, NodeSnapshot] | None:
        if not hasattr(request, "_node_inflight"):
            try:
                request._node_inflight = fleet_snapshots()
            except RedisError as exc:
                logger.warning("node list without live in-flight figures: %s", exc)
                request._node_inflight = None
        return request._node_inflight

    @admin.display(description="In flight")
    def in_flight(node: Node) -> str:
        snapshots = live()
        if snapshots is None:
            return NOT_READ
        snapshot = snapshots.get(node.id)
        if snapshot is None:  # Redis lost it: the row's, until the next heartbeat
            return _in_flight(node.num_requests_running, node.num_requests_waiting)
        engine = snapshot.engine
        return _in_flight(engine.num_requests_running, engine.num_requests_waiting)

    return in_flight


@admin.register(HardwareProfile)
class HardwareProfileAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "display_name",
        "kind",
        "memory_gb",
        "memory_bandwidth_gbps",
        "compute_capability",
        "fp16_tflops",
        "fp8_tflops",
        "nvlink_bandwidth_gbps",
        "tdp_watts",
        "hourly_price_usd",
        "price_overridden",
    ]
    list_filter = ["kind", "architecture", "price_overridden"]
    search_fields = ["name", "display_name"]
    fieldsets = [
        (None, {"fields": ["name", "display_name", "kind", "nvml_names", "datasheet"]}),
        (
            "Price",
            {
                "fields": ["hourly_price_usd", "price_overridden"],
                "description": "The files' price is a default; a price changed here is kept "
                "when the files are loaded again.",
            },
        ),
        (
            "Datasheet",
            {
                "fields": [
                    "architecture",
                    "compute_capability",
                    "tensor_core_generation",
                    "memory_gb",
                    "memory_bandwidth_gbps",
                    "sm_count",
                    "fp16_tflops",
                    "fp8_tflops",
                    "int8_tops",
                    "pcie_generation",
                    "pcie_lanes",
                    "nvlink_bandwidth_gbps",
                    "tdp_watts",
                ],
                "description": "From inference/hardware/profiles/; a load of the files "
                "overwrites edits made here.",
            },
        ),
    ]

    def save_model(self, request: HttpRequest, obj: HardwareProfile, form, change: bool) -> None:
        price_changed = change and "hourly_price_usd" in form.changed_data
        hardware_profile_update(profile=obj, price_changed=price_changed)


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
class NodeAdmin(OperatorActions, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "status",
        "drained",
        "model_version",
        "url",
        "last_heartbeat_at",
        "in_flight",
        "kv_cache_percent",
        "profile",
        "gpus",
        "temperature",
    ]
    list_filter = ["status", "drained", "model_version__model", "profile"]
    search_fields = ["name", "url"]
    list_select_related = ["model_version__model", "profile"]
    actions = ["drain", "undrain"]
    console_refuses = ("add",)  # nodes register themselves with a node token
    readonly_fields = [
        "name",
        "url",
        "status",
        "drained",
        "model_version",
        "served_model_name",
        "max_model_len",
        "token",
        "registered_at",
        "last_heartbeat_at",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage",
        "gpus",
        "gpu_memory",
        "bandwidth_utilization",
        "temperature",
        "nvlink",
        "resources",
        "engine_args",
    ]
    fields = ["profile", *readonly_fields]

    @admin.action(
        description="Drain: no new requests (in-flight ones finish)", permissions=["operate"]
    )
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            node_drain(node=node)
        self.message_user(request, f"Drained {queryset.count()} node(s).", messages.SUCCESS)

    @admin.action(description="Undrain: route new requests again", permissions=["operate"])
    def undrain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            node_undrain(node=node)
        self.message_user(request, f"Undrained {queryset.count()} node(s).", messages.SUCCESS)

    def get_list_display(self, request: HttpRequest) -> list[str | Callable[[Node], str]]:
        # In flight is the last heartbeat's, so that after a drain an operator watches it fall
        # to zero; the rows catch up only at the next nodes_sync. Only the list shows it, so
        # only the list reads Redis, and once a page: the column is bound to this request,
        # since the ModelAdmin is one instance that every request shares.
        return [
            _in_flight_column(request) if column == "in_flight" else column
            for column in super().get_list_display(request)
        ]

    @admin.display(description="In flight")
    def in_flight(self, node: Node) -> str:
        """The row's figures (the list shows the live ones: get_list_display)."""
        return _in_flight(node.num_requests_running, node.num_requests_waiting)

    @staticmethod
    def _hardware(node: Node) -> NodeHardware:
        # Five columns read one parse of the node's view.
        if getattr(node, "_described", None) is None:
            node._described = describe(node.resources)
        return node._described

    @admin.display(description="GPUs")
    def gpus(self, node: Node) -> str:
        return self._hardware(node).gpus

    @admin.display(description="Memory used")
    def gpu_memory(self, node: Node) -> str:
        return self._hardware(node).memory

    @admin.display(description="Memory bandwidth used")
    def bandwidth_utilization(self, node: Node) -> str:
        return self._hardware(node).bandwidth

    @admin.display(description="Temperature")
    def temperature(self, node: Node) -> str:
        return self._hardware(node).temperature

    @admin.display(description="NVLink")
    def nvlink(self, node: Node) -> str:
        return self._hardware(node).nvlink

    @admin.display(description="KV cache")
    def kv_cache_percent(self, node: Node) -> str:
        return f"{node.kv_cache_usage:.0%}"
