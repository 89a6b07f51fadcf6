from django.db import models


class ModelKind(models.TextChoices):
    """What a model's workers serve: completions, or embeddings (vLLM run as a pooling model)."""

    GENERATE = "generate", "Generates text (chat, completions)"
    EMBED = "embed", "Embeds text (embeddings)"
