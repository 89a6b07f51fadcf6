"""Retrain the intent model on the shipped training split and write its artifact.

Runs from a repository checkout only: the training code and data are tools/intent, not in the
wheel.
"""

import time
from pathlib import Path

from django.core.management.base import BaseCommand

from apps.gateway.intent.model import ARTIFACT_PATH
from tools.intent.dataset import REALISTIC_FILE, load_examples
from tools.intent.evaluate import evaluate
from tools.intent.train import EPOCHS, SEED, train_from_files


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser) -> None:
        parser.add_argument("--seed", type=int, default=SEED)
        parser.add_argument("--epochs", type=int, default=EPOCHS)
        parser.add_argument("--output", type=Path, default=ARTIFACT_PATH)

    def handle(self, *args, **options) -> None:
        started = time.perf_counter()
        model = train_from_files(seed=options["seed"], epochs=options["epochs"])
        elapsed = time.perf_counter() - started
        output: Path = options["output"]
        model.save(output)
        realistic = evaluate(model, load_examples(REALISTIC_FILE))
        self.stdout.write(
            f"trained on {model.provenance.examples} prompts in {elapsed:.1f}s "
            f"(seed {options['seed']}, {options['epochs']} epochs); "
            f"temperature {model.temperature:.2f}; realistic-set accuracy "
            f"{realistic.overall:.3f}; wrote {output} "
            f"({output.stat().st_size / 1e6:.1f} MB)"
        )
