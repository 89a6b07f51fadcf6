from django.db import models


class NodeStatus(models.TextChoices):
    UP = "up", "Up"
    DRAINING = "draining", "Draining"
    DOWN = "down", "Down"


class ProfileKind(models.TextChoices):
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU only"
