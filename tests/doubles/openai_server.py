"""TEST DOUBLE: `ScriptedOpenAIServer`, a real HTTP server on 127.0.0.1 that replays a scripted list
of responses for POST /v1/chat/completions (JSON bodies, SSE streams, error statuses with headers,
streams cut mid-way or before their first chunk, error events inside a stream, streams without a
usage chunk) and records every request it received. Not a model: it answers in order. For what a
real server does, see tests/e2e/test_real_llm.py (llama.cpp)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    kind: str  # "json" | "sse" | "error" | "cut"
    status: int = 200
    body: Any = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Simulated model latency before the response starts (time to first byte)."""
    chunk_delay_s: float = 0.0
    """Pause before each streamed chunk: a slow stream a test can interrupt mid-way."""


def json_reply(text: str = "", *, tool_calls: list[dict[str, Any]] | None = None, finish_reason: str = "stop",
               usage: dict[str, Any] | None = None, delay_s: float = 0.0) -> Scripted:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1, "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return Scripted("json", body=body, delay_s=delay_s)


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None, *, usage: dict[str, Any] | None = None,
          no_choices: bool = False) -> dict[str, Any]:
    """One chat.completion.chunk as a dict."""
    c: dict[str, Any] = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1, "model": "scripted",
                         "choices": [] if no_choices else [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}]}
    if usage is not None:
        c["usage"] = usage
    return c


def text_stream(parts: list[str], *, usage: dict[str, Any] | None = None, delay_s: float = 0.0,
                chunk_delay_s: float = 0.0, finish_reason: str = "stop", with_usage: bool = True) -> Scripted:
    """A streamed answer; `with_usage=False` sends no usage chunk (llama.cpp's server does that)."""
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in parts]
    chunks.append(chunk({}, finish_reason))
    if with_usage:
        chunks.append(chunk(no_choices=True, usage=usage or {"prompt_tokens": 10, "completion_tokens": len(parts), "total_tokens": 10 + len(parts)}))
    return Scripted("sse", chunks=chunks, delay_s=delay_s, chunk_delay_s=chunk_delay_s)


def error(status: int, message: str = "error", headers: dict[str, str] | None = None, *,
          code: str | None = None, type: str = "invalid_request_error") -> Scripted:  # noqa: A002
    body = {"error": {"message": message, "type": type, "code": code}}
    return Scripted("error", status=status, body=body, headers=headers or {})


LLAMA_CPP_JSON_SCHEMA_500 = (
    "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': \"Input "
    "should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': \"'text' or 'json_object'\"}}")
"""What llama-cpp-python's server (0.3.x) answers, with HTTP 500, to response_format json_schema."""


def llama_cpp_json_schema_refusal() -> Scripted:
    return error(500, LLAMA_CPP_JSON_SCHEMA_500, type="internal_server_error")


def stream_error_event(parts: list[str], *, code: str | None, message: str, type: str = "server_error") -> Scripted:  # noqa: A002
    """A stream that sends `parts`, then an error event (`data: {"error": {...}}`), then ends."""
    chunks = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in parts]
    chunks.append({"error": {"message": message, "type": type, "code": code}})
    return Scripted("sse", chunks=chunks)


def empty_stream() -> Scripted:
    """200 text/event-stream, then the connection closes before any chunk (llama.cpp on a context overflow)."""
    return Scripted("cut", chunks=[])


def cut_stream(parts: list[str]) -> Scripted:
    """A stream that closes the connection after `parts`, without finish_reason and without [DONE]."""
    return Scripted("cut", chunks=[chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in parts])


def as_stream(item: Scripted) -> Scripted:
    """A scripted JSON answer as the SSE stream a server sends when the request asked for `stream`:
    the text word by word, each tool call in two fragments, the finish reason, then the usage chunk."""
    message = item.body["choices"][0]["message"]
    chunks = [chunk({"role": "assistant", "content": ""})]
    words = (message.get("content") or "").split(" ")
    chunks += [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words) if w or i]
    for index, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": fn["name"], "arguments": ""}}]}))
        chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": fn["arguments"]}}]}))
    chunks.append(chunk({}, item.body["choices"][0]["finish_reason"]))
    chunks.append(chunk(no_choices=True, usage=item.body["usage"]))
    return Scripted("sse", chunks=chunks, chunk_delay_s=item.chunk_delay_s)


class ScriptedOpenAIServer:
    def __init__(self, script: list[Scripted] | None = None):
        self.script: list[Scripted] = list(script or [])
        self.requests: list[dict[str, Any]] = []
        self.received_at: list[float] = []
        """time.monotonic() of each request, parallel to `requests`."""
        self.chunks_sent = 0
        """Streamed chunks written so far, over all requests (a test can act mid-stream)."""
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                try:
                    self._reply()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (timeout, cancellation): expected

            def _reply(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if not self.path.endswith("/chat/completions"):
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with outer._lock:
                    outer.requests.append(json.loads(raw or b"{}"))
                    outer.received_at.append(time.monotonic())
                    item = outer.script.pop(0) if outer.script else error(500, "script exhausted")
                if item.delay_s:
                    time.sleep(item.delay_s)  # simulated model latency (server side, not a test wait)
                if item.kind == "json" and item.status == 200 and outer.requests[-1].get("stream"):
                    item = as_stream(item)  # a real server answers a streamed request with a stream
                if item.kind in ("json", "error"):
                    self._send_json(item.status, item.body, item.headers)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for c in item.chunks:
                    if item.chunk_delay_s:
                        time.sleep(item.chunk_delay_s)  # simulated token rate (server side)
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                    self.wfile.flush()
                    with outer._lock:
                        outer.chunks_sent += 1
                if item.kind == "sse":
                    self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, *items: Scripted) -> None:
        with self._lock:
            self.script.extend(items)

    def __enter__(self) -> "ScriptedOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
