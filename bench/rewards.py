"""Reward throughput on this machine: rule rewards through the composer, math equivalence (fast
path and sympy worker), and the GenRM client against a local judge server.

    python bench/rewards.py            # about 30 s on a 2-core box; prints a Markdown table

Figures are medians over repeats; the GenRM part reports the speed-up of concurrency 16 over
1 against a judge that takes 20 ms per request, and the cost of a cache hit.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from relax_gym.rewards import GenRMClient, RewardComposer, RewardInput, math_equal
from relax_gym.rewards.sympy_pool import SympyPool

JUDGE_DELAY_S = 0.02


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_composer(rows: list[tuple[str, str]]) -> None:
    samples = [
        RewardInput.from_text("q", f"<think>t</think><answer>{i % 7}</answer> \\boxed{{{i % 7}}}", label=str(i % 5))
        for i in range(512)
    ]
    composer = RewardComposer(["exact_match", "format_tags", "format_boxed", "token_f1"])
    composer.score_sync(samples[:8])
    t = median_time(lambda: composer.score_sync(samples), 5)
    rows.append(("composer, 4 rule rewards, batch of 512", f"{len(samples) / t:,.0f} samples/s"))


def bench_math(rows: list[tuple[str, str]]) -> None:
    pool = SympyPool(size=1)
    try:
        start = time.perf_counter()
        math_equal(r"\sqrt{2}", r"\frac{2}{\sqrt{2}}", pool=pool)
        rows.append(("sympy worker start + first check", f"{(time.perf_counter() - start) * 1e3:,.0f} ms"))
        fast = [("1,000", "1000"), (r"\frac{1}{2}", "0.5"), (r"50\%", "0.5"), (r"\{1,2\}", r"\{2,1\}"), ("x=3", "3")]
        t = median_time(lambda: [math_equal(a, b, pool=pool) for a, b in fast], 20) / len(fast)
        rows.append(("math_equal, fast path (no sympy)", f"{t * 1e6:,.0f} µs/pair"))
        slow = [(r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"), (r"x^2+2x+1", r"(x+1)^2"), (r"2\sqrt{3}", r"\sqrt{12}"),
                (r"\frac{3\pi}{4}", r"0.75\pi"), (r"\log_2 8", "3")]
        t = median_time(lambda: [math_equal(a, b, pool=pool) for a, b in slow], 5) / len(slow)
        rows.append(("math_equal, sympy path (warm worker)", f"{t * 1e3:,.1f} ms/pair"))
    finally:
        pool.close()


class _Judge(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add 40 ms
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(JUDGE_DELAY_S)
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "SCORE: 7"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_judge() -> None:
    """Run the stand-in judge in this process (the benchmark starts it as a child process, so
    the server's threads do not compete with the client for the GIL)."""
    ThreadingHTTPServer.request_queue_size = 256  # the default backlog of 5 drops bursts of connects
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    httpd.daemon_threads = True
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


def bench_genrm(rows: list[tuple[str, str]]) -> None:
    server = subprocess.Popen([sys.executable, __file__, "--serve-judge"], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    url = f"http://127.0.0.1:{int(server.stdout.readline())}"
    samples = [RewardInput.from_text("q", f"answer {i}") for i in range(64)]

    cpu_per_call: list[float] = []

    async def run(concurrency: int) -> float:
        client = GenRMClient({"base_url": url, "max_concurrency": concurrency, "cache_size": 0})
        await client.score_batch(samples[:concurrency], "rubric")  # open the connections
        start, cpu = time.perf_counter(), time.process_time()
        results = await client.score_batch(samples, "rubric")
        elapsed = time.perf_counter() - start
        cpu_per_call.append((time.process_time() - cpu) / len(samples))
        assert all(r.total == 0.7 for r in results)
        await client.aclose()
        return elapsed

    async def cache_hit() -> float:
        client = GenRMClient({"base_url": url})
        await client.score_batch(samples, "rubric")
        start = time.perf_counter()
        await client.score_batch(samples, "rubric")
        await client.aclose()
        return (time.perf_counter() - start) / len(samples)

    try:
        serial = statistics.median(asyncio.run(run(1)) for _ in range(3))
        parallel = statistics.median(asyncio.run(run(16)) for _ in range(3))
        rows.append((f"GenRM, {len(samples)} judge calls ({JUDGE_DELAY_S * 1e3:.0f} ms each), concurrency 1",
                     f"{len(samples) / serial:,.0f} calls/s"))
        rows.append(("GenRM, same, concurrency 16", f"{len(samples) / parallel:,.0f} calls/s "
                     f"({serial / parallel:.1f}x)"))
        rows.append(("GenRM client CPU per judge call (request, parse, bookkeeping)",
                     f"{statistics.median(cpu_per_call) * 1e3:,.2f} ms"))
        rows.append(("GenRM cache hit", f"{statistics.median(asyncio.run(cache_hit()) for _ in range(3)) * 1e6:,.0f} µs/call"))
    finally:
        server.kill()
        server.wait(timeout=10)


def main() -> None:
    rows: list[tuple[str, str]] = []
    bench_composer(rows)
    bench_math(rows)
    bench_genrm(rows)
    print("| what | median |\n| --- | --- |")
    for what, value in rows:
        print(f"| {what} | {value} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve-judge"]:
        serve_judge()
    else:
        main()
