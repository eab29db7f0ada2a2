"""Attacks on the embedded engine's input handling: each must get a 4xx at once, with memory bounded,
while the engine keeps serving everyone else.

One real server (tiny-BPE Qwen3, context 8192, an API key on the control routes) runs for the
module with small limits so the attacks stay cheap: 2 MiB bodies (the weight upload keeps its
1 GiB), 4 MiB of bodies held at once, 6 s to send a body, 2 images per request.
Media attacks (decompression bombs, long clips, device files) run against the loaders directly.
"""

from __future__ import annotations

import io
import os
import select
import socket
import struct
import threading
import time
import wave
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from PIL import Image
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.models import build_tiny_model

from relax_gym import MediaError, media

MiB = 1 << 20
KEY = "limits-test-key"
LIMIT_ARGS = [
    "--max-request-mb", "2",
    "--max-buffered-mb", "4",
    "--body-timeout", "6",  # long enough for a loaded 2-core box to read 3 MiB of held bodies
    "--max-images", "2",
]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# the server and raw-socket helpers
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEngineProcess]:
    model = build_tiny_model("qwen3", tmp_path_factory.mktemp("m") / "bpe", tokenizer="tiny-bpe", seed=0)
    proc = EmbeddedEngineProcess(model, threads=1, api_key=KEY, extra_args=LIMIT_ARGS)
    proc.start()
    yield proc
    proc.stop()


def rss(engine: EmbeddedEngineProcess) -> int:
    assert engine.proc is not None
    return int(psutil.Process(engine.proc.pid).memory_info().rss)


def good_request(engine: EmbeddedEngineProcess) -> dict[str, Any]:
    """A small greedy request; the engine must still answer it correctly after any attack."""
    body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    reply = httpx.post(f"{engine.url}/generate", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    out: dict[str, Any] = reply.json()
    assert len(out["output_ids"]) == 4
    return out


def status_of(reply: bytes) -> int | None:
    if not reply.startswith(b"HTTP/1.1 "):
        return None
    return int(reply[9:12])


def stream_chunked(
    port: int, total: int, *, chunk: int = MiB, path: str = "/generate", finish: bool = True, headers: str = ""
) -> tuple[int | None, bytes, int]:
    """POST a chunked JSON body of up to ``total`` bytes, stopping as soon as the server answers.

    Returns (status, reply bytes, body bytes sent). The body is a valid JSON text prompt when
    ``finish`` and it is sent whole.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    reply, sent = b"", 0
    try:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        head = b'{"text": "'
        while sent < total:
            data = (head if sent == 0 else b"") + b"a" * chunk
            sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
            sent += len(data)
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered (or closed) before the body ended
        else:
            if finish:
                sock.sendall(b'4\r\n"}  \r\n0\r\n\r\n')
    except (BrokenPipeError, ConnectionResetError):
        pass
    reply = _read_reply(sock)
    sock.close()
    return status_of(reply), reply, sent


def _read_reply(sock: socket.socket, timeout_s: float = 20.0) -> bytes:
    sock.settimeout(timeout_s)
    reply = b""
    try:
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    except (ConnectionResetError, TimeoutError):
        pass
    return reply


def _first_reply(socks: list[socket.socket], timeout_s: float) -> bytes | None:
    """The first complete reply any of ``socks`` gets within ``timeout_s`` (None if none does)."""
    import selectors

    buffers = {sock: b"" for sock in socks}
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                buffers[sock] += data
                reply = buffers[sock]
                if not data or (b"\r\n\r\n" in reply and reply.rstrip().endswith(b"}")):
                    sel.unregister(sock)
                    if reply:
                        return reply
            if not sel.get_map():
                return None
    return None


# ------------------------------------------------------------------------------------------------
# request bodies
# ------------------------------------------------------------------------------------------------
def test_chunked_body_is_capped_as_it_streams(engine: EmbeddedEngineProcess) -> None:
    """A 64 MiB chunked body (no Content-Length) gets 413 after ~2 MiB; memory stays flat."""
    good_request(engine)
    before = rss(engine)
    start = time.monotonic()
    status, reply, sent = stream_chunked(engine.port or 0, 64 * MiB)
    assert status == 413, reply[:300]
    assert b"exceeds the limit" in reply
    assert sent < 32 * MiB and time.monotonic() - start < 10
    assert rss(engine) - before < 32 * MiB
    good_request(engine)


def test_client_sending_the_whole_body_first_still_reads_413(engine: EmbeddedEngineProcess) -> None:
    """httpx sends a streamed body to the end before reading: the rest is discarded, not a reset."""

    def body() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(16):
            yield b"a" * MiB
        yield b'"}'

    before = rss(engine)
    reply = httpx.post(f"{engine.url}/generate", content=body(), timeout=30)
    assert reply.status_code == 413 and reply.json()["error"]["type"] == "PayloadTooLarge"
    assert rss(engine) - before < 32 * MiB
    good_request(engine)


def test_declared_content_length_is_refused_before_reading(engine: EmbeddedEngineProcess) -> None:
    sock = socket.create_connection(("127.0.0.1", engine.port or 0), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n{")
    reply = _read_reply(sock, 5.0)
    sock.close()
    assert status_of(reply) == 413, reply[:300]


def test_many_oversize_bodies_at_once_keep_memory_bounded(engine: EmbeddedEngineProcess) -> None:
    """12 clients streaming 32 MiB each: every one refused (413, or 503 once 4 MiB are held)."""
    before = rss(engine)
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: stream_chunked(engine.port or 0, 32 * MiB), range(12)))
    assert all(status in (413, 503) for status, _, _ in results), [r[1][:120] for r in results]
    assert rss(engine) - before < 48 * MiB
    info = httpx.get(f"{engine.url}/get_server_info").json()["request_bodies"]
    assert info["buffered_bytes"] == 0 and info["too_large"] >= 1
    good_request(engine)


def test_weight_upload_limit_is_only_for_key_holders(engine: EmbeddedEngineProcess) -> None:
    """The 1 GiB weight route: without the key nothing is buffered (401); with it, the cap holds."""
    before = rss(engine)
    status, reply, sent = stream_chunked(engine.port or 0, 48 * MiB, path="/update_weights_from_tensor")
    assert status == 401, reply[:300]
    assert rss(engine) - before < 32 * MiB
    auth = f"Authorization: Bearer {KEY}\r\n"
    status, reply, _ = stream_chunked(engine.port or 0, 8 * MiB, path="/abort_request", headers=auth)
    assert status == 413, reply[:300]  # other control routes keep the 2 MiB cap
    good_request(engine)


def test_held_bodies_share_one_budget(engine: EmbeddedEngineProcess) -> None:
    """Bodies under the per-request cap still cannot together hold more than 4 MiB: 503 at once."""
    socks = []
    try:
        for _ in range(3):  # 3 x 1.5 MiB > 4 MiB: the third is refused while the others wait
            sock = socket.create_connection(("127.0.0.1", engine.port or 0), timeout=10)
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            data = b"a" * (3 * MiB // 2)
            sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
            socks.append(sock)
        # whichever body crosses the budget is refused (the server reads the three concurrently,
        # so on a loaded box it may be the second rather than the third), before any body timeout
        first = _first_reply(socks, 10.0)
        assert first is not None and status_of(first) == 503, (first or b"")[:300]
        good_request(engine)  # small requests are never charged to the budget
    finally:
        for sock in socks:
            sock.close()


def test_trickled_body_times_out(engine: EmbeddedEngineProcess) -> None:
    sock = socket.create_connection(("127.0.0.1", engine.port or 0), timeout=10)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"text\": ")
    start = time.monotonic()
    reply = _read_reply(sock, 15.0)
    sock.close()
    assert status_of(reply) == 408, reply[:300]
    assert time.monotonic() - start < 12


def test_deeply_nested_json_is_a_400(engine: EmbeddedEngineProcess) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for route in ("/generate", "/v1/chat/completions", "/abort_request"):
        reply = httpx.post(f"{engine.url}{route}", content=b"[" * 200_000, headers=auth, timeout=10)
        assert reply.status_code == 400 and "nested too deeply" in reply.json()["error"]["message"], route


def test_non_json_numbers_are_a_400(engine: EmbeddedEngineProcess) -> None:
    body = b'{"input_ids": [1, 2], "sampling_params": {"temperature": Infinity, "max_new_tokens": 2}}'
    reply = httpx.post(f"{engine.url}/generate", content=body, timeout=10)
    assert reply.status_code == 400 and "Infinity is not a JSON number" in reply.json()["error"]["message"]


# ------------------------------------------------------------------------------------------------
# prompts: characters before tokenising, tokens against the context
# ------------------------------------------------------------------------------------------------
def test_long_text_is_refused_before_tokenising(engine: EmbeddedEngineProcess) -> None:
    """1.9 M characters (under the body cap) would take seconds and ~200 MB to tokenise."""
    before = rss(engine)
    start = time.monotonic()
    reply = httpx.post(f"{engine.url}/generate", json={"text": "ab " * 630_000}, timeout=30)
    assert reply.status_code == 400
    assert "characters" in reply.json()["error"]["message"]
    assert time.monotonic() - start < 2 and rss(engine) - before < 48 * MiB


def test_text_over_the_context_stops_counting_early(engine: EmbeddedEngineProcess) -> None:
    """Under the character bound but far over 8192 tokens: refused after counting a part."""
    start = time.monotonic()
    reply = httpx.post(f"{engine.url}/generate", json={"text": "hello world " * 20_000}, timeout=30)
    assert reply.status_code == 400
    assert "counted over its first" in reply.json()["error"]["message"]
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"input_ids": [1] * 9000}, "longer than the model's context length (8192 tokens)"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10**9}}, "You requested a total of"),
        ({"input_ids": [1] * 8000, "sampling_params": {"max_new_tokens": 500}}, "8000 tokens from the input"),
        ({"input_ids": [1, 2, 2**40]}, "outside the vocabulary"),
        ({"input_ids": [1, 2], "sampling_params": {"stop": ["x"] * 1000}}, "at most 64 strings"),
        ({"input_ids": [1, 2], "sampling_params": {"stop": ["x" * 100_000]}}, "at most 512 characters"),
        ({"input_ids": [1, 2], "sampling_params": {"stop_token_ids": [1] * 5000}}, "at most 1024 ids"),
        ({"input_ids": [1, 2], "audio_data": ["AAAA" * 100_000]}, "the served model takes no audio"),
        ({"input_ids": [1, 2], "video_data": ["AAAA"]}, "the served model takes no video"),
        ({"input_ids": [1, 2], "image_data": ["AAAA"] * 3}, "3 images in one request; at most 2"),
    ],
)
def test_generate_limits_answer_400_at_once(engine: EmbeddedEngineProcess, body: dict[str, Any], fragment: str) -> None:
    reply = httpx.post(f"{engine.url}/generate", json=body, timeout=10)
    assert reply.status_code == 400, reply.text[:300]
    assert fragment in reply.json()["error"]["message"]


def test_the_context_bounds_are_sglangs(engine: EmbeddedEngineProcess) -> None:
    """As SGLang: a prompt plus max_new_tokens up to the context (8192) is taken, one past it is
    refused with SGLang's message (the eval agents and the rollout budget their turns by it)."""
    url = f"{engine.url}/generate"
    prompt = [1] * 8190
    over = httpx.post(url, json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 3}}, timeout=30)
    assert over.status_code == 400 and "maximum context length of 8192" in over.json()["error"]["message"]
    fits = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}
    reply = httpx.post(url, json=fits, timeout=120)
    assert reply.status_code == 200, reply.text[:300]
    assert 1 <= reply.json()["meta_info"]["completion_tokens"] <= 2


def test_chat_is_measured_before_rendering(engine: EmbeddedEngineProcess) -> None:
    url = f"{engine.url}/v1/chat/completions"
    huge = {"messages": [{"role": "user", "content": "ab " * 200_000}]}
    reply = httpx.post(url, json=huge, timeout=10)
    assert reply.status_code == 400 and "characters" in reply.json()["error"]["message"]
    many = {"messages": [{"role": "user", "content": "x"}] * 50_000}  # tiny messages, long render
    reply = httpx.post(url, json=many, timeout=10)
    assert reply.status_code == 400 and "characters" in reply.json()["error"]["message"]
    tools = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "description": "d" * 300_000}}]}  # fmt: skip
    reply = httpx.post(url, json=tools, timeout=10)
    assert reply.status_code == 400 and "characters" in reply.json()["error"]["message"]
    over = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9000}
    reply = httpx.post(url, json=over, timeout=10)
    assert reply.status_code == 400 and "maximum context length" in reply.json()["error"]["message"]
    ok = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_mixed_good_and_bad_load(engine: EmbeddedEngineProcess) -> None:
    """48 concurrent requests, half hostile: every good one gets the same tokens as alone."""
    expected = good_request(engine)["output_ids"]
    bad: list[dict[str, Any]] = [
        {"content": b"{not json"},
        {"json": {"text": "ab " * 100_000}},
        {"json": {"input_ids": [1, 2, 10**6]}},
        {"json": {"input_ids": [1] * 9000}},
        {"json": {"input_ids": [1], "sampling_params": {"max_new_tokens": 10**6}}},
        {"content": b"[" * 100_000},
    ]
    good = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}

    with httpx.Client(base_url=engine.url, timeout=60, limits=httpx.Limits(max_connections=48)) as http:

        def one(i: int) -> tuple[bool, int, list[int] | None]:
            if i % 2:
                return False, http.post("/generate", **bad[i // 2 % len(bad)]).status_code, None
            reply = http.post("/generate", json=good)
            return True, reply.status_code, reply.json().get("output_ids")

        with ThreadPoolExecutor(48) as pool:
            results = list(pool.map(one, range(48)))
    assert all(code == 200 and ids == expected for is_good, code, ids in results if is_good)
    assert all(code in (400, 413) for is_good, code, _ in results if not is_good)
    assert httpx.get(f"{engine.url}/health").status_code == 200


# ------------------------------------------------------------------------------------------------
# images in the engine: count, bytes, pixels, paths
# ------------------------------------------------------------------------------------------------
def png_bytes(width: int, height: int, rows: int | None = None) -> bytes:
    """A real (all-black, grayscale) PNG: tiny on disk, width * height bytes once decoded
    (``rows`` truncates the pixel data, leaving a header that promises more)."""
    comp = zlib.compressobj(9)
    row = b"\x00" * (width + 1)
    data = b"".join(comp.compress(row) for _ in range(height if rows is None else rows)) + comp.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def test_engine_image_limits_apply_before_decoding() -> None:
    from relax_gym.trainer.engines.prepare import BadRequest, InputLimits, decode_images

    limits = InputLimits(max_images=2, max_image_bytes=64 << 10, max_image_pixels=1_000_000)
    assert decode_images([b64(png_bytes(100, 100))], limits=limits)[0].size == (100, 100)
    bomb = png_bytes(3000, 3000)  # 9 MB of pixels from a few KB
    assert len(bomb) < 64 << 10
    with pytest.raises(BadRequest, match=r"image_data\[0\]: 3000 x 3000 pixels exceed the limit"):
        decode_images([b64(bomb)], limits=limits)
    with pytest.raises(BadRequest, match="exceeds the limit of 65536 bytes"):
        decode_images([b64(os.urandom(100_000))], limits=limits)
    with pytest.raises(BadRequest, match="3 images in one request"):
        decode_images([b64(png_bytes(4, 4))] * 3, limits=limits)


@pytest.mark.parametrize("item", ["/etc/passwd", "/proc/self/environ", "../../etc/hosts", "file:///etc/passwd", "ftp://x/y.png"])  # fmt: skip
def test_engine_never_reads_paths_or_urls_unless_allowed(item: str) -> None:
    from relax_gym.trainer.engines.prepare import BadRequest, InputLimits, decode_images

    with pytest.raises(BadRequest, match=r"local file paths are not read|URLs are not fetched"):
        decode_images([item], limits=InputLimits())


def test_allowed_paths_are_still_bounded(tmp_path: Path) -> None:
    from relax_gym.trainer.engines.prepare import BadRequest, InputLimits, decode_images

    limits = InputLimits(allow_media_paths=True, max_image_bytes=1 << 20)
    big = tmp_path / "big.png"
    with big.open("wb") as fh:  # sparse: no disk used
        fh.truncate(300 * MiB)
    with pytest.raises(BadRequest, match="exceeds the limit"):
        decode_images([str(big)], limits=limits)
    ok = tmp_path / "ok.png"
    ok.write_bytes(png_bytes(8, 8))
    assert decode_images([str(ok)], limits=limits)[0].size == (8, 8)


# ------------------------------------------------------------------------------------------------
# media loaders (relax_gym.media): refused from headers, before decoding
# ------------------------------------------------------------------------------------------------
def test_image_header_over_the_pixel_limit_is_refused() -> None:
    # 9000 x 9000 is under Pillow's own bomb limits, so only our header check stops it
    header_only = png_bytes(9000, 9000, rows=1)  # the header claims 81 M pixels; one row of data
    with pytest.raises(MediaError, match="9000 x 9000 pixels exceed the limit"):
        media.load_image(header_only, limits=media.MediaLimits(max_image_pixels=50_000_000))
    with pytest.raises(MediaError, match="pixels exceed the limit"):
        media.load_image(png_bytes(2000, 2000), limits=media.MediaLimits(max_image_pixels=1_000_000))


def test_image_formats_outside_the_allow_list_are_refused() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="TIFF")
    with pytest.raises(MediaError, match="not a recognised image format"):
        media.load_image(buf.getvalue())
    assert media.load_image(buf.getvalue(), limits=media.MediaLimits(image_formats=("TIFF",))).size == (4, 4)


def test_oversize_inputs_are_refused_before_decoding(tmp_path: Path) -> None:
    small = media.MediaLimits(max_bytes=1 << 20)
    with pytest.raises(MediaError, match="exceeds the limit"):
        media.load_image(b"\x00" * (2 << 20), limits=small)
    with pytest.raises(MediaError, match="exceeds the limit"):
        media.load_image(media.to_data_url(b"\x00" * (2 << 20), "png"), limits=small)
    big = tmp_path / "clip.mp4"
    with big.open("wb") as fh:
        fh.truncate(300 * MiB)
    with pytest.raises(MediaError, match="exceeds the limit"):
        media.load_video(str(big), limits=small)


def test_device_files_and_fifos_are_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            media.load_audio(str(fifo))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    worker = threading.Thread(target=load, daemon=True)  # the old loader blocks in open() forever
    worker.start()
    worker.join(5)
    assert not worker.is_alive() and isinstance(errors[0], MediaError) and "not a regular file" in str(errors[0])
    with pytest.raises(MediaError, match="not a regular file"):
        media.load_image(Path("/dev/zero"))


def _wav(seconds: float, sr: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(sr)
        wf.writeframes(b"\x00\x00" * int(seconds * sr))
    return buf.getvalue()


def test_long_audio_is_refused_from_its_header() -> None:
    with pytest.raises(MediaError, match=r"5\.0 s\) exceed the limit"):
        media.load_audio(_wav(5.0), limits=media.MediaLimits(max_audio_seconds=2.0))
    with pytest.raises(MediaError, match="exceed the limit"):
        media.load_audio(_wav(1.0), limits=media.MediaLimits(max_audio_samples=1000))
    assert media.load_audio(_wav(1.0), limits=media.MediaLimits(max_audio_seconds=2.0))[0].size == 8000


def test_hour_of_compressed_silence_is_refused_by_default() -> None:
    """A FLAC of 11 minutes of silence is a few KB; decoded it would be 21 MB (default: 600 s)."""
    sf = pytest.importorskip("soundfile")
    buf = io.BytesIO()
    sf.write(buf, np.zeros(660 * 8000, np.int16), 8000, format="FLAC", subtype="PCM_16")
    assert len(buf.getvalue()) < 200_000
    with pytest.raises(MediaError, match="exceed the limit"):
        media.load_audio(buf.getvalue())


def _clip(frames: int = 40, fps: float = 10.0) -> bytes:
    pytest.importorskip("av")
    arr = np.zeros((frames, 32, 32, 3), np.uint8)
    arr[:, :, :, 0] = np.arange(frames)[:, None, None] * 5
    return media.encode_video(arr, fps)


@pytest.mark.parametrize(
    "limit, fragment",
    [
        ({"max_video_frames": 20}, "40 frames exceed the limit of 20"),
        ({"max_video_seconds": 2.0}, r"4\.0 s exceed the limit"),
        ({"max_video_pixels": 100}, "32 x 32 pixels exceed the limit"),
        ({"max_video_decoded_bytes": 50_000}, "would decode to"),
    ],
)
def test_video_limits_are_checked_before_decoding(
    limit: dict[str, Any], fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = media.MediaLimits(**limit)
    data = _clip()

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("a frame was decoded before the limits were checked")

    monkeypatch.setattr(media, "_decode_selected", no_decoding)
    with pytest.raises(MediaError, match=fragment):
        media.load_video(data, limits=limits)


def test_video_keeps_only_the_sampled_frames() -> None:
    data = _clip()
    few, fps = media.load_video(data, max_frames=4, limits=media.MediaLimits(max_video_decoded_bytes=4 * 32 * 32 * 3))
    assert few.shape == (4, 32, 32, 3) and fps == pytest.approx(1.0)
