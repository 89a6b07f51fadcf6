"""Hardware profiles, inference nodes and the tokens nodes register with."""

from __future__ import annotations

from django.db import models

from apps.hardware.choices import NodeStatus, ProfileKind
from apps.models.models import ModelVersion


class HardwareProfile(models.Model):
    """What one accelerator SKU offers and costs; routing and engine arguments read it.

    The datasheet figures come from inference/hardware/profiles/*.yaml, loaded by
    hardware_profiles_load (a migration, `manage.py hardware_profiles --load`); the price there
    is a default that operators override here, and a load keeps their price.
    """

    name = models.SlugField(max_length=64, unique=True)
    display_name = models.CharField(max_length=128)
    kind = models.CharField(max_length=8, choices=ProfileKind.choices, default=ProfileKind.GPU)
    architecture = models.CharField(max_length=32, blank=True)
    compute_capability = models.CharField(max_length=8, blank=True, help_text="CUDA's, e.g. 9.0.")
    tensor_core_generation = models.PositiveSmallIntegerField(null=True, blank=True)
    memory_gb = models.FloatField(null=True, blank=True, help_text="Device memory per GPU, GB.")
    memory_bandwidth_gbps = models.FloatField(
        null=True, blank=True, help_text="Memory bandwidth per GPU, GB/s."
    )
    sm_count = models.PositiveIntegerField(null=True, blank=True)
    fp16_tflops = models.FloatField(
        null=True, blank=True, help_text="Dense FP16 tensor TFLOPS (BF16 the same where it exists)."
    )
    fp8_tflops = models.FloatField(
        null=True, blank=True, help_text="Dense FP8 tensor TFLOPS; empty where unsupported."
    )
    int8_tops = models.FloatField(null=True, blank=True, help_text="Dense INT8 TOPS.")
    pcie_generation = models.PositiveSmallIntegerField(null=True, blank=True)
    pcie_lanes = models.PositiveSmallIntegerField(null=True, blank=True)
    nvlink_bandwidth_gbps = models.FloatField(
        null=True, blank=True, help_text="NVLink bandwidth per GPU, GB/s; 0 without NVLink."
    )
    tdp_watts = models.PositiveIntegerField(null=True, blank=True)
    hourly_price_usd = models.DecimalField(
        max_digits=8,
        decimal_places=4,
        help_text="Price of one GPU (of the node, for CPU) for one hour, USD. Nodes take a new "
        "price when they next register.",
    )
    price_overridden = models.BooleanField(
        default=False,
        help_text="Set when an operator changes the price: loading the profile files then keeps "
        "it. Clear it to return to the files' price at the next load.",
    )
    nvml_names = models.JSONField(
        default=list, blank=True, help_text="Name patterns NVML reports for this SKU."
    )
    datasheet = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(hourly_price_usd__gte=0), name="hardware_profile_price_gte_0"
            )
        ]

    def __str__(self) -> str:
        return self.display_name


class NodeToken(models.Model):
    """A credential an operator issues so that inference workers can register as nodes."""

    name = models.CharField(max_length=128)
    token_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.token_id})"


class Node(models.Model):
    """One inference worker: a vLLM engine serving one model version on a set of GPUs."""

    name = models.CharField(max_length=128, unique=True)
    url = models.URLField(help_text="Base URL of the node's OpenAI-compatible server.")
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.UP)
    # The operator's cordon, apart from `status` (which the worker reports and heartbeats
    # rewrite): the row is its source of truth, and the node's live state carries it.
    drained = models.BooleanField(
        default=False,
        help_text="Set by an operator: no new requests are routed here while in-flight ones "
        "finish; kept across heartbeats and re-registration until undrained.",
    )
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="nodes")
    served_model_name = models.CharField(max_length=128)
    max_model_len = models.PositiveIntegerField()
    profile = models.ForeignKey(
        HardwareProfile, on_delete=models.SET_NULL, null=True, blank=True, related_name="nodes"
    )
    token = models.ForeignKey(NodeToken, on_delete=models.PROTECT, related_name="nodes")
    registered_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    num_requests_running = models.PositiveIntegerField(default=0)
    num_requests_waiting = models.PositiveIntegerField(default=0)
    kv_cache_usage = models.FloatField(default=0.0, help_text="Fraction of KV cache in use, 0..1.")
    resources = models.JSONField(default=dict, blank=True, help_text="GPUs or CPU, as reported.")
    engine_args = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["status", "last_heartbeat_at"])]

    def __str__(self) -> str:
        return self.name
