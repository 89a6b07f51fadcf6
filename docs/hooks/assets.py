"""MkDocs hook: Mermaid from node_modules (package.json pins it), copied into the built site.

Material loads Mermaid from a CDN unless the page already has it; the site is read where no CDN
answers (an operator's laptop, a closed network), so it ships its own copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent.parent
MERMAID = ROOT / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
# Where mkdocs.yml's extra_javascript names it.
TARGET = "assets/javascripts/mermaid.min.js"


def on_post_build(config: Any) -> None:
    """Copy Mermaid into the site; without it the diagrams would not render."""
    if not MERMAID.exists():
        raise PluginError(f"{MERMAID} is missing: run ./scripts/bootstrap.sh (npm ci)")
    target = Path(config["site_dir"]) / TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(MERMAID, target)
