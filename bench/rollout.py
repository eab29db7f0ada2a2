"""Rollout manager benchmarks.

    python bench/rollout.py schedule    # async per-episode scheduling vs turn-synchronous batching
    python bench/rollout.py overhead    # the manager's own CPU cost per turn at 256 episodes
    python bench/rollout.py             # both

**schedule** -- one embedded engine (a tiny random Qwen3; by default with the tiny 512-token BPE,
see ``--tokenizer``) serves both modes in the same run, on the same episodes with the same
per-request sampling seeds: a bench-only multi-turn tool env whose turn count
is heavy-tailed (Pareto) and whose responses are long-tailed (a per-episode token budget drawn
from a Pareto law, and a random stop-token set that ends each response after a geometric
number of tokens). Reports wall time, the speed-up, the engine's busy fraction (its scheduler's
busy seconds over wall time) and its mean decode batch size.

**overhead** -- 256 concurrent episodes against a *minimal fast engine*: a separate process
that speaks the same /generate protocol but answers at once with fixed random tokens (clearly
not a model; it isolates the manager). The manager process's CPU time divided by the turns it
ran is its own overhead per turn: chat-template deltas, tokenization, request building, httpx,
reply checks, env stepping, bookkeeping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

import relax_gym
from relax_gym import Action, Message, Observation, ToolSpec

SEARCH = ToolSpec("search", "Search a document collection.",
                  {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
WORDS = ["alpha", "beta", "gamma", "delta", "result", "found", "page", "section", "table", "figure", "value", "count", "total"]


class LongTailToolEnv(relax_gym.Env):
    """Bench-only: a tool-use episode whose length is drawn from a Pareto law (most episodes take
    one or two turns, a few take many) and whose tool results vary in length (log-normal)."""

    max_turns = 16

    def __init__(self, max_turns: int = 12, pareto_a: float = 1.2, fixed_turns: int | None = None) -> None:
        self.cap, self.a, self.fixed = max_turns, pareto_a, fixed_turns

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.turns = self.fixed or int(min(self.cap, 1 + np.floor(self.np_random.pareto(self.a))))
        self.t = 0
        return Observation([Message.user(f"Find fact #{seed}. Use the search tool as often as needed.")],
                           tools=[SEARCH]), {"planned_turns": self.turns}

    def step(self, action: Action | str):
        self.t += 1
        if self.t >= self.turns:
            return Observation(), 1.0, True, False, {"success": True}
        n = int(min(200, self.np_random.lognormal(2.5, 0.8)))
        text = " ".join(WORDS[int(i)] for i in self.np_random.integers(0, len(WORDS), size=n))
        return Observation([Message.tool(text, tool_call_id=f"c{self.t}", name="search")], tools=[SEARCH]), 0.0, \
            False, False, {}


# -- transports for the overhead bench --------------------------------------------------------------
def client_factory(transport: str) -> Any:
    """Router client factory pinning the core EngineClient's transport (httpx or aiohttp)."""
    from relax_gym.protocol import EngineClient

    return lambda url, n: EngineClient(url, max_connections=n, transport=transport)


# -- the minimal fast engine (overhead bench) ------------------------------------------------------
def serve_fast_engine(port_file: str, tokens: int) -> None:
    """A raw-ASGI server answering SGLang /generate at once with ``tokens`` random ids + EOS."""
    import uvicorn

    rng = random.Random(0)
    eos = 151645

    def reply(n: int) -> bytes:
        ids = [rng.randrange(1000, 100000) for _ in range(n - 1)] + [eos]
        return json.dumps({"text": "", "output_ids": ids, "meta_info": {
            "finish_reason": {"type": "stop", "matched": eos}, "completion_tokens": n, "prompt_tokens": 0,
            "weight_version": "0", "output_token_logprobs": [[-1.0, t, None] for t in ids]}}).encode()

    cache: dict[int, bytes] = {}
    info = json.dumps({"model_path": "fast-engine", "weight_version": "0"}).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        path = scope["path"]
        if path == "/generate":
            want = json.loads(body)["sampling_params"]["max_new_tokens"]
            n = max(1, min(tokens, int(want)))
            out = cache.get(n) or cache.setdefault(n, reply(n))
        elif path == "/get_model_info":
            out = info
        else:
            out = b"{}"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", access_log=False, lifespan="off",
                            backlog=4096)
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        Path(port_file).write_text(str(port))
        await task

    asyncio.run(main())


def start_fast_engine(tokens: int) -> tuple[subprocess.Popen[bytes], str]:
    port_file = Path(tempfile.mkdtemp(prefix="fast-engine-")) / "port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve-fast-engine", str(port_file), "--tokens", str(tokens)])
    for _ in range(300):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fast engine did not start")


# -- benches ---------------------------------------------------------------------------------------
async def _server_info(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return (await http.get(url + "/get_server_info")).json()  # type: ignore[no-any-return]


async def schedule_bench(args: argparse.Namespace) -> dict[str, Any]:
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.rollout import EngineRouter, EpisodeSpec, RolloutConfig, RolloutManager

    folder = build_tiny_model("qwen3", Path(tempfile.mkdtemp(prefix="bench-rollout-")) / "tiny-qwen3",
                              tokenizer=args.tokenizer)
    codec = ChatCodec.from_pretrained(folder)
    vocab = len(codec.tokenizer)
    rng = np.random.default_rng(0)
    # a random set of stop tokens: with a near-uniform random model each token stops the turn with
    # probability ~ len(stops)/vocab, so response lengths are geometric below the episode's budget
    plain = sorted(set(range(vocab)) - {int(i) for i in codec.tokenizer.added_tokens_decoder})
    stops = [int(t) for t in rng.choice(plain, size=max(1, int(vocab / args.mean_response)), replace=False)]
    budgets = [int(min(args.max_new_tokens, args.budget_scale * (1 + rng.pareto(1.5)))) for _ in range(args.episodes)]
    specs = [EpisodeSpec("bench/LongTailTool", seed=i, env_factory=LongTailToolEnv, max_new_tokens=budgets[i])
             for i in range(args.episodes)]
    planned = [LongTailToolEnv().reset(seed=i)[1]["planned_turns"] for i in range(args.episodes)]
    engine = EmbeddedEngineProcess(folder, threads=args.engine_threads,
                                   extra_args=["--max-batch-size", str(args.concurrency)])
    engine.start()
    results: dict[str, Any] = {"episodes": args.episodes, "concurrency": args.concurrency, "tokenizer": args.tokenizer,
                               "turns_planned": sum(planned), "turns_max": max(planned),
                               "budget_median": statistics.median(budgets), "budget_max": max(budgets)}
    try:
        async with EngineRouter([engine.url]) as router:
            async def one(mode: str, subset: list[Any]) -> dict[str, Any]:
                cfg = RolloutConfig(concurrency=args.concurrency, scheduling=mode, max_new_tokens=args.max_new_tokens,
                                    max_total_tokens=8000, stop_token_ids=stops, sampling_seed=1, check_drift=False)
                manager = RolloutManager(router, codec, cfg)
                await router.engines[0].client.flush_cache()  # no run reuses another's prefix cache
                before = await _server_info(engine.url)
                start = time.perf_counter()
                trajs = await manager.generate(subset)
                wall = time.perf_counter() - start
                after = await _server_info(engine.url)
                steps = after["decode_steps"] - before["decode_steps"]
                gen = after["generated_tokens"] - before["generated_tokens"]
                busy = after["busy_seconds"] - before["busy_seconds"]
                forward = after["forward_seconds"] - before["forward_seconds"]
                return {"wall_s": wall, "busy": busy / wall, "forward_share_of_busy": forward / max(busy, 1e-9),
                        "batch": gen / max(1, steps), "tokens": gen, "turns": manager.metrics.turns,
                        "decode_steps": steps, "prefill_batches": after["prefill_batches"] - before["prefill_batches"],
                        "prefill_tokens": after["prefill_tokens"] - before["prefill_tokens"],
                        "ok": sum(t.stop_reason == "env_done" for t in trajs)}

            await one("async", specs[: args.concurrency // 4])  # warm-up
            for rep in range(args.repeats):
                for mode in ("turn_sync", "async"):
                    r = await one(mode, specs)
                    results.setdefault(mode, []).append(r)
                    print(f"  {mode:9s} rep {rep}: {r['wall_s']:.1f} s, busy {r['busy']:.0%} (forward "
                          f"{r['forward_share_of_busy']:.0%} of it), batch {r['batch']:.1f}, {r['tokens']} tokens, "
                          f"{r['decode_steps']} steps, {r['prefill_batches']} prefill batches, "
                          f"{r['prefill_tokens']} prefill tokens, {r['ok']} ok", flush=True)
    finally:
        engine.stop()
    for mode in ("turn_sync", "async"):
        results[mode + "_median"] = {k: statistics.median(r[k] for r in results[mode]) for k in ("wall_s", "busy", "batch")}
    results["speedup"] = results["turn_sync_median"]["wall_s"] / results["async_median"]["wall_s"]
    return results


async def overhead_bench(args: argparse.Namespace) -> dict[str, Any]:
    from relax_gym.trainer.models import load_qwen3_tokenizer
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.rollout import EngineRouter, EpisodeSpec, RolloutConfig, RolloutManager

    codec = ChatCodec(load_qwen3_tokenizer())
    proc, url = start_fast_engine(args.fast_tokens)
    out: dict[str, Any] = {"concurrency": args.overhead_concurrency, "episodes": args.overhead_episodes}
    lean = {"env_in_thread": False, "check_drift": False}
    variants = [
        ("EngineClient (aiohttp)", {"client_factory": client_factory("aiohttp"), "connections_per_shard": 256}, {}),
        ("EngineClient (aiohttp), env inline, no drift check",
         {"client_factory": client_factory("aiohttp"), "connections_per_shard": 256}, lean),
        ("EngineClient (httpx)", {"client_factory": client_factory("httpx")}, {}),
        ("EngineClient (httpx), env inline, no drift check", {"client_factory": client_factory("httpx")}, lean),
    ]
    try:
        out["transport_only"] = await transport_bench(url, args)
        for label, router_kwargs, cfg_kwargs in variants:
            rows = []
            async with EngineRouter([url], **router_kwargs) as router:
                for _ in range(args.repeats):
                    cfg = RolloutConfig(concurrency=args.overhead_concurrency, max_new_tokens=args.fast_tokens,
                                        **cfg_kwargs)
                    manager = RolloutManager(router, codec, cfg)
                    specs = [EpisodeSpec("bench/FixedTool", seed=i, env_factory=lambda: LongTailToolEnv(fixed_turns=4))
                             for i in range(args.overhead_episodes)]
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    trajs = await manager.generate(specs)
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    turns = manager.metrics.turns
                    assert all(t.stop_reason == "env_done" for t in trajs), {t.stop_reason for t in trajs}
                    rows.append({"cpu_ms_per_turn": 1e3 * cpu / turns, "wall_ms_per_turn": 1e3 * wall / turns})
                    print(f"  {label}: {rows[-1]['cpu_ms_per_turn']:.3f} ms CPU/turn, "
                          f"{rows[-1]['wall_ms_per_turn']:.3f} ms wall/turn over {turns} turns", flush=True)
            out[label] = {k: statistics.median(r[k] for r in rows) for k in ("cpu_ms_per_turn", "wall_ms_per_turn")}
    finally:
        proc.terminate()
        proc.wait(10)
    return out


async def transport_bench(url: str, args: argparse.Namespace) -> dict[str, float]:
    """CPU per /generate call of the HTTP client alone (a 600-token prompt, 256 in flight), so
    the manager's own share can be told apart from its transport's."""
    from relax_gym.protocol import EngineClient, GenerateRequest, SamplingParams

    request = GenerateRequest(input_ids=list(range(1000, 1600)), return_logprob=True,
                              sampling_params=SamplingParams(max_new_tokens=args.fast_tokens))
    out: dict[str, float] = {}
    shard = 16
    for label, make in (("EngineClient (httpx)", lambda: EngineClient(url, max_connections=shard, transport="httpx")),
                        ("EngineClient (aiohttp)", lambda: EngineClient(url, max_connections=256, transport="aiohttp"))):
        clients = [make() for _ in range(args.overhead_concurrency // shard)] if "httpx" in label else [make()]
        gate = asyncio.Semaphore(args.overhead_concurrency)

        async def one(i: int, clients: list[Any] = clients, gate: asyncio.Semaphore = gate) -> None:
            async with gate:
                await clients[i % len(clients)].generate(request)

        await asyncio.gather(*(one(i) for i in range(512)))  # warm the pools
        n = 4096
        cpu0 = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        out[label] = 1e3 * (time.process_time() - cpu0) / n
        print(f"  transport only, {label}: {out[label]:.3f} ms CPU/request", flush=True)
        for client in clients:
            await client.aclose()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", nargs="?", choices=["schedule", "overhead", "all"], default="all")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16, help="the embedded engine saturates at a batch of ~16 here")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--budget-scale", type=float, default=32.0,
                        help="per-episode token budget per turn: scale * (1 + Pareto(1.5)), capped at --max-new-tokens")
    parser.add_argument("--mean-response", type=float, default=96.0, help="mean tokens before a random stop token")
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--tokenizer", choices=["tiny-bpe", "qwen3"], default="tiny-bpe",
                        help="tiny-bpe (512 tokens): the CPU engine's decode step is then dominated by its fixed "
                        "per-step cost, as a GPU engine's is; qwen3 (151k): the per-row lm_head and sampling over "
                        "151k logits make a CPU step linear in the batch, so no scheduler can gain there")
    parser.add_argument("--overhead-episodes", type=int, default=1024)
    parser.add_argument("--overhead-concurrency", type=int, default=256)
    parser.add_argument("--fast-tokens", type=int, default=16, help="tokens per reply of the fast engine")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--serve-fast-engine", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fast_engine:
        serve_fast_engine(args.serve_fast_engine, args.tokens)
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results: dict[str, Any] = {}
    if args.part in ("schedule", "all"):
        print("schedule: async per-episode vs turn-synchronous, same engine, same episodes", flush=True)
        results["schedule"] = asyncio.run(schedule_bench(args))
        s = results["schedule"]
        print(f"speed-up {s['speedup']:.2f}x; busy: async {s['async_median']['busy']:.0%}, "
              f"turn-sync {s['turn_sync_median']['busy']:.0%}; mean decode batch: async "
              f"{s['async_median']['batch']:.1f}, turn-sync {s['turn_sync_median']['batch']:.1f}")
    if args.part in ("overhead", "all"):
        print(f"overhead: {args.overhead_concurrency} concurrent episodes against the minimal fast engine", flush=True)
        o = results["overhead"] = asyncio.run(overhead_bench(args))
        for label in [k for k in o if isinstance(o[k], dict) and "cpu_ms_per_turn" in o[k]]:
            transport = next(v for k, v in o["transport_only"].items() if label.startswith(k))
            o[label]["manager_own_ms_per_turn"] = o[label]["cpu_ms_per_turn"] - transport
            print(f"  {label}: {o[label]['cpu_ms_per_turn']:.2f} ms CPU/turn, of which the HTTP client "
                  f"{transport:.2f} ms: manager's own {o[label]['manager_own_ms_per_turn']:.2f} ms/turn")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
