"""A real HTTP judge server on 127.0.0.1 for the GenRM tests (stdlib, one thread per request).

It serves ``/v1/chat/completions`` and SGLang's ``/generate`` and judges deterministically from
the prompt, so tests can predict every score:

* reference template: CORRECT when the response equals the reference (case and spaces
  ignored), else INCORRECT;
* rubric template: ``SCORE: len(response) % 11``;
* pairwise template: the longer response wins, equal lengths tie.

``mode`` switches behaviour: ``scores`` (the above), ``garbage`` (a reply with no verdict),
``hang`` (answers only after ``hang_s`` or teardown), ``flaky`` (``fail_first`` HTTP 503s, then
scores), ``badjson`` (HTTP 200 with a body that is not JSON).
"""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image


def _section(text: str, name: str) -> str:
    m = re.search(rf"\[{re.escape(name)}\]\n(.*?)(?:\n\n\[|\n\n[A-Z][a-z]|\Z)", text, re.DOTALL)
    return m.group(1).strip() if m else ""


def judge_text(prompt: str) -> str:
    if "[Reference answer]" in prompt:
        same = " ".join(_section(prompt, "Reference answer").lower().split()) == " ".join(
            _section(prompt, "Response").lower().split()
        )
        return f"The response {'matches' if same else 'differs from'} the reference.\nVERDICT: {'CORRECT' if same else 'INCORRECT'}"
    if "[Response A]" in prompt:
        a, b = len(_section(prompt, "Response A")), len(_section(prompt, "Response B"))
        return "PREFERENCE: " + ("A" if a > b else "B" if b > a else "TIE")
    if "[Rubric]" in prompt:
        return f"<think>counting characters</think>Looks fine.\n**SCORE: {len(_section(prompt, 'Response')) % 11}**"
    return "I was not asked anything I understand."


class JudgeServer:
    def __init__(self) -> None:
        self.mode = "scores"
        self.hang_s = 10.0
        self.delay_s = 0.0
        self.fail_first = 0
        self.requests = 0
        self.paths: list[str] = []
        self.images: list[tuple[int, int]] = []
        self.prompts: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle stalls

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/v1/models":
                    self._send(200, b'{"object": "list", "data": [{"id": "judge-served", "object": "model"}]}')
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server._lock:
                    server.requests += 1
                    n = server.requests
                    server.paths.append(self.path)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(body, n)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, body: dict[str, Any], n: int) -> None:
                prompt = server._prompt(self.path, body)
                if server.delay_s:
                    time.sleep(server.delay_s)
                mode = server.mode
                if mode == "hang":
                    server.release.wait(server.hang_s)
                if mode == "flaky" and n <= server.fail_first:
                    return self._send(503, b'{"error": "overloaded"}')
                if mode == "badjson":
                    return self._send(200, b"<html>not json</html>", "text/html")
                if mode == "vllm" and self.path != "/generate" and body.get("model") != "judge-served":
                    # vLLM 0.32: a model it does not serve is a 404
                    return self._send(404, json.dumps({"error": {"message": f"The model `{body.get('model')}` "
                                                                 "does not exist.", "code": 404}}).encode())
                text = "I think it is fine, probably." if mode == "garbage" else judge_text(prompt)
                if self.path == "/generate":
                    reply: dict[str, Any] = {"text": text, "meta_info": {"finish_reason": {"type": "stop"}}}
                else:
                    reply = {"id": f"x{n}", "model": body.get("model", ""),
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "stop"}]}
                self._send(200, json.dumps(reply).encode())

            def _send(self, status: int, data: bytes, ctype: str = "application/json") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout) and closed the socket
                    pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default backlog of 5 drops a burst of connects for 1 s
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _prompt(self, path: str, body: dict[str, Any]) -> str:
        images: list[str] = []
        if path == "/generate":
            prompt = body.get("text") or ""
            images = list(body.get("image_data") or [])
        else:
            parts: list[str] = []
            for msg in body.get("messages", []):
                content = msg.get("content")
                if isinstance(content, str):
                    parts.append(content)
                    continue
                for part in content or []:
                    if part.get("type") == "text":
                        parts.append(part["text"])
                    elif part.get("type") == "image_url":
                        images.append(part["image_url"]["url"].split(",", 1)[1])
            prompt = "\n".join(parts)
        with self._lock:
            self.prompts.append(prompt)
            for b64 in images:
                self.images.append(Image.open(io.BytesIO(base64.b64decode(b64))).size)
        return prompt

    def __enter__(self) -> JudgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
