"""Cut OpenAI's OpenAPI description down to the operations the gateway serves.

    .venv/bin/python tests/gateway/openai_schema/cut.py /path/to/openai/openapi.yaml

writes openapi.json beside this script: the operations in OPERATIONS, verbatim but for their
`x-oaiMeta` (documentation examples, not part of the contract), and every component they
reach through `$ref` (and discriminator mappings), transitively; nothing else. The document's
own header (openapi, info, servers, security) is kept as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "openapi.json"
# (path, method): what the gateway serves under /v1.
OPERATIONS = (
    ("/chat/completions", "post"),
    ("/completions", "post"),
    ("/responses", "post"),
    ("/responses/{response_id}", "get"),
    ("/responses/{response_id}", "delete"),
    ("/responses/{response_id}/input_items", "get"),
    ("/responses/{response_id}/cancel", "post"),
    ("/responses/input_tokens", "post"),
    ("/embeddings", "post"),
    ("/models", "get"),
    ("/models/{model}", "get"),
)
HEADER = ("openapi", "info", "servers", "security")
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
DROPPED_OPERATION_KEYS = {"x-oaiMeta"}


class _Loader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):
    """Safe YAML, except that timestamps stay strings (JSON has no dates)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _refs(node: Any) -> list[str]:
    """Every local reference under node: `$ref` values and discriminator mapping targets."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.append(value)
            elif key == "discriminator" and isinstance(value, dict):
                found.extend(v for v in (value.get("mapping") or {}).values() if isinstance(v, str))
                found.extend(_refs({k: v for k, v in value.items() if k != "mapping"}))
            else:
                found.extend(_refs(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_refs(item))
    return found


def _pointer(ref: str) -> tuple[str, ...]:
    if not ref.startswith("#/"):
        raise SystemExit(f"not a local reference: {ref}")
    return tuple(part.replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/"))


def _get(document: dict, pointer: tuple[str, ...]) -> Any:
    node: Any = document
    for part in pointer:
        node = node[part]
    return node


def cut(spec: dict) -> dict:
    out: dict[str, Any] = {key: spec[key] for key in HEADER if key in spec}
    out["paths"] = paths = {}
    for path, method in OPERATIONS:
        item = spec["paths"][path]
        # Path-level keys (parameters, summary) stay; other methods on the path go.
        kept = paths.setdefault(path, {k: v for k, v in item.items() if k not in METHODS})
        kept[method] = {k: v for k, v in item[method].items() if k not in DROPPED_OPERATION_KEYS}

    # Security schemes are named by security requirements, not referenced: keep those named.
    requirements = list(spec.get("security", []))
    for item in paths.values():
        for method in METHODS & item.keys():
            requirements.extend(item[method].get("security", []))
    pending = [f"#/components/securitySchemes/{name}" for r in requirements for name in r]
    pending.extend(_refs(paths))

    seen: set[tuple[str, ...]] = set()
    components: dict[str, dict[str, Any]] = {}
    while pending:
        pointer = _pointer(pending.pop())
        if pointer in seen:
            continue
        seen.add(pointer)
        if pointer[0] != "components" or len(pointer) != 3:
            raise SystemExit(f"unexpected reference target: #/{'/'.join(pointer)}")
        value = _get(spec, pointer)
        components.setdefault(pointer[1], {})[pointer[2]] = value
        pending.extend(_refs(value))
    out["components"] = {
        section: dict(sorted(components[section].items())) for section in sorted(components)
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="OpenAI's openapi.yaml")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    spec = yaml.load(args.source.read_text(encoding="utf-8"), Loader=_Loader)
    result = cut(spec)
    args.output.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", "utf-8")
    count = sum(len(v) for v in result["components"].values())
    print(f"{args.output}: {len(OPERATIONS)} operations, {count} components", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
