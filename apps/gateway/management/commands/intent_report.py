"""Report the shipped intent model: accuracy and confusion on the held-out sets, and calibration.

Runs from a repository checkout only: the evaluation code and data are tools/intent, not in the
wheel.
"""

import json

from django.core.management.base import BaseCommand

from apps.gateway.intent.model import ARTIFACT_PATH, IntentModel
from tools.intent.calibrate import calibration
from tools.intent.calibrate import render as render_calibration
from tools.intent.dataset import HELDOUT_FILE, NATURAL_FILE, REALISTIC_FILE, load_examples
from tools.intent.evaluate import evaluate, render
from tools.intent.train import data_digest


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")

    def handle(self, *args, **options) -> None:
        model = IntentModel.load(ARTIFACT_PATH)
        provenance = model.provenance
        stale = provenance.data_sha256 != data_digest()
        heldout = evaluate(model, load_examples(HELDOUT_FILE))
        natural = evaluate(model, load_examples(NATURAL_FILE))
        realistic_examples = load_examples(REALISTIC_FILE)
        realistic = evaluate(model, realistic_examples)
        calibrated = calibration(model, realistic_examples)
        if options["json"]:
            report = {
                "artifact": {
                    "path": str(ARTIFACT_PATH),
                    "seed": provenance.seed,
                    "epochs": provenance.epochs,
                    "trained_on": provenance.examples,
                    "stale": stale,
                    "temperature": model.temperature,
                },
                "realistic": realistic.as_dict(),
                "calibration": {
                    "set": REALISTIC_FILE,
                    "ece": round(calibrated.ece, 4),
                    "bins": [
                        {"low": low, "high": high, "accuracy": round(accuracy, 4), "n": n}
                        for low, high, accuracy, n in calibrated.bins
                    ],
                },
                "heldout": heldout.as_dict(),
                "natural": natural.as_dict(),
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        self.stdout.write(
            f"# Intent model: {ARTIFACT_PATH.name}, seed {provenance.seed}, "
            f"{provenance.epochs} epochs, trained on {provenance.examples} prompts, "
            f"temperature {model.temperature:.2f}\n"
        )
        if stale:
            self.stdout.write(
                "WARNING: the training data changed since this artifact was trained; "
                "run manage.py intent_train.\n"
            )
        self.stdout.write(
            render(realistic, "Realistic set (pasted material, boilerplate, conversations)")
            + "\n\n"
        )
        self.stdout.write(render(heldout, "Held-out split (phrasing families never trained on)"))
        self.stdout.write("\n\n" + render(natural, "Natural set (hand-written, never trained on)"))
        self.stdout.write(
            "\n\n" + render_calibration(calibrated, "Calibration on the realistic set") + "\n"
        )
