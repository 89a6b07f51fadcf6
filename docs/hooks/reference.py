"""MkDocs hook: the pages' generated parts, made from the code at every build so they cannot
drift from it.

A page asks for one with a line `<!-- reference: NAME -->`; an unknown name fails the build.

- `v1-endpoints`: what config.asgi's gateway_routes serve, from the routes and their endpoints'
  docstrings.
- `v1-errors`: every error code a /v1 client can get, from the apps' error-code enums and the
  kernel's error classes, with the HTTP statuses it is raised with (read from the raise sites).
- `management-api`: the management API's operations and objects, from drf-spectacular's schema
  (what /api/schema/ serves).
- `alerts`: the alerts deploy/prometheus ships, each linked to its runbook (a missing runbook
  is a broken anchor, which --strict fails).
- `dashboard`: the Grafana dashboard's rows and panels (deploy/grafana/dmx-platform.json).
- `settings`: every environment variable the platform reads (tools/docs/settings.py).
- `intent-labelling`: the intent labelling guide, tools/intent/LABELLING.md, less its title
  (the page has its own) and with its links to the code as code names.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent.parent
MARKER = re.compile(r"^<!-- reference: ([a-z0-9-]+) -->$", re.MULTILINE)

# The error codes /v1 answers with: the gateway's, and those of the facades it calls.
V1_ERROR_ENUMS = (
    "apps.gateway.errors.GatewayErrorCode",
    "apps.keys.errors.KeysErrorCode",
    "apps.billing.errors.BillingErrorCode",
    "apps.models.errors.ModelsErrorCode",
    "apps.routing.errors.RoutingErrorCode",
)
# Where /v1's errors are raised: the gateway and the doors it goes through.
V1_RAISE_SITES = ("apps/gateway", "apps/keys", "apps/billing", "apps/models", "apps/routing")


def on_config(config: Any) -> Any:
    """Set Django up once: the references read the routes, the enums and the schema."""
    # Nothing here reads a secret or a database: the development defaults suffice.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")
    os.environ.setdefault("DMX_DEBUG", "1")
    import django

    django.setup()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each reference marker with its generated Markdown."""
    if "<!-- reference: v1-errors -->" in markdown:
        _check_error_table(markdown, page.file.src_path)

    def render(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_path}: unknown reference {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(render, markdown)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").split())
    return text.split(". ")[0].rstrip(".") + "." if text else ""


def v1_endpoints() -> str:
    """A row per route of config.asgi's HTTP router, in the order it matches them."""
    from config.asgi import gateway_routes

    rows = ["| path | method | served by | what it does |", "|---|---|---|---|"]
    for route in gateway_routes:
        pattern = str(route.pattern).strip("^$")
        app = route.callback
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", pattern)
        if pattern == "":
            rows.append(
                "| anything else | any | Django (`config.urls`) | the portal, the management API "
                "(`/api/v1/`), its schema and Swagger UI, the admin, the internal node API, "
                "`/health`, `/metrics` |"
            )
            continue
        if pattern == "v1/":
            path = "/v1/…"
        # An endpoint class without a docstring of its own is its module's one endpoint.
        doc = type(app).__doc__ or sys.modules[type(app).__module__].__doc__ or ""
        doc = " ".join(doc.split())
        method, _, what = doc.partition(" ")
        what = what.split(": ", 1)[1] if ": " in what else what
        if type(app).__name__ == "CompletionsEndpoint":
            what = f"`{app.endpoint.value}` through the one pipeline, in its own API"
        allowed = getattr(app, "allowed", None)  # an endpoint serving several methods
        if allowed is not None:
            method = allowed
        elif method not in {"GET", "POST"}:
            method, what = "any", doc
        served_by = f"`{type(app).__module__}.{type(app).__name__}`"
        rows.append(f"| `{path}` | {method} | {served_by} | {_cell(_first_sentence(what))} |")
    return "\n".join(rows) + "\n"


def _import(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def _error_classes() -> dict[str, type]:
    """Every ApplicationError subclass by name, the kernel's and the apps'."""
    from dmxplatform.errors import ApplicationError

    for module in V1_RAISE_SITES:
        __import__(module.replace("/", ".") + ".errors")
    found: dict[str, type] = {}
    stack: list[type] = [ApplicationError]
    while stack:
        cls = stack.pop()
        found[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    return found


def _statuses_by_code(classes: dict[str, type], enums: dict[str, type[StrEnum]]) -> dict[str, set]:
    """The HTTP statuses each code is raised with: `SomeError(..., code=Enum.MEMBER)` calls."""
    statuses: dict[str, set[int]] = {}
    for source in V1_RAISE_SITES:
        for path in (ROOT / source).rglob("*.py"):
            if "/migrations/" in path.as_posix():
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                    continue
                cls = classes.get(node.func.id)
                for keyword in node.keywords:
                    value = keyword.value
                    if (
                        cls is not None
                        and keyword.arg == "code"
                        and isinstance(value, ast.Attribute)
                        and isinstance(value.value, ast.Name)
                        and value.value.id in enums
                    ):
                        code = enums[value.value.id][value.attr].value
                        statuses.setdefault(code, set()).add(cls.status)
    return statuses


def v1_errors() -> str:
    """A row per code: where it is defined, the statuses it is raised with, its error type."""
    classes = _error_classes()
    enums: dict[str, type[StrEnum]] = {}
    for dotted in V1_ERROR_ENUMS:
        enums[dotted.rpartition(".")[2]] = _import(dotted)
    statuses = _statuses_by_code(classes, enums)
    for cls in classes.values():
        statuses.setdefault(cls.default_code, set()).add(cls.status)
    defined: dict[str, list[str]] = {}
    for name, enum in enums.items():
        for member in enum:
            defined.setdefault(member.value, []).append(f"`{name}.{member.name}`")
    for cls in classes.values():
        if cls.__module__ == "dmxplatform.errors":
            defined.setdefault(cls.default_code, []).append(f"`{cls.__name__}` (default)")
    rows = ["| code | raised with status | defined by |", "|---|---|---|"]
    for code in sorted(defined, key=lambda c: (min(statuses.get(c, {999})), c)):
        # A code passed through a helper or a variable has no direct raise site to read.
        status = ", ".join(str(s) for s in sorted(statuses.get(code, ()))) or "—"
        rows.append(f"| `{code}` | {status} | {', '.join(defined[code])} |")
    return "\n".join(rows) + "\n"


def _check_error_table(markdown: str, src: str) -> None:
    """The page's own table (status | codes | when) names only codes that exist, and every code
    the gateway and the keys' admission define."""
    known = {member.value for dotted in V1_ERROR_ENUMS for member in _import(dotted)}
    known |= {cls.default_code for cls in _error_classes().values()}
    written: set[str] = set()
    for line in markdown.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) > 2 and cells[0][2:].strip()[:1].isdigit():
            # Parentheses hold other fields' values: `rate_limit_exceeded (type `tokens`)`.
            written |= set(re.findall(r"`([a-z_]+)`", re.sub(r"\(.*?\)", "", cells[1])))
    unknown = written - known
    missing = {
        member.value
        for dotted in V1_ERROR_ENUMS[:2]
        for member in _import(dotted)
        if member.value not in written
    }
    if unknown or missing:
        raise PluginError(
            f"{src}: the error table names codes that do not exist: {sorted(unknown)}; "
            f"it leaves out codes the gateway and keys define: {sorted(missing)}"
        )


def management_api() -> str:
    """The operations by tag, then every object's fields, from drf-spectacular's schema."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    by_tag: dict[str, list[str]] = {}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            what = operation.get("summary") or _first_sentence(operation.get("description"))
            answers = ", ".join(sorted(operation.get("responses", {})))
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            body_ref = (body or {}).get("schema", {}).get("$ref", "")
            body_name = body_ref.rpartition("/")[2]
            sent = f"[{body_name}](#{body_name.lower()})" if body_name else ""
            tag = (operation.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append(
                f"| {method.upper()} | `{path}` | {_cell(what)} | {sent} | {answers} |"
            )
    lines = [f"Schema version {schema['info']['version']}: {_cell(schema['info']['title'])}.", ""]
    lines += ["## Operations", ""]
    for tag in sorted(by_tag):
        lines += [f"### `{tag}`", "", "| method | path | what | body | answers |"]
        lines += ["|---|---|---|---|---|", *by_tag[tag], ""]
    lines += ["## Objects", ""]
    for name, component in sorted(schema["components"]["schemas"].items()):
        lines += [f"### {name}", ""]
        if component.get("description"):
            lines += [_cell(component["description"]), ""]
        properties = component.get("properties")
        if not properties:
            values = component.get("enum")
            lines += [f"One of: {', '.join(f'`{v}`' for v in values)}." if values else "", ""]
            continue
        required = set(component.get("required", ()))
        lines += ["| field | type | required | notes |", "|---|---|---|---|"]
        for field, spec in properties.items():
            lines.append(
                f"| `{field}` | {_type(spec)} | {'yes' if field in required else ''} | "
                f"{_notes(spec)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rpartition("/")[2]
        return f"[{name}](#{name.lower()})"
    if "allOf" in spec or "oneOf" in spec or "anyOf" in spec:
        parts = spec.get("allOf") or spec.get("oneOf") or spec.get("anyOf")
        return " or ".join(_type(part) for part in parts)
    kind = spec.get("type", "object")
    if kind == "array":
        return f"array of {_type(spec.get('items', {}))}"
    if spec.get("format"):
        kind = f"{kind} ({spec['format']})"
    return kind


def _notes(spec: dict[str, Any]) -> str:
    notes = []
    if spec.get("readOnly"):
        notes.append("read-only")
    if spec.get("writeOnly"):
        notes.append("write-only")
    if spec.get("nullable"):
        notes.append("nullable")
    if "maxLength" in spec:
        notes.append(f"at most {spec['maxLength']} characters")
    if "minimum" in spec or "maximum" in spec:
        notes.append(f"{spec.get('minimum', '')}..{spec.get('maximum', '')}")
    if spec.get("description"):
        notes.append(spec["description"])
    return _cell("; ".join(notes))


def alerts() -> str:
    """A row per alert rule of deploy/prometheus/rules/alerts.yml."""
    import yaml

    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/alerts.yml").read_text())
    rows = ["| alert | severity | layer | for | summary |", "|---|---|---|---|---|"]
    for group in rules["groups"]:
        for rule in group["rules"]:
            name, labels = rule["alert"], rule.get("labels", {})
            rows.append(
                f"| [{name}](runbooks.md#{name.lower()}) | {labels.get('severity', '')} | "
                f"{labels.get('layer', '')} | {rule.get('for', 'at once')} | "
                f"{_cell(rule['annotations']['summary'])} |"
            )
    return "\n".join(rows) + "\n"


def dashboard() -> str:
    """A row per dashboard row, with its panels' titles in order."""
    import json

    board = json.loads((ROOT / "deploy/grafana/dmx-platform.json").read_text())
    rows: list[tuple[str, list[str]]] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            rows.append((panel["title"], []))
        elif rows:
            rows[-1][1].append(panel["title"])
    lines = ["| row | panels |", "|---|---|"]
    lines += [f"| {title} | {_cell('; '.join(panels))} |" for title, panels in rows]
    return "\n".join(lines) + "\n"


def settings() -> str:
    from tools.docs.settings import settings_markdown

    try:
        return settings_markdown(ROOT)
    except ValueError as error:
        raise PluginError(f"settings page: {error}") from error


def intent_labelling() -> str:
    guide = (ROOT / "tools" / "intent" / "LABELLING.md").read_text(encoding="utf-8")
    return guide.split("\n", 1)[1].lstrip("\n")


GENERATORS: dict[str, Callable[[], str]] = {
    "v1-endpoints": v1_endpoints,
    "v1-errors": v1_errors,
    "management-api": management_api,
    "alerts": alerts,
    "dashboard": dashboard,
    "settings": settings,
    "intent-labelling": intent_labelling,
}
