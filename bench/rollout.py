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
not a model; it isolates the manager). The manager process's CPU time (``time.process_time``)
divided by the turns it ran is the CPU per turn: chat-template deltas, tokenization, request
building, the HTTP client, reply checks, env stepping, bookkeeping. Each repeat runs every
variant (``defaults``: ``EngineRouter([url])`` and ``RolloutConfig`` as they come) and then the
router's HTTP client alone on requests of the run's mean length; the difference is the
manager's own CPU per turn. ``--profile FILE`` adds one cProfile pass of the first variant.
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

    # a long keep-alive: the variants take turns, and a pool left idle longer than uvicorn's 5 s
    # default would meet connections the server has just closed (a failover, not the manager's cost)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", access_log=False, lifespan="off",
                            backlog=4096, timeout_keep_alive=600)
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
                                    group_size=1, max_total_tokens=8000, stop_token_ids=stops, sampling_seed=1,
                                    check_drift=False)
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


OVERHEAD_VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (EngineRouter kwargs beyond the URL, RolloutConfig kwargs beyond concurrency/max_new_tokens)
    "defaults": ({}, {}),
    "defaults, env inline, no drift check": ({}, {"env_in_thread": False, "check_drift": False}),
    "httpx transport": ({"client_factory": client_factory("httpx")}, {}),
}


def _fixed_tool_env() -> LongTailToolEnv:
    return LongTailToolEnv(fixed_turns=4)


def _request_lengths(trajs: list[Any]) -> list[int]:
    """The input length of every /generate request: where each run of sampled tokens starts."""
    out = []
    for t in trajs:
        out.extend(i for i, m in enumerate(t.loss_mask) if m == 1 and (i == 0 or t.loss_mask[i - 1] == 0))
    return out


async def _overhead_run(router: Any, codec: Any, args: argparse.Namespace, cfg_kwargs: dict[str, Any],
                        profiler: Any = None) -> dict[str, float]:
    """One pass: ``--overhead-episodes`` four-turn episodes, ``--overhead-concurrency`` at once."""
    from relax_gym.trainer.rollout import EpisodeSpec, RolloutConfig, RolloutManager

    cfg = RolloutConfig(concurrency=args.overhead_concurrency, max_new_tokens=args.fast_tokens, group_size=1,
                        **cfg_kwargs)
    manager = RolloutManager(router, codec, cfg)
    specs = [EpisodeSpec("bench/FixedTool", seed=i, env_factory=_fixed_tool_env) for i in range(args.overhead_episodes)]
    if profiler is not None:
        profiler.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    trajs = await manager.generate(specs)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if profiler is not None:
        profiler.disable()
    turns = manager.metrics.turns
    assert all(t.stop_reason == "env_done" for t in trajs), {t.stop_reason for t in trajs}
    return {"cpu_ms_per_turn": 1e3 * cpu / turns, "wall_ms_per_turn": 1e3 * wall / turns,
            "mean_request_tokens": statistics.fmean(_request_lengths(trajs))}


async def overhead_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Each repeat runs every variant once (interleaved, so a load change hits them alike), then
    the transport alone; medians over the repeats."""
    from relax_gym.trainer.models import load_qwen3_tokenizer
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.rollout import EngineRouter

    codec = ChatCodec(load_qwen3_tokenizer())
    proc, url = start_fast_engine(args.fast_tokens)
    variants = {name: OVERHEAD_VARIANTS[name] for name in args.variants}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in [*variants, *(f"transport: {n}" for n in variants)]}
    try:
        routers = {name: await EngineRouter([url], **kw).start() for name, (kw, _) in variants.items()}
        for name, (_, cfg_kwargs) in variants.items():  # warm-up: pools, template cache, tokenizer
            await _overhead_run(routers[name], codec, argparse.Namespace(**{**vars(args), "overhead_episodes": 256}),
                                cfg_kwargs)
        for rep in range(args.repeats):
            for name, (_, cfg_kwargs) in variants.items():
                row = await _overhead_run(routers[name], codec, args, cfg_kwargs)
                rows[name].append(row)
                transport = await transport_cpu_ms(routers[name], args, round(row["mean_request_tokens"]))
                rows[f"transport: {name}"].append({"cpu_ms_per_request": transport})
                print(f"  rep {rep} {name}: {row['cpu_ms_per_turn']:.3f} ms CPU/turn (transport alone "
                      f"{transport:.3f} ms/request), {row['wall_ms_per_turn']:.3f} ms wall/turn", flush=True)
        if args.profile:
            import cProfile
            import pstats

            # the event loop thread's CPU time, not wall time: on a loaded machine wall time
            # charges preemption to whatever function was running
            profiler = cProfile.Profile(time.thread_time)
            name = args.variants[0]
            await _overhead_run(routers[name], codec, args, variants[name][1], profiler)
            profiler.dump_stats(args.profile)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
        for router in routers.values():
            await router.close()
    finally:
        proc.terminate()
        proc.wait(10)
    out: dict[str, Any] = {"concurrency": args.overhead_concurrency, "episodes": args.overhead_episodes,
                           "repeats": args.repeats}
    for name in variants:
        med = {k: statistics.median(r[k] for r in rows[name]) for k in rows[name][0]}
        med["transport_ms_per_request"] = statistics.median(r["cpu_ms_per_request"] for r in rows[f"transport: {name}"])
        med["manager_own_ms_per_turn"] = med["cpu_ms_per_turn"] - med["transport_ms_per_request"]
        out[name] = med
    return out


async def transport_cpu_ms(router: Any, args: argparse.Namespace, prompt_tokens: int) -> float:
    """CPU per /generate call of the router's HTTP clients alone (``prompt_tokens`` input ids,
    ``--overhead-concurrency`` in flight): the transport share of a turn, so the manager's own
    share can be told apart from it. Each bench turn sends exactly one request."""
    from relax_gym.protocol import GenerateRequest, SamplingParams

    request = GenerateRequest(input_ids=list(range(1000, 1000 + prompt_tokens)), return_logprob=True,
                              sampling_params=SamplingParams(max_new_tokens=args.fast_tokens))
    handle = router.engines[0]
    gate = asyncio.Semaphore(args.overhead_concurrency)

    async def one() -> None:
        async with gate:
            await router.generate(handle, request)

    n = 4096
    cpu0 = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return 1e3 * (time.process_time() - cpu0) / n


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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", choices=list(OVERHEAD_VARIANTS), default=list(OVERHEAD_VARIANTS),
                        help="overhead variants to run (each repeat runs them in turn)")
    parser.add_argument("--profile", default=None,
                        help="overhead: after the repeats, profile one pass of the first variant with cProfile "
                        "(timer: the event loop thread's CPU time) and write the stats here (the top functions "
                        "by own time are printed)")
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
        for name in args.variants:
            r = o[name]
            print(f"  {name}: {r['cpu_ms_per_turn']:.2f} ms CPU/turn, of which the HTTP client "
                  f"{r['transport_ms_per_request']:.2f} ms: manager's own {r['manager_own_ms_per_turn']:.2f} ms/turn "
                  f"(median of {args.repeats}; mean request {r['mean_request_tokens']:.0f} tokens)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
