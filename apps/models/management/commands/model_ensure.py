"""Create a model and its version unless they exist (scripts/dev.sh seeds its demo models so).

manage.py model_ensure dmx-tiny-embed --kind embed --source .cache/models/dmx-tiny
manage.py model_ensure dmx-tiny --tool-call-parser hermes
"""

from __future__ import annotations

from argparse import ArgumentParser

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.models.choices import ModelKind
from apps.models.services import model_version_ensure


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name", help="the model's public name")
        parser.add_argument("--model-version", default="v1", help="the version's tag")
        parser.add_argument("--kind", choices=ModelKind.values, default=ModelKind.GENERATE)
        parser.add_argument("--source", default="", help="the weights: a directory or a hub id")
        parser.add_argument("--max-context-tokens", type=int, default=2048)
        parser.add_argument(
            "--tool-call-parser",
            default="",
            help="vLLM's tool-call parser for the version, set where it has none",
        )

    def handle(self, *args, **options) -> None:
        try:
            version = model_version_ensure(
                name=options["name"],
                tag=options["model_version"],
                kind=options["kind"],
                source=options["source"],
                max_context_tokens=options["max_context_tokens"],
                tool_call_parser=options["tool_call_parser"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"{version} ({version.model.kind})")
