"""A fast OpenAI-compatible upstream for benchmarks: it answers like vLLM, with no model behind it.

So that what a benchmark measures is the gateway's own cost, this server does as little as an
HTTP server can: one asyncio protocol per connection, httptools to parse, keep-alive, canned
JSON. It speaks what the gateway needs from a vLLM node: chat and text completions, streamed
(with `include_usage` and vLLM's `continuous_usage_stats`) or not, embeddings, `/health`,
`/v1/models`, and a `/metrics` page with vLLM's load gauges, so an inference worker can attach
to it.

    python bench/upstream.py --port 9100 --tokens 16 --ttft-ms 0 --tpot-ms 0 --processes 1

Every completion has `--tokens` tokens (or max_tokens, if smaller), the first after
`--ttft-ms`, the rest `--tpot-ms` apart. `--processes` > 1 shares the port (SO_REUSEPORT).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time

import httptools
import orjson

WORD = "tok "  # every generated token's text
PROMPT_TOKENS = 12  # reported as the prompt's size; the gateway counts its own estimate


class Settings:
    tokens = 16
    ttft = 0.0
    tpot = 0.0
    # Served model names and their context lengths, as /v1/models lists them; responses carry
    # the first name (the gateway reads none of them).
    models = {"bench-model": 2048}
    model = "bench-model"


def _chunk(kind: str, ident: str, created: int, text: str | None, finish, usage) -> bytes:
    if kind == "chat":
        delta = {"content": text} if text is not None else {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    body = {
        "id": ident,
        "object": obj,
        "created": created,
        "model": Settings.model,
        "choices": [choice],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _usage(completion: int) -> dict:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "total_tokens": PROMPT_TOKENS + completion,
        "completion_tokens": completion,
    }


def _completion(kind: str, count: int) -> bytes:
    ident = "cmpl-" + os.urandom(8).hex()
    text = WORD * count
    if kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": ident,
            "object": obj,
            "created": int(time.time()),
            "model": Settings.model,
            "choices": [choice],
            "usage": _usage(count),
        }
    )


EMBEDDING_SIZE = 384  # a small sentence-embedding model's


def _embedding(body: bytes) -> bytes:
    """vLLM's answer to an embeddings request: one vector of EMBEDDING_SIZE floats."""
    vector = [round(((i * 7919) % 1000) / 1000 - 0.5, 6) for i in range(EMBEDDING_SIZE)]
    tokens = max(1, len(body) // 4)
    return orjson.dumps(
        {
            "id": "embd-" + os.urandom(8).hex(),
            "object": "list",
            "created": int(time.time()),
            "model": Settings.model,
            "data": [{"index": 0, "object": "embedding", "embedding": vector}],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
    )


METRICS = (
    'vllm:num_requests_running{engine="0",model_name="bench-model"} %d\n'
    'vllm:num_requests_waiting{engine="0",model_name="bench-model"} 0.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="bench-model"} 0.0\n'
)


class Connection(asyncio.Protocol):
    running = 0

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.tasks: set[asyncio.Task] = set()  # held, so none is collected mid-response

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, b"".join(self.body)
        self.body = []
        if url.startswith(b"/v1/chat/completions"):
            self.spawn(self.complete("chat", body))
        elif url.startswith(b"/v1/completions"):
            self.spawn(self.complete("text", body))
        elif url.startswith(b"/v1/embeddings"):
            self.respond(b"application/json", _embedding(body))
        elif url.startswith(b"/health"):
            self.respond(b"text/plain", b"")
        elif url.startswith(b"/metrics"):
            self.respond(b"text/plain", (METRICS % Connection.running).encode())
        elif url.startswith(b"/v1/models"):
            cards = [
                {"id": name, "object": "model", "max_model_len": context}
                for name, context in Settings.models.items()
            ]
            self.respond(b"application/json", orjson.dumps({"object": "list", "data": cards}))
        else:
            self.respond(
                b"application/json", b'{"error": {"message": "not found"}}', b"404 Not Found"
            )

    def spawn(self, work) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def respond(self, content_type: bytes, body: bytes, status: bytes = b"200 OK") -> None:
        self.transport.write(
            b"HTTP/1.1 "
            + status
            + b"\r\ncontent-type: "
            + content_type
            + b"\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )

    async def complete(self, kind: str, body: bytes) -> None:
        request = orjson.loads(body)
        count = min(request.get("max_tokens") or Settings.tokens, Settings.tokens)
        Connection.running += 1
        try:
            if Settings.ttft:
                await asyncio.sleep(Settings.ttft)
            if not request.get("stream"):
                if Settings.tpot and count > 1:
                    await asyncio.sleep(Settings.tpot * (count - 1))
                self.respond(b"application/json", _completion(kind, count))
                return
            await self.stream(kind, count, request.get("stream_options") or {})
        finally:
            Connection.running -= 1

    async def stream(self, kind: str, count: int, options: dict) -> None:
        write = self.transport.write
        write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        continuous = options.get("continuous_usage_stats")
        ident, created = "cmpl-" + os.urandom(8).hex(), int(time.time())

        def send(payload: bytes) -> None:
            write(b"%x\r\n%s\r\n" % (len(payload), payload))

        if kind == "chat":
            send(_chunk(kind, ident, created, None, None, _usage(0) if continuous else None))
        for i in range(1, count + 1):
            if Settings.tpot and i > 1:
                await asyncio.sleep(Settings.tpot)
            finish = "length" if i == count else None
            send(_chunk(kind, ident, created, WORD, finish, _usage(i) if continuous else None))
        if options.get("include_usage"):
            closing = {
                "id": ident,
                "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                "created": created,
                "model": Settings.model,
                "choices": [],
                "usage": _usage(count),
            }
            send(b"data: " + orjson.dumps(closing) + b"\n\n")
        send(b"data: [DONE]\n\n")
        write(b"0\r\n\r\n")


def serve(port: int) -> None:
    import uvloop

    async def main() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.get_running_loop().create_server(Connection, sock=sock, backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--tpot-ms", type=float, default=0.0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument(
        "--models",
        default="bench-model:2048",
        help="served models as NAME:CONTEXT,... (what /v1/models lists)",
    )
    args = parser.parse_args()
    Settings.models = {
        name: int(context)
        for name, _, context in (item.partition(":") for item in args.models.split(","))
    }
    Settings.model = next(iter(Settings.models))
    Settings.tokens, Settings.ttft, Settings.tpot = (
        args.tokens,
        args.ttft_ms / 1000,
        args.tpot_ms / 1000,
    )
    for _ in range(args.processes - 1):
        if os.fork() == 0:
            break
    serve(args.port)


if __name__ == "__main__":
    main()
