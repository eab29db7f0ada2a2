"""Embedded engine under abusive input: latency of good requests alone vs mixed with bad ones.

    python bench/engine_abuse.py                       # tiny Qwen3-VL (tiny BPE), 500 requests, ~2 min on 2 cores
    python bench/engine_abuse.py --requests 500 --bad-fraction 0.5 --rounds 2 --json out.json

Against a real ``relax-gym engine serve`` process on 127.0.0.1 (one torch thread, the default
limits except a body cap of ``--max-request-mb``, so oversize bodies stay cheap to send):

* **alone**: ``G`` good requests (short random prompts, greedy, ``--tokens`` new tokens) all at
  once; the latency of each, from send to reply;
* **mixed**: the same ``G`` good requests and ``B`` bad ones, shuffled and all at once (``G + B =
  --requests``): oversize chunked bodies, malformed and deeply nested JSON, prompts over the
  character bound or the context, ids outside the vocabulary, absurd ``max_new_tokens``, huge
  stop lists, audio, broken / bomb / huge-header images, an over-long chat;
* every good reply must carry exactly the tokens the same request got alone (greedy), every bad
  one a 4xx; the run fails otherwise. Reported: p50/p99 of the good requests in both conditions,
  the bad requests' statuses and p50 latency (and that of one bad request of each kind sent
  alone, first), and the engine's peak RSS over its idle RSS.

``--rounds`` alternates alone/mixed that many times and pools the latencies of each condition.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import struct
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

MiB = 1 << 20


# ------------------------------------------------------------------------------------------------
# requests
# ------------------------------------------------------------------------------------------------
def good_body(rng: random.Random, vocab: int, tokens: int) -> dict[str, Any]:
    ids = [rng.randrange(10, min(vocab - 64, 5000)) for _ in range(rng.randint(8, 32))]  # no special tokens
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}}


def _png(width: int, height: int, rows: int) -> bytes:
    """A grayscale PNG whose header claims width x height; ``rows`` rows of real data."""
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(b"\x00" * (width + 1)) for _ in range(rows)) + comp.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    head = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _noise_png(width: int, height: int) -> bytes:
    """Random pixels: a PNG that does not compress, so cutting it loses image data."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), random.Random(1).randbytes(width * height * 3)).save(buf, "PNG")
    return buf.getvalue()


def bad_requests(vocab: int, context: int) -> dict[str, dict[str, Any]]:
    """One hostile request of each kind: httpx keyword arguments (or ``oversize`` for the raw path)."""
    img = "<|vision_start|><|image_pad|><|vision_end|> what is this?"
    bomb = base64.b64encode(_png(6000, 6000, 6000)).decode()  # 36 M pixels from ~40 KB
    huge_header = base64.b64encode(_png(60000, 60000, 1)).decode()
    truncated = base64.b64encode(_noise_png(64, 64)[:2000]).decode()  # cut inside the pixel data
    return {
        "oversize_chunked_body": {"oversize": True},
        "malformed_json": {"path": "/generate", "content": b'{"input_ids": [1, 2'},
        "nested_json": {"path": "/generate", "content": b"[" * 50_000},
        "text_over_char_bound": {"path": "/generate", "json": {"text": "ab " * (context * 12)}},
        "ids_over_context": {"path": "/generate", "json": {"input_ids": [11] * (context + 10)}},
        "ids_outside_vocab": {"path": "/generate", "json": {"input_ids": [1, 2, vocab + 7, -3]}},
        "max_new_tokens_huge": {"path": "/generate", "json": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10**9}}},  # fmt: skip
        "stop_list_huge": {"path": "/generate", "json": {"input_ids": [1, 2], "sampling_params": {"stop": ["x"] * 10_000}}},  # fmt: skip
        "audio_payload": {"path": "/generate", "json": {"input_ids": [1, 2], "audio_data": ["UklGRg==" * 1000]}},
        "image_bomb_png": {"path": "/generate", "json": {"text": img, "image_data": [bomb]}},
        "image_huge_header": {"path": "/generate", "json": {"text": img, "image_data": [huge_header]}},
        "image_truncated": {"path": "/generate", "json": {"text": img, "image_data": [truncated]}},
        "image_garbage_base64": {"path": "/generate", "json": {"text": img, "image_data": ["%%%not base64%%%"]}},
        "image_local_path": {"path": "/generate", "json": {"text": img, "image_data": ["/etc/passwd"]}},
        "chat_over_char_bound": {
            "path": "/v1/chat/completions",
            "json": {"messages": [{"role": "user", "content": "ab " * (context * 12)}], "max_tokens": 4},
        },
    }


async def send_oversize(port: int, total: int, chunk: int = MiB) -> int:
    """Stream a chunked body of ``total`` bytes; return the status the server answered with."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    reply = asyncio.ensure_future(reader.readline())
    try:
        sent = 0
        while sent < total and not reply.done():
            writer.write(b"%x\r\n%s\r\n" % (chunk, b"a" * chunk))
            await writer.drain()
            sent += chunk
        if not reply.done():
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # the server closed the connection after answering
    try:
        line = await asyncio.wait_for(reply, 60)
    finally:
        writer.close()
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0


# ------------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------------
class PeakRSS:
    """Polls a process's RSS in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = await fn()
    return time.perf_counter() - start, out


async def run_round(
    http: httpx.AsyncClient, port: int, goods: list[dict[str, Any]], bads: list[tuple[str, dict[str, Any]]], oversize: int
) -> tuple[list[tuple[float, int, list[int] | None]], list[tuple[str, float, int]]]:
    """Send every good and bad request at once; (latency, status, output ids) per good request,
    (kind, latency, status) per bad one."""

    async def good(body: dict[str, Any]) -> tuple[float, int, list[int] | None]:
        latency, reply = await timed(lambda: http.post("/generate", json=body))
        return latency, reply.status_code, reply.json().get("output_ids") if reply.status_code == 200 else None

    async def bad(kind: str, spec: dict[str, Any]) -> tuple[str, float, int]:
        if spec.get("oversize"):
            latency, status = await timed(lambda: send_oversize(port, oversize))
            return kind, latency, status
        kwargs = {k: v for k, v in spec.items() if k != "path"}
        latency, reply = await timed(lambda: http.post(spec["path"], **kwargs))
        return kind, latency, reply.status_code

    jobs: list[Awaitable[Any]] = [good(b) for b in goods] + [bad(k, s) for k, s in bads]
    order = list(range(len(jobs)))
    random.Random(len(jobs)).shuffle(order)
    results = await asyncio.gather(*(jobs[i] for i in order))
    by_index = dict(zip(order, results, strict=True))
    return [by_index[i] for i in range(len(goods))], [by_index[i] for i in range(len(goods), len(jobs))]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def bench(url: str, port: int, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    n_bad = round(args.requests * args.bad_fraction)
    n_good = args.requests - n_bad
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=args.requests + 10, max_keepalive_connections=args.requests + 10)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        info = (await http.get("/get_model_info")).json()
        vocab, context = int(info["vocab_size"]), int(info["max_context_length"])
        goods = [good_body(rng, vocab, args.tokens) for _ in range(n_good)]
        kinds = list(bad_requests(vocab, context).items())
        bads = [kinds[i % len(kinds)] for i in range(n_bad)]
        expected = []  # what each good request gets alone (greedy), one at a time
        for body in goods:
            reply = await http.post("/generate", json=body)
            reply.raise_for_status()
            expected.append(reply.json()["output_ids"])
        _, lone = await run_round(http, port, [], kinds, args.oversize_mb * MiB)  # one bad of each kind, alone
        idle = psutil.Process(pid).memory_info().rss
        alone: list[float] = []
        mixed: list[float] = []
        bad_out: list[tuple[str, float, int]] = []
        wrong = 0
        with PeakRSS(pid) as rss:
            for _ in range(args.rounds):
                for condition, pool, extra in (("alone", alone, []), ("mixed", mixed, bads)):
                    good_out, bad_round = await run_round(http, port, goods, extra, args.oversize_mb * MiB)
                    wrong += sum(s != 200 or ids != exp for (_, s, ids), exp in zip(good_out, expected, strict=True))
                    pool.extend(lat for lat, _, _ in good_out)
                    bad_out.extend(bad_round)
                    print(f"{condition}: {len(good_out)} good, {len(bad_round)} bad, p50 {pct([g[0] for g in good_out], 50):.2f} s")  # noqa: T201
        healthy = (await http.get("/health")).status_code == 200
    not_4xx = [(k, s) for k, _, s in bad_out + lone if not 400 <= s < 500]
    return {
        "requests": args.requests,
        "good": n_good,
        "bad": n_bad,
        "rounds": args.rounds,
        "tokens": args.tokens,
        "good_alone_p50_s": round(pct(alone, 50), 3),
        "good_alone_p99_s": round(pct(alone, 99), 3),
        "good_mixed_p50_s": round(pct(mixed, 50), 3),
        "good_mixed_p99_s": round(pct(mixed, 99), 3),
        "bad_p50_s": round(pct([lat for _, lat, _ in bad_out], 50), 3),
        "bad_alone_p50_s": round(pct([lat for _, lat, _ in lone], 50), 3),
        "bad_alone_max_s": round(max(lat for _, lat, _ in lone), 3),
        "bad_statuses": dict(sorted(Counter(f"{k}:{s}" for k, _, s in bad_out).items())),
        "good_wrong_or_failed": wrong,
        "bad_not_4xx": len(not_4xx),
        "engine_idle_rss_mb": round(idle / MiB, 1),
        "engine_peak_rss_growth_mb": round((rss.peak - idle) / MiB, 1),
        "healthy_after": healthy,
        "good_latencies_per_condition": len(alone),
        "load_average_1min": round(psutil.getloadavg()[0], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500, help="requests in the mixed run (good + bad)")
    parser.add_argument("--bad-fraction", type=float, default=0.5)
    parser.add_argument("--tokens", type=int, default=4, help="new tokens per good request")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--kind", default="qwen3-vl", choices=["qwen3", "qwen3-vl"])
    parser.add_argument("--tokenizer", default="tiny-bpe", choices=["qwen3", "tiny-bpe"])
    parser.add_argument("--max-request-mb", type=int, default=8, help="the server's body cap")
    parser.add_argument("--oversize-mb", type=int, default=16, help="size of each oversize chunked body")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model

    root = Path(tempfile.mkdtemp(prefix="engine-abuse-"))
    model = build_tiny_model(args.kind.replace("-", "_"), root / "model", seed=0, tokenizer=args.tokenizer)
    with EmbeddedEngineProcess(
        model, threads=1, extra_args=["--max-request-mb", str(args.max_request_mb)], startup_timeout_s=600
    ) as engine:
        assert engine.proc is not None and engine.port is not None
        result = asyncio.run(bench(engine.url, engine.port, engine.proc.pid, args))
    print(json.dumps(result, indent=2))  # noqa: T201
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    ok = result["good_wrong_or_failed"] == 0 and result["bad_not_4xx"] == 0 and result["healthy_after"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
