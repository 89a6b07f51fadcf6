"""The import graph's health, counted: cycles and imports against the layers' order.

    .venv/bin/python -m tools.lint.graph [--root DIR]

Builds the graph with grimp (import-linter's own engine) over the packages found under DIR (a
checkout; this one by default, another revision's with `git worktree add`) and prints:
- module cycles: groups of modules that import each other round (strongly connected
  components of more than one module), and how many modules they hold;
- component cycles: the same between the components (each app, `dmxplatform`, `config`,
  `inference`, `tools`), each squashed to one node;
- upward imports: direct imports from a component to one above it in the layers' order
  (pyproject.toml's `layers` contract; hardware and models count as one layer).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grimp

PACKAGES = ("config", "tools", "apps", "dmxplatform", "inference")
# Top first, as in pyproject.toml's layers contract; one tuple per layer.
LAYERS = (
    ("config", "tools"),
    ("apps.portal", "apps.console"),
    ("apps.gateway",),
    ("apps.routing",),
    ("apps.hardware", "apps.models"),
    ("apps.keys",),
    ("dmxplatform",),
)


def components(graph: grimp.ImportGraph) -> dict[str, str]:
    """Each module's component: its app (apps.<name>) or its top-level package."""
    owner = {}
    for module in graph.modules:
        parts = module.split(".")
        owner[module] = ".".join(parts[:2]) if parts[0] == "apps" and len(parts) > 1 else parts[0]
    return owner


def strongly_connected(nodes, edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def layer_of(component: str) -> int | None:
    for depth, layer in enumerate(LAYERS):
        if component in layer:
            return depth
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    os.chdir(root)
    packages = [name for name in PACKAGES if (root / name / "__init__.py").exists()]
    graph = grimp.build_graph(*packages, cache_dir=None)
    owner = components(graph)

    edges: dict[str, set[str]] = {}
    between: dict[str, set[str]] = {}
    upward = []
    for importer in graph.modules:
        imported = graph.find_modules_directly_imported_by(importer)
        edges[importer] = set(imported)
        for target in imported:
            source, sink = owner[importer], owner[target]
            if source == sink:
                continue
            between.setdefault(source, set()).add(sink)
            above, below = layer_of(sink), layer_of(source)
            if above is not None and below is not None and above < below:
                upward.append(f"{importer} -> {target}")

    module_cycles = strongly_connected(sorted(graph.modules), edges)
    component_cycles = strongly_connected(sorted(between), between)
    print(f"packages: {', '.join(packages)}; {len(graph.modules)} modules")
    print(
        f"module cycles: {len(module_cycles)}, holding "
        f"{sum(len(group) for group in module_cycles)} modules"
    )
    for group in module_cycles:
        print(f"  {' <-> '.join(group)}")
    print(f"component cycles: {len(component_cycles)}")
    for group in component_cycles:
        print(f"  {' <-> '.join(group)}")
    print(f"upward imports: {len(upward)}")
    for line in sorted(upward):
        print(f"  {line}")


if __name__ == "__main__":
    main()
