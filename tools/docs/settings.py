"""Every environment variable the platform reads, from the code that reads it, with its meaning
from `.env.example`: the settings page of the documentation site (docs/hooks/reference.py) and
the test that keeps it whole (tests/tools/test_docs_settings.py).

The code is the source of truth for which variables exist; `.env.example` (which STYLE.md asks
to list every variable with a one-line meaning) for what each one means.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# Where variables are read: the settings modules (through dmxplatform/env.py), the server
# launcher and the metrics exposition (before or outside Django's settings), the inference
# worker (no Django: argparse defaults). pytest's own settings (test.py) read only what
# pytest-xdist sets.
SOURCES = ("dmxplatform/settings", "config", "inference")
SKIPPED = ("dmxplatform/settings/test.py",)
# dmxplatform/env.py's readers, the settings' secret reader and the worker's.
READERS = frozenset(
    {
        "env_str",
        "env_optional",
        "env_int",
        "env_float",
        "env_bool",
        "env_list",
        "secret_from_env",
        "_env",
    }
)
# Shell scripts read the development set-up's own variables (scripts/dev.sh).
SCRIPTS = "scripts"

# Variables other software defines, which the platform reads but does not own: documented here,
# not in .env.example, where an empty line would set them (an empty CUDA_VISIBLE_DEVICES hides
# every GPU).
FOREIGN = {
    "CUDA_VISIBLE_DEVICES": (
        "NVIDIA's: the GPUs the inference worker may use; unset: all. Its engine-argument "
        "recommendation chooses among them."
    ),
}

_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ENTRY = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_SECTION = re.compile(r"^# --- (.+) ---$")


@dataclass
class Variable:
    """One documented variable of .env.example."""

    name: str
    default: str
    meaning: str
    section: str
    read_by: list[str] = field(default_factory=list)


def _reads_in(tree: ast.AST) -> set[str]:
    """Names a module reads: reader calls, os.environ.get / os.getenv, os.environ[...] loads."""
    names: set[str] = set()
    for node in ast.walk(tree):
        argument: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            named = isinstance(func, ast.Name) and func.id in READERS
            if named or ast.unparse(func) in {"os.environ.get", "os.getenv"}:
                argument = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and ast.unparse(node.value) == "os.environ"
        ):
            argument = node.slice
        if (
            isinstance(argument, ast.Constant)
            and isinstance(argument.value, str)
            and _NAME.match(argument.value)
        ):
            names.add(argument.value)
    return names


def settings_read(root: Path = ROOT) -> dict[str, list[str]]:
    """Map every variable the platform's Python code reads to the files that read it."""
    read: dict[str, list[str]] = {}
    for source in SOURCES:
        for path in sorted((root / source).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in SKIPPED or "/migrations/" in relative:
                continue
            for name in sorted(_reads_in(ast.parse(path.read_text(), relative))):
                read.setdefault(name, []).append(relative)
    return read


def scripts_read(root: Path = ROOT) -> dict[str, list[str]]:
    """Map the variables the shell scripts expand (${NAME...} or $NAME) to the scripts."""
    read: dict[str, list[str]] = {}
    pattern = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)")
    for path in sorted((root / SCRIPTS).glob("*.sh")):
        for name in sorted(set(pattern.findall(path.read_text()))):
            read.setdefault(name, []).append(path.relative_to(root).as_posix())
    return read


def documented(root: Path = ROOT) -> dict[str, Variable]:
    """Parse .env.example: each `NAME=default` line takes the comment block above it (shared by
    the lines that follow one comment) and the `# --- Section ---` it stands in."""
    variables: dict[str, Variable] = {}
    section, comment, block_open = "", [], False
    for line in (root / ".env.example").read_text().splitlines():
        line = line.strip()
        if heading := _SECTION.match(line):
            section, comment, block_open = heading.group(1), [], False
        elif line.startswith("#"):
            if block_open:
                comment, block_open = [], False
            comment.append(line.lstrip("#").strip())
        elif entry := _ENTRY.match(line):
            block_open = True
            name, default = entry.groups()
            variables[name] = Variable(name, default, " ".join(comment), section)
        else:
            comment, block_open = [], False
    return variables


def settings_table(root: Path = ROOT) -> tuple[list[Variable], list[str]]:
    """Every variable read, documented, in .env.example's order, with the files reading it;
    and the problems: a variable read but not documented, or documented but read nowhere."""
    python, scripts = settings_read(root), scripts_read(root)
    variables = documented(root)
    problems = [
        f"{name} is read by {', '.join(files)} but not documented in .env.example"
        for name, files in python.items()
        if name not in FOREIGN and (name not in variables or not variables[name].meaning)
    ]
    for name, variable in variables.items():
        variable.read_by = python.get(name, []) + scripts.get(name, [])
        if not variable.read_by:
            problems.append(f"{name} is documented in .env.example but nothing reads it")
    foreign = [
        Variable(name, "", meaning, "Other software's variables", python.get(name, []))
        for name, meaning in FOREIGN.items()
    ]
    return [*variables.values(), *foreign], problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_markdown(root: Path = ROOT) -> str:
    """The settings page's tables, one per section of .env.example; raises on a problem."""
    variables, problems = settings_table(root)
    if problems:
        raise ValueError("; ".join(problems))
    lines: list[str] = []
    section = None
    for variable in variables:
        if variable.section != section:
            section = variable.section
            lines += ["", f"### {section}", "", "| variable | default | meaning | read by |"]
            lines.append("|---|---|---|---|")
        default = f"`{_cell(variable.default)}`" if variable.default else "*(empty)*"
        readers = ", ".join(f"`{path}`" for path in variable.read_by)
        lines.append(f"| `{variable.name}` | {default} | {_cell(variable.meaning)} | {readers} |")
    return "\n".join(lines).strip() + "\n"
