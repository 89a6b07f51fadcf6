"""An import-linter contract type: an app's facade is its only door.

Each listed app names the modules other code may import (its door: the facade, its services,
selectors, errors, models, choices); every other module of the app is private to it, whatever
is added later, the way tach's `interfaces` work. Modules in `allowed_importers` (the
composition root, which wires every app's admin, metrics and APIs together) may use any of
them. Registered in pyproject.toml's [tool.importlinter] `contract_types`.
"""

from __future__ import annotations

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class FacadeContract(Contract):
    type_name = "facade"

    apps = fields.ListField(subfield=fields.StringField())
    doors = fields.ListField(subfield=fields.StringField())
    allowed_importers = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        doors = set(self.doors)  # type: ignore[arg-type]
        allowed = tuple(self.allowed_importers or ())  # type: ignore[arg-type]
        illegal = []
        for app in self.apps:  # type: ignore[attr-defined]
            for imported in sorted(graph.find_descendants(app)):
                door = imported.removeprefix(f"{app}.").split(".", 1)[0]
                if door in doors:
                    continue
                for importer in sorted(graph.find_modules_that_directly_import(imported)):
                    if _within(importer, (app, *allowed)):
                        continue
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = ", ".join(str(detail["line_number"]) for detail in details)
                    illegal.append(f"{importer} -> {imported} (l.{lines})")
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal})

    def render_broken_contract(self, check: ContractCheck) -> None:
        doors = ", ".join(self.doors)  # type: ignore[arg-type]
        output.print_error(f"Only an app's door ({doors}) may be imported from outside it:")
        output.new_line()
        for line in check.metadata["illegal"]:
            output.print_error(f"- {line}", bold=False)
        output.new_line()


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)
