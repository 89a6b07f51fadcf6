"""An OTLP/HTTP collector for benchmarks that keeps nothing: it answers every export at once, so
that what `bench/run.py --otlp` measures is the gateway's cost of tracing, not a collector's.

    python bench/otlp_sink.py --port 4318      # then DMX_OTLP_ENDPOINT=http://127.0.0.1:4318

It counts the exports and their bytes (GET /stats), to show the spans did leave the gateway.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# An empty ExportTraceServiceResponse: the exporter reads only the status.
EMPTY = b""


class Sink(BaseHTTPRequestHandler):
    exports = 0
    received = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        Sink.exports += 1
        Sink.received += length
        self._answer(b"application/x-protobuf", EMPTY)

    def do_GET(self) -> None:
        stats = {"exports": Sink.exports, "bytes": Sink.received}
        self._answer(b"application/json", json.dumps(stats).encode())

    def _answer(self, content_type: bytes, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type.decode())
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", args.port), Sink).serve_forever()


if __name__ == "__main__":
    main()
