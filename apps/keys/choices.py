from django.db import models


class UsageStatus(models.TextChoices):
    OK = "ok", "Completed"
    CLIENT_DISCONNECTED = "client_disconnected", "Client disconnected"
    UPSTREAM_ERROR = "upstream_error", "Upstream error"
    REJECTED = "rejected", "Rejected by the node"
