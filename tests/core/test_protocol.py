"""EngineClient maps transport and HTTP failures to typed errors (real servers on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from relax_gym.protocol import (
    EngineClient,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerateRequest,
    SamplingParams,
)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b"")
        else:
            self._send(404, b"not found")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.server.seen.append((self.path, body, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        if self.path == "/generate":
            mode = body.get("rid")
            if mode == "slow":
                time.sleep(1.0)
            if mode == "error":
                return self._send(500, b"kaboom")
            if mode == "garbage":
                return self._send(200, b'{"meta_info": {"finish_reason": {"type": "weird"}}}')
            n = body["sampling_params"]["max_new_tokens"]
            reply = {
                "text": "ok",
                "output_ids": list(range(n)),
                "meta_info": {
                    "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": n,
                    "output_token_logprobs": [[-0.5, i, None] for i in range(n)],
                    "weight_version": "7",
                },
            }
            return self._send(200, json.dumps(reply).encode())
        if self.path == "/update_weights_from_disk":
            return self._send(200, json.dumps({"success": False, "message": "bad path"}).encode())
        self._send(200, b"{}")

    def _send(self, code: int, data: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out first, as intended
            pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


TRANSPORTS = ["httpx", pytest.param("aiohttp", marks=pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("aiohttp") is None, reason="aiohttp not installed"))]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_generate_round_trip_and_auth_header(server, transport) -> None:
    async with EngineClient(_url(server), api_key="s3cret", transport=transport) as client:
        assert client.transport == transport
        assert await client.health()
        resp = await client.generate(
            GenerateRequest(input_ids=[1, 2, 3], sampling_params=SamplingParams(max_new_tokens=4), return_logprob=True, rid="r1")
        )
    assert resp.token_ids() == [0, 1, 2, 3] and resp.token_logprobs() == [-0.5] * 4
    assert resp.finish_type == "length" and resp.meta_info.weight_version == "7"
    path, body, auth = server.seen[-1]
    assert path == "/generate" and body["input_ids"] == [1, 2, 3] and auth == "Bearer s3cret"
    assert body["sampling_params"]["max_new_tokens"] == 4 and body["return_logprob"] is True


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_typed_failures(server, transport) -> None:
    async with EngineClient(_url(server), timeout_s=0.3, transport=transport) as client:
        with pytest.raises(EngineError, match="HTTP 500"):
            await client.generate(GenerateRequest(input_ids=[1], rid="error"))
        with pytest.raises(EngineError, match="unparseable reply"):
            await client.generate(GenerateRequest(input_ids=[1], rid="garbage"))
        with pytest.raises(EngineTimeout):
            await client.generate(GenerateRequest(input_ids=[1], rid="slow"))
        with pytest.raises(EngineError, match="weight update failed: bad path"):
            from relax_gym.protocol import UpdateWeightsFromDiskRequest

            await client.update_weights_from_disk(UpdateWeightsFromDiskRequest(model_path="/nope"))
        await client.abort()
        assert server.seen[-1][:2] == ("/abort_request", {"rid": "", "abort_all": True})


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unreachable_engine(transport) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with EngineClient(f"http://127.0.0.1:{port}", connect_timeout_s=1.0, transport=transport) as client:
        assert await client.health() is False
        with pytest.raises(EngineUnavailable, match="unreachable"):
            await client.generate(GenerateRequest(input_ids=[1]))


def test_request_validation() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        GenerateRequest(text="a", input_ids=[1])
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="transport must be"):
        EngineClient("http://127.0.0.1:1", transport="grpc")  # type: ignore[arg-type]
