"""Classify one prompt's intent; print {"label": ..., "confidence": ...} as JSON."""

import json

from django.core.management.base import BaseCommand

from apps.gateway.intent import classify


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser) -> None:
        parser.add_argument("text", help="the prompt to classify")

    def handle(self, *args, **options) -> None:
        prediction = classify(options["text"])
        self.stdout.write(
            json.dumps({"label": str(prediction.label), "confidence": prediction.confidence})
        )
