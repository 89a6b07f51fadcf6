"""The intent classifier's tool chain from the command line; a repository checkout's, with
no Django set-up:

    python -m tools.intent train [--seed N] [--epochs N] [--output PATH]
    python -m tools.intent report [--json]

`train` retrains the model on the shipped training splits (templated and real) and writes its
artifact (the one the gateway loads, apps/gateway/intent/artifacts, unless --output says
otherwise); `report` prints the shipped model's accuracy and confusion, per label and per
language, on the real prompts' dev split and locked test split (data/README.md), on the team's
own held-out sets, and its calibration.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from apps.gateway.intent.model import ARTIFACT_PATH, IntentModel
from tools.intent.calibrate import calibration
from tools.intent.calibrate import render as render_calibration
from tools.intent.dataset import (
    HELDOUT_FILE,
    NATURAL_FILE,
    REAL_DEV_FILE,
    REAL_TEST_FILE,
    REALISTIC_FILE,
    load_examples,
)
from tools.intent.evaluate import evaluate, render
from tools.intent.train import EPOCHS, SEED, data_digest, train_from_files


def out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def train(seed: int, epochs: int, output: Path) -> None:
    started = time.perf_counter()
    model = train_from_files(seed=seed, epochs=epochs)
    elapsed = time.perf_counter() - started
    model.save(output)
    dev = evaluate(model, load_examples(REAL_DEV_FILE))
    out(
        f"trained on {model.provenance.examples} prompts in {elapsed:.1f}s "
        f"(seed {seed}, {epochs} epochs); temperature {model.temperature:.2f}; "
        f"real dev accuracy {dev.overall:.3f}; wrote {output} "
        f"({output.stat().st_size / 1e6:.1f} MB)"
    )


def report(as_json: bool) -> None:
    model = IntentModel.load(ARTIFACT_PATH)
    provenance = model.provenance
    stale = provenance.data_sha256 != data_digest()
    real_dev = evaluate(model, load_examples(REAL_DEV_FILE))
    real_test = evaluate(model, load_examples(REAL_TEST_FILE))
    heldout = evaluate(model, load_examples(HELDOUT_FILE))
    natural = evaluate(model, load_examples(NATURAL_FILE))
    realistic_examples = load_examples(REALISTIC_FILE)
    realistic = evaluate(model, realistic_examples)
    calibrated = calibration(model, realistic_examples)
    if as_json:
        summary = {
            "artifact": {
                "path": str(ARTIFACT_PATH),
                "seed": provenance.seed,
                "epochs": provenance.epochs,
                "trained_on": provenance.examples,
                "stale": stale,
                "temperature": model.temperature,
            },
            "real_dev": real_dev.as_dict(),
            "real_test": real_test.as_dict(),
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
        out(json.dumps(summary, indent=2))
        return
    out(
        f"# Intent model: {ARTIFACT_PATH.name}, seed {provenance.seed}, "
        f"{provenance.epochs} epochs, trained on {provenance.examples} prompts, "
        f"temperature {model.temperature:.2f}\n"
    )
    if stale:
        out(
            "WARNING: the training data changed since this artifact was trained; "
            "run python -m tools.intent train.\n"
        )
    out(render(real_dev, "Real prompts, dev split (tuned on)") + "\n\n")
    out(render(real_test, "Real prompts, locked test split (never tuned on)") + "\n\n")
    out(render(realistic, "Realistic set (pasted material, boilerplate, conversations)") + "\n\n")
    out(render(heldout, "Held-out split (phrasing families never trained on)"))
    out("\n\n" + render(natural, "Natural set (hand-written, never trained on)"))
    out("\n\n" + render_calibration(calibrated, "Calibration on the realistic set") + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.intent", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    training = commands.add_parser("train", help="retrain the model and write its artifact")
    training.add_argument("--seed", type=int, default=SEED)
    training.add_argument("--epochs", type=int, default=EPOCHS)
    training.add_argument("--output", type=Path, default=ARTIFACT_PATH)
    reporting = commands.add_parser("report", help="accuracy, confusion and calibration")
    reporting.add_argument("--json", action="store_true", help="print JSON instead of tables")
    options = parser.parse_args(argv)
    if options.command == "train":
        train(options.seed, options.epochs, options.output)
    else:
        report(options.json)


if __name__ == "__main__":
    main()
