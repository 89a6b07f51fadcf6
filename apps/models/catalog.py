"""The gateway's in-memory view of the model registry, rebuilt when the registry changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.models.tokenizers import PromptCounter


@dataclass(frozen=True, slots=True)
class VersionEntry:
    id: int
    tag: str
    is_stable: bool
    canary_percent: float


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: int
    name: str
    owned_by: str
    created: int
    max_context_tokens: int
    versions: dict[int, VersionEntry]
    counter: PromptCounter | None
    sla_ttft_p95_ms: int | None = None
    sla_latency_p95_ms: int | None = None
    kind: str = "generate"  # apps.models.choices.ModelKind

    def canaries(self) -> list[VersionEntry]:
        return [v for v in self.versions.values() if not v.is_stable and v.canary_percent > 0]


@dataclass(frozen=True, slots=True)
class Catalog:
    """Active models by name; `version` is the registry version it was built from."""

    version: int = -1
    models: dict[str, ModelEntry] = field(default_factory=dict)
    counters: dict[str, PromptCounter] = field(default_factory=dict)

    def get(self, name: str) -> ModelEntry | None:
        return self.models.get(name)
