from django.db import models


class NodeStatus(models.TextChoices):
    UP = "up", "Up"
    DRAINING = "draining", "Draining"
    DOWN = "down", "Down"
