"""Create the demo operator, tenant, key, models, routing table and node token; print new
secrets as JSON."""

import json
from dataclasses import asdict

from django.core.management.base import BaseCommand

from config.demo import demo_setup


class Command(BaseCommand):
    help = " ".join(__doc__.split())

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model-name", default="dmx-tiny")
        parser.add_argument("--model-version", default="v1")
        parser.add_argument("--source", default="")
        parser.add_argument("--max-context-tokens", type=int, default=2048)
        parser.add_argument(
            "--code-model-name",
            default="",
            help="a second model of the same weights that the alias `auto` sends code to",
        )
        parser.add_argument(
            "--embed-model-name", default="", help="an embedding model of the same weights"
        )

    def handle(self, *args, **options) -> None:
        credentials = demo_setup(
            model_name=options["model_name"],
            version=options["model_version"],
            source=options["source"],
            max_context_tokens=options["max_context_tokens"],
            code_model_name=options["code_model_name"],
            embed_model_name=options["embed_model_name"],
        )
        self.stdout.write(json.dumps(asdict(credentials)))
