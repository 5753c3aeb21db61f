"""TEST HELPER (not a fake): `RecordingProxy`, a pass-through HTTP proxy on 127.0.0.1 in front of a real
OpenAI-compatible server. It forwards every request unchanged, streams answers back as they come, and
records what the SERVER said each call cost (the `usage` of a whole response, or of a stream's usage
chunk; None when the server sent none). Tests compare that with what our code recorded, so the token
accounting is checked against something independent of the code that produced it."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


@dataclass(frozen=True)
class Exchange:
    path: str
    request: dict[str, Any]
    status: int
    streamed: bool
    usage: dict[str, Any] | None
    """The server's own usage object, None when it sent none (an error, or a stream without usage)."""
    finish_reason: str | None


class RecordingProxy:
    def __init__(self, upstream: str):
        """`upstream`: the real server's base URL, e.g. http://127.0.0.1:PORT/v1."""
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                r = httpx.get(outer._url(self.path), timeout=30)
                self._send(r.status_code, r.content, r.headers.get("content-type", "application/json"))

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw or b"{}")
                try:
                    self._forward(body, raw)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # our client gave up (cancellation): nothing to record
                except httpx.HTTPError as e:  # the server broke the exchange: say so rather than hang the client
                    outer._record(Exchange(self.path, body, 502, False, None, None))
                    self._send(502, json.dumps({"error": {"message": f"proxy: upstream failed: {e!r}"}}).encode(),
                               "application/json")

            def _forward(self, body: dict[str, Any], raw: bytes) -> None:
                headers = {"content-type": "application/json"}
                with httpx.stream("POST", outer._url(self.path), content=raw, headers=headers, timeout=600) as r:
                    if "text/event-stream" not in r.headers.get("content-type", ""):
                        data = r.read()
                        parsed = _json(data)
                        choices = parsed.get("choices") or [{}]
                        # recorded before the client can see the answer, so a test reading right after it finds it
                        outer._record(Exchange(self.path, body, r.status_code, False, parsed.get("usage"),
                                               choices[0].get("finish_reason")))
                        self._send(r.status_code, data, r.headers.get("content-type", "application/json"))
                        return
                    self.send_response(r.status_code)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("connection", "close")
                    self.end_headers()
                    usage, finish, recorded = None, None, False
                    for line in r.iter_lines():
                        if line == "data: [DONE]":
                            outer._record(Exchange(self.path, body, r.status_code, True, usage, finish))
                            recorded = True
                        elif line.startswith("data: "):
                            chunk = _json(line[6:].encode())
                            usage = chunk.get("usage") or usage
                            for c in chunk.get("choices") or []:
                                finish = c.get("finish_reason") or finish
                        self.wfile.write(line.encode() + b"\n")
                        self.wfile.flush()
                    if not recorded:  # a stream without [DONE]: the client sees its end when we close, after this
                        outer._record(Exchange(self.path, body, r.status_code, True, usage, finish))
                    self.close_connection = True

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _url(self, path: str) -> str:
        return self.upstream + path.removeprefix("/v1")

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def since(self, mark: int) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges[mark:])

    def __enter__(self) -> "RecordingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
