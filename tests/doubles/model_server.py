"""TEST DOUBLE: a stand-in for an OpenAI-compatible model server, the process runner's counterpart of the
busybox images the docker tests import (tests/conftest.py): stdlib only, so it runs in the sandbox as
`python3 -m tests.doubles.model_server --model acme/m` or copied anywhere as a script. It serves
`GET /health`, `GET /v1/models` (the name it is given, as vLLM lists `--served-model-name`, else `--model`)
and `POST /v1/completions` with a short, fixed, sensible continuation of the fleet's prompts (greedy
answers a reference can match). Not a model: the answers are canned."""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWERS = {
    "capital of France": " Paris.",
    "hydrogen and": " oxygen: two atoms of hydrogen, one of oxygen.",
}
DEFAULT_ANSWER = " five, six, seven, eight."


def serve(model: str, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._reply(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._reply(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            if self.path != "/v1/completions":
                self._reply(404, {"error": {"message": "not found"}})
            elif body.get("model") != model:
                self._reply(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            else:
                prompt = str(body.get("prompt", ""))
                text = next((a for key, a in ANSWERS.items() if key in prompt), DEFAULT_ANSWER)
                self._reply(200, {"object": "text_completion", "model": model,
                                  "choices": [{"index": 0, "text": text, "finish_reason": "length"}]})

        def log_message(self, fmt: str, *args: object) -> None:
            print(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}", flush=True)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"serving {model} on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args = parser.parse_args()
    serve(args.served_model_name or args.model, args.port)


if __name__ == "__main__":
    main()
