"""What the suite's schemathesis runs share: the phases, no generated credentials, and the
platform's error shape every 4xx must have."""

from __future__ import annotations

from typing import Any

from schemathesis.config import SchemathesisConfig

ERROR_FIELDS = {"message", "type", "param", "code"}


def fuzz_config(*, max_examples: int, **extra: Any) -> SchemathesisConfig:
    """Examples, the coverage phase's deterministic boundary and negative cases, then
    `max_examples` generated cases per operation; no stateful phase. The tests send their own
    credential: generated Authorization headers would only turn cases into 401s."""
    return SchemathesisConfig.from_dict(
        {
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "generation": {"max-examples": max_examples, "with-security-parameters": False},
            **extra,
        }
    )
