"""Read the data set's tables: phrasing families and slot values, TOML files beside this module."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Family:
    name: str
    templates: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.name.split(".")[0]

    @property
    def lang(self) -> str:
        return self.name.split(".")[1]


def _frozen(value: Any) -> Any:
    """Return TOML arrays as tuples, nested ones too: the tables are constants."""
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value


def load_table(name: str) -> dict[str, Any]:
    """Return one table file's arrays by name: `load_table("fillers_en")["passages"]`."""
    with (TABLES_DIR / f"{name}.toml").open("rb") as file:
        return {key: _frozen(value) for key, value in tomllib.load(file).items()}


def load_families() -> tuple[Family, ...]:
    """Return the phrasing families in file order, the order generate.py draws them in."""
    rows = load_table("phrasings")["families"]
    return tuple(Family(row["name"], tuple(row["templates"])) for row in rows)
