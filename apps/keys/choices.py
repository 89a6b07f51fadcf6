from django.db import models


class PriorityTier(models.IntegerChoices):
    """Who goes first when a model is saturated; also passed to vLLM's priority scheduler."""

    BATCH = 0, "Batch"
    STANDARD = 1, "Standard"
    PRIORITY = 2, "Priority"


class QuotaPeriod(models.TextChoices):
    HOUR = "hour", "Hour"
    DAY = "day", "Day"
    MONTH = "month", "Month"


class MemberRole(models.TextChoices):
    """Owners change keys, members and limits; members see and use the tenant's keys."""

    OWNER = "owner", "Owner"
    MEMBER = "member", "Member"


class TokenScope(models.TextChoices):
    """What a management token may do: read everything its user may see, or change it too."""

    READ = "read", "Read only"
    WRITE = "write", "Read and write"
