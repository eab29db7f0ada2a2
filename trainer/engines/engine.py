"""The embedded engine's scheduler: continuous batching over one :class:`ModelRunner`.

One background thread owns the model. Each loop iteration it

1. takes new requests and control jobs from a thread-safe inbox;
2. runs control jobs whose conditions hold (pause, continue, abort, weight updates...);
3. admits waiting requests into the running batch (one batched prefill, each distinct prompt
   computed once, then a KV merge);
4. runs one decode step for every running request and retires the finished ones.

So a request that arrives while others decode joins at the next step, and one that finishes
frees its row at once: continuous batching, with per-request KV rows in a left-padded cache.

Semantics follow SGLang's server:

* ``abort`` (one rid or all) finishes requests with ``finish_reason.type == "abort"`` and the
  tokens generated so far, so a partial rollout can resume from them.
* ``pause(mode="abort")`` aborts everything in flight; ``"retract"`` frees the running requests'
  KV and re-prefills prompt + generated tokens on ``continue``; ``"in_place"`` keeps them in the
  batch untouched. Requests arriving while paused wait for ``continue``.
* A weight update while paused applies at once (held requests resume on the new weights; in
  ``in_place`` mode over KV computed with the old ones, as in SGLang). Otherwise it stops
  admitting, lets the running batch finish (or aborts it with ``abort_all_requests``), applies,
  and bumps ``weight_version``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from relax_gym.protocol import weight_version_spans
from relax_gym.vision import VisionInputs

from relax_gym.trainer.engines.kv import BatchKV
from relax_gym.trainer.engines.prefix_cache import PrefixCache
from relax_gym.trainer.engines.model_runner import ModelRunner, SeqInput, dedupe_key
from relax_gym.trainer.engines.sampling import (
    LogprobMode,
    SamplingSpec,
    make_generator,
    prompt_logprobs,
    prompt_top_logprobs,
    sample_next,
)

log = logging.getLogger("relax_gym.engine")

PauseMode = Literal["abort", "retract", "in_place"]
Deliver = Callable[[dict[str, Any] | BaseException], None]


#: a cached prefix shorter than this is not worth a prefill of its own when other requests
#: wait: every forward pass has a fixed cost, and one batched prefill of the whole prompts is
#: cheaper than a row each (a chat template's shared head would split a rollout's batch into
#: one prefill per request, and stagger its decode)
PREFIX_BATCH_MIN = 256


@dataclass(eq=False)
class Sequence:
    """One request inside the engine: its inputs and everything generated so far."""

    rid: str
    prompt_ids: list[int]
    spec: SamplingSpec
    generator: torch.Generator
    deliver: Deliver
    vision: VisionInputs | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    created: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top: list[list[tuple[float, int]] | None] | None = None
    next_pos: int = 0  # text position of the next token fed to the model
    rope_delta: int = 0
    cached_tokens: int = 0
    prefilled_once: bool = False
    retractions: int = 0  # SGLang's num_retractions: times the request left the batch and came back
    finish: dict[str, Any] | None = None

    def prefill_input(self, prefix: PrefixCache | None) -> SeqInput:
        """Prompt plus generated tokens (a retracted request resumes from all of them)."""
        ids = self.prompt_ids + self.output_ids
        seq = SeqInput(input_ids=ids, want_prompt_logits=self.wants_input_logprobs)
        if self.vision is not None:
            seq.pixel_values = self.vision.pixel_values
            seq.image_grid_thw = self.vision.image_grid_thw
            seq.pixel_values_videos = self.vision.pixel_values_videos
            seq.video_grid_thw = self.vision.video_grid_thw
            seq.input_features = self.vision.input_features
            seq.feature_attention_mask = self.vision.feature_attention_mask
            seq.mm_token_type_ids = self.vision.mm_token_type_ids + [0] * len(self.output_ids)
        elif prefix is not None and not seq.want_prompt_logits:
            hit = prefix.lookup(ids)
            if hit is not None:
                seq.past, seq.past_len = hit
        return seq

    @property
    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0 and not self.prefilled_once


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]
    quiet: bool = False  # needs no running batch (or a pause) before it runs
    abort_all: bool = False


@dataclass
class EngineStats:
    started: float = field(default_factory=time.time)
    requests_done: int = 0
    requests_aborted: int = 0
    requests_failed: int = 0
    bad_requests: int = 0
    generated_tokens: int = 0
    prefill_batches: int = 0
    max_running: int = 0
    weight_updates: int = 0
    step_errors: int = 0


class EngineCore:
    """Continuous-batching scheduler around a :class:`ModelRunner` (see the module doc)."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_batch_size: int = 32,
        max_prefill_tokens: int = 8192,
        logprob_mode: LogprobMode = "scaled",
        seed: int = 0,
        weight_version: str = "default",
        prefix_cache_tokens: int = 0,
        admit_quiet_s: float = 0.01,
        admit_window_s: float = 0.1,
    ) -> None:
        self.runner = runner
        # an idle engine gathers a burst of requests before its first prefill (see _gather_burst)
        self.admit_quiet_s = max(0.0, admit_quiet_s)
        self.admit_window_s = max(0.0, admit_window_s)
        self.max_batch_size = max(1, max_batch_size)
        self.max_prefill_tokens = max(1, max_prefill_tokens)
        self.logprob_mode = logprob_mode
        self.weight_version = weight_version
        self.stats = EngineStats()
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        self._seeds = itertools.count(seed * 1_000_003 + 1)
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._held: list[Sequence] = []
        self._kv: BatchKV | None = None
        self._jobs: deque[_Job] = deque()
        self._paused: PauseMode | None = None
        self._active: dict[str, Sequence] = {}
        self._stop = threading.Event()
        self._busy_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="relax-gym-engine", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    # -- thread-safe API ----------------------------------------------------------------------
    def next_seed(self) -> int:
        return next(self._seeds)

    def submit(self, seq: Sequence) -> None:
        """Queue a request; its result (or exception) comes back through ``seq.deliver``."""
        self._inbox.put(("add", seq))

    def abort(self, rid: str | None, message: str = "aborted") -> None:
        """Abort one request by rid, or every request when ``rid`` is None."""
        self._inbox.put(("abort", (rid, message)))

    def run_job(
        self, fn: Callable[[], Any], *, quiet: bool = False, abort_all: bool = False
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn`` on the engine thread between steps; ``quiet`` waits for an idle or paused batch."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._inbox.put(("job", _Job(fn, fut, quiet, abort_all)))
        return fut

    def snapshot(self) -> dict[str, Any]:
        """Load and counters, for /get_server_info, routing and benchmarks."""
        s = self.stats
        rs = self.runner.stats
        return {
            "num_running_reqs": len(self._running),
            "num_waiting_reqs": len(self._waiting),
            "num_paused_reqs": len(self._held),
            "paused": self._paused,
            "weight_version": self.weight_version,
            "max_batch_size": self.max_batch_size,
            "requests_done": s.requests_done,
            "requests_aborted": s.requests_aborted,
            "requests_failed": s.requests_failed,
            "bad_requests": s.bad_requests,
            "generated_tokens": s.generated_tokens,
            "prefill_tokens": rs.prefill_tokens,
            "prefill_rows": rs.prefill_rows,
            # prompt tokens a prefill did not run: the row was identical to another in its batch
            "prefill_tokens_saved": rs.prefill_tokens_saved,
            "cached_tokens": self.prefix_cache.hit_tokens if self.prefix_cache else 0,
            "decode_steps": rs.decode_steps,
            "prefill_batches": s.prefill_batches,
            "max_running_reqs": s.max_running,
            "weight_updates": s.weight_updates,
            "step_errors": s.step_errors,
            "forward_seconds": round(rs.forward_s, 6),
            "busy_seconds": round(self._busy_s, 6),
            "uptime_seconds": round(time.time() - s.started, 3),
        }

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox(block=not self._has_work())
            if not self._running and self._can_admit() and not self._jobs_ready():
                self._gather_burst()
            start = time.perf_counter()
            worked = False
            try:
                worked |= self._run_jobs()
                if self._can_admit():
                    self._admit()
                    worked = True
                if self._running and self._paused is None:
                    self._decode_step()
                    worked = True
            except Exception as exc:
                self.stats.step_errors += 1
                log.exception("engine step failed")
                self._fail_all_running(exc)
            if worked:
                self._busy_s += time.perf_counter() - start
        self._shutdown()

    def _has_work(self) -> bool:
        return bool(self._jobs_ready() or self._can_admit() or (self._running and self._paused is None))

    def _drain_inbox(self, *, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _gather_burst(self) -> None:
        """Before an idle engine's first prefill, take in the rest of a burst: requests that keep
        arriving less than ``admit_quiet_s`` apart, for at most ``admit_window_s``.

        An RL rollout sends its whole batch at once, but the requests reach this thread one by
        one; admitted as they came, each had a prefill of its own and the batch ran about twice
        the decode steps (32 rows of 24 tokens: 32 prefills and 54 steps instead of 1 and 24).
        A lone request pays ``admit_quiet_s`` once.
        """
        if self.admit_quiet_s <= 0 or self.admit_window_s <= 0:
            return
        deadline = time.perf_counter() + self.admit_window_s
        while len(self._waiting) < self.max_batch_size:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            try:
                item = self._inbox.get(timeout=min(self.admit_quiet_s, left))
            except queue.Empty:
                return
            self._handle(*item)
            if self._jobs_ready():
                return

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            seq: Sequence = payload
            if seq.rid in self._active:
                seq.deliver(ValueError(f"a request with rid {seq.rid!r} is already running"))
                return
            self._active[seq.rid] = seq
            self._waiting.append(seq)
        elif kind == "abort":
            rid, message = payload
            targets = list(self._active.values()) if rid is None else [s for s in (self._active.get(rid),) if s]
            self._abort(targets, message)
        elif kind == "job":
            self._jobs.append(payload)

    # -- jobs -----------------------------------------------------------------------------------
    def _jobs_ready(self) -> bool:
        if not self._jobs:
            return False
        job = self._jobs[0]
        return not job.quiet or job.abort_all or self._paused is not None or not self._running

    def _run_jobs(self) -> bool:
        ran = False
        while self._jobs_ready():
            job = self._jobs.popleft()
            if job.abort_all:
                self._abort(list(self._active.values()), "aborted for a weight update")
            try:
                job.future.set_result(job.fn())
            except Exception as exc:
                job.future.set_exception(exc)
            ran = True
        return ran

    # control jobs, run on the engine thread
    def pause(self, mode: PauseMode) -> int:
        """Pause generation (see module doc). Returns how many requests are held."""
        if mode == "abort":
            self._abort(list(self._active.values()), "aborted by pause_generation")
        elif mode == "retract":
            self._retract_running()
        self._paused = mode
        return len(self._running) + len(self._held)

    def resume(self) -> None:
        self._paused = None
        for seq in reversed(self._held):
            self._waiting.appendleft(seq)
        self._held.clear()

    def held_count(self) -> int:
        return len(self._running) + len(self._held) if self._paused else 0

    def flush_cache(self) -> bool:
        """Drop cached prefixes; refused (False) while requests run, like SGLang."""
        if self._running or self._waiting:
            return False
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        return True

    def after_weight_update(self, version: str | None) -> None:
        """Bump the version; cached prefixes were computed with the old weights, so drop them."""
        if version is not None:
            self.weight_version = version
        self.stats.weight_updates += 1
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # -- admission and prefill -------------------------------------------------------------------
    def _can_admit(self) -> bool:
        if self._paused is not None or not self._waiting or len(self._running) >= self.max_batch_size:
            return False
        return not any(j.quiet for j in self._jobs)  # drain before a pending weight update

    def _admit(self) -> None:
        """Prefill a batch of waiting requests and add them to the running batch.

        A request identical to one already in the batch (a GRPO group's samples) costs no
        prefill tokens: the runner computes it once (see model_runner's ``dedupe_key``). A request
        with a long cached prefix is prefilled on top of it, alone or with its identical twins.
        """
        room = self.max_batch_size - len(self._running)
        batch: list[Sequence] = []
        inputs: list[SeqInput] = []
        tokens = 0
        dedupe = self.runner.dedupe_prefill
        seen: set[Hashable] = set()
        while self._waiting and len(batch) < room:
            seq = self._waiting[0]
            if batch and inputs[0].past is not None and not (
                dedupe and seq.vision is None and not seq.wants_input_logprobs
                and seq.prompt_ids + seq.output_ids == inputs[0].input_ids
            ):
                break  # a cached-prefix request is prefilled on its own (or with its twins)
            inp = seq.prefill_input(self.prefix_cache)
            if inp.past is not None and (
                (inp.past_len < PREFIX_BATCH_MIN and (batch or len(self._waiting) > 1))
                or (dedupe and batch and inputs[0].past is None
                    and dedupe_key(dataclasses.replace(inp, past=None, past_len=0)) in seen)
            ):
                inp.past, inp.past_len = None, 0  # a batched prefill (or a twin already in it) beats a row of its own
            key = dedupe_key(inp) if dedupe else None
            shared = key is not None and key in seen
            cost = 0 if shared else len(inp.input_ids) - inp.past_len
            if batch and not shared and (
                tokens + cost > self.max_prefill_tokens or inp.past is not None or inputs[0].past is not None
            ):
                break
            self._waiting.popleft()
            batch.append(seq)
            inputs.append(inp)
            tokens += cost
            if key is not None:
                seen.add(key)
        try:
            out = self.runner.prefill(inputs)
        except Exception as exc:
            self.stats.step_errors += 1
            log.exception("prefill failed")
            for seq in batch:
                self._finish_error(seq, exc)
            return
        self.stats.prefill_batches += 1
        keep_rows: list[int] = []
        specs, gens, tops, sample_rows = [], [], [], []
        for i, (seq, inp) in enumerate(zip(batch, inputs, strict=True)):
            if not seq.prefilled_once:
                seq.cached_tokens = inp.past_len
            seq.next_pos = out.next_positions[i]
            seq.rope_delta = out.rope_deltas[i]
            prompt_logits = out.prompt_logits[i]
            if inp.want_prompt_logits and prompt_logits is not None:
                seq.input_logprobs = self._input_logprobs(seq, prompt_logits)
            seq.prefilled_once = True
            if seq.spec.max_new_tokens <= len(seq.output_ids):
                self._finish(seq, {"type": "length", "length": seq.spec.max_new_tokens})
                continue
            sample_rows.append(i)
            specs.append(seq.spec)
            gens.append(seq.generator)
            tops.append(seq.top_logprobs_num)
        if sample_rows:
            idx = torch.tensor(sample_rows)
            sampled = sample_next(out.last_logits.index_select(0, idx), specs, gens, tops, self.logprob_mode)
            for j, i in enumerate(sample_rows):
                seq = batch[i]
                if self._append(seq, sampled.tokens[j], sampled.logprobs[j], sampled.top_logprobs[j]):
                    self._finish(seq, seq.finish or {})
                else:
                    keep_rows.append(i)
        new_kv = out.kv.select(keep_rows) if len(keep_rows) != len(batch) else out.kv
        if new_kv is not None:
            self._running.extend(batch[i] for i in keep_rows)
            self._kv = new_kv if self._kv is None else BatchKV.concat([self._kv, new_kv])
        self.stats.max_running = max(self.stats.max_running, len(self._running))

    def _input_logprobs(self, seq: Sequence, logits: torch.Tensor) -> list[float | None]:
        """SGLang's input_token_logprobs: one per prompt token from ``logprob_start_len``, the
        first always None (SGLang computes each prompt token's logprob from the position before
        it, and drops the one at the start), so a caller who wants token ``i`` asks from ``i - 1``."""
        ids = seq.prompt_ids
        start = min(seq.logprob_start_len, len(ids))
        if start >= len(ids):
            return []
        values: list[float | None] = [None]
        seq.input_top = [None] if seq.top_logprobs_num > 0 else None
        lo = start + 1
        if lo < len(ids):
            rows = logits[lo - 1 : len(ids) - 1]
            values.extend(prompt_logprobs(rows, torch.tensor(ids[lo:]), seq.spec.temperature, self.logprob_mode))
            if seq.input_top is not None:
                seq.input_top.extend(
                    prompt_top_logprobs(rows, seq.top_logprobs_num, seq.spec.temperature, self.logprob_mode)
                )
        return values

    # -- decoding ------------------------------------------------------------------------------
    def _decode_step(self) -> None:
        assert self._kv is not None
        running = self._running
        logits = self.runner.decode(
            self._kv,
            [s.output_ids[-1] for s in running],
            [s.next_pos for s in running],
            [s.rope_delta for s in running],
        )
        for s in running:
            s.next_pos += 1
        sampled = sample_next(
            logits,
            [s.spec for s in running],
            [s.generator for s in running],
            [s.top_logprobs_num for s in running],
            self.logprob_mode,
        )
        keep: list[int] = []
        for i, seq in enumerate(running):
            if self._append(seq, sampled.tokens[i], sampled.logprobs[i], sampled.top_logprobs[i]):
                self._finish(seq, seq.finish or {})
            else:
                keep.append(i)
        if len(keep) != len(running):
            self._retire_rows(keep)

    def _retire_rows(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` of the running batch (finished ones leave, prefixes cached)."""
        assert self._kv is not None
        if self.prefix_cache is not None:
            kept = set(keep)
            for i, seq in enumerate(self._running):
                if i not in kept and seq.vision is None and seq.finish and seq.finish.get("type") != "abort":
                    self._offer_prefix(i, seq)
        self._running = [self._running[i] for i in keep]
        self._kv = self._kv.select(keep)

    def _offer_prefix(self, row: int, seq: Sequence) -> None:
        assert self._kv is not None and self.prefix_cache is not None
        ids = seq.prompt_ids + seq.output_ids[:-1]  # the last token was sampled, never fed
        layers = self._kv.extract_row(row)
        if layers and layers[0][0].shape[2] == len(ids):
            self.prefix_cache.insert(ids, layers)

    def _append(self, seq: Sequence, token: int, logprob: float, top: list[tuple[float, int]] | None) -> bool:
        """Record a sampled token; True when the request is finished (``seq.finish`` set)."""
        seq.output_ids.append(token)
        seq.output_logprobs.append(logprob)
        if seq.top_logprobs_num > 0:
            seq.output_top.append(top)
        seq.output_versions.append(self.weight_version)
        self.stats.generated_tokens += 1
        spec = seq.spec
        if len(seq.output_ids) >= spec.max_new_tokens:
            seq.finish = {"type": "length", "length": spec.max_new_tokens}
        elif token in spec.stop_token_ids or (not spec.ignore_eos and token in self.runner.eos_token_ids):
            seq.finish = {"type": "stop", "matched": token}
        elif spec.stop_strings and (matched := self._matched_stop(seq)) is not None:
            seq.finish = {"type": "stop", "matched": matched}
        elif seq.next_pos + 1 >= self.runner.max_context:
            seq.finish = {"type": "length", "length": len(seq.output_ids)}
        return seq.finish is not None

    def _matched_stop(self, seq: Sequence) -> str | None:
        window = max(len(s) for s in seq.spec.stop_strings) + 4
        tail = self.runner.tokenizer.decode(seq.output_ids[-window:], skip_special_tokens=seq.spec.skip_special_tokens)
        for stop in seq.spec.stop_strings:
            if stop in tail:
                return stop
        return None

    # -- finishing -----------------------------------------------------------------------------
    def _abort(self, seqs: list[Sequence], message: str) -> None:
        if not seqs:
            return
        doomed = set(map(id, seqs))
        self._waiting = deque(s for s in self._waiting if id(s) not in doomed)
        self._held = [s for s in self._held if id(s) not in doomed]
        keep = [i for i, s in enumerate(self._running) if id(s) not in doomed]
        if len(keep) != len(self._running):
            self._running = [self._running[i] for i in keep]
            self._kv = self._kv.select(keep) if self._kv is not None else None
        for seq in seqs:
            self.stats.requests_aborted += 1
            self._finish(seq, {"type": "abort", "message": message})

    def _retract_running(self) -> None:
        for seq in self._running:
            seq.retractions += 1
        self._held.extend(self._running)
        self._running = []
        self._kv = None

    def _fail_all_running(self, exc: BaseException) -> None:
        seqs, self._running, self._kv = self._running, [], None
        for seq in seqs:
            self._finish_error(seq, exc)

    def _finish_error(self, seq: Sequence, exc: BaseException) -> None:
        self.stats.requests_failed += 1
        self._active.pop(seq.rid, None)
        seq.deliver(RuntimeError(f"engine error while serving {seq.rid}: {type(exc).__name__}: {exc}"))

    def _finish(self, seq: Sequence, finish: dict[str, Any]) -> None:
        seq.finish = finish
        self._active.pop(seq.rid, None)
        self.stats.requests_done += 1
        try:
            seq.deliver(self._result(seq))
        except Exception:
            log.exception("delivering %s failed", seq.rid)

    def _result(self, seq: Sequence) -> dict[str, Any]:
        spec = seq.spec
        tok = self.runner.tokenizer
        text = tok.decode(seq.output_ids, skip_special_tokens=spec.skip_special_tokens)
        finish = dict(seq.finish or {})
        matched = finish.get("matched")
        if isinstance(matched, str) and not spec.no_stop_trim and matched in text:
            text = text[: text.index(matched)]
        meta: dict[str, Any] = {
            "id": seq.rid,
            "finish_reason": finish,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": len(seq.output_ids),
            "cached_tokens": seq.cached_tokens,
            "reasoning_tokens": 0,  # SGLang counts them only with a reasoning parser; we run none
            "num_retractions": seq.retractions,
            "weight_version": self.weight_version,
            # SGLang's spans over output_ids: a request paused in place can span an update
            "weight_versions": weight_version_spans(seq.output_versions, self.weight_version),
            "e2e_latency": round(time.perf_counter() - seq.created, 6),
        }
        if seq.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(seq.output_logprobs, seq.output_ids, strict=True)
            ]
            meta["output_token_logprobs_length"] = len(seq.output_ids)
            # SGLang: from logprob_start_len (-1: from the end of the prompt, i.e. none)
            start = seq.logprob_start_len if seq.logprob_start_len >= 0 else len(seq.prompt_ids)
            meta["input_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(seq.input_logprobs or [], seq.prompt_ids[start:], strict=False)
            ]
            top = seq.top_logprobs_num > 0
            meta["output_top_logprobs"] = (
                [[[lp, t, None] for lp, t in (entry or [])] for entry in seq.output_top] if top else []
            )
            meta["input_top_logprobs"] = (
                [None if entry is None else [[lp, t, None] for lp, t in entry] for entry in seq.input_top or []]
                if top else []
            )
        return {"text": text, "output_ids": list(seq.output_ids), "meta_info": meta}

    def _shutdown(self) -> None:
        for seq in list(self._active.values()):
            self._finish(seq, {"type": "abort", "message": "engine shutting down"})
        self._waiting.clear()
        self._running.clear()
        self._held.clear()
        self._kv = None
        while self._jobs:
            job = self._jobs.popleft()
            job.future.set_exception(RuntimeError("engine shut down"))


def make_sequence(
    engine: EngineCore,
    *,
    rid: str,
    prompt_ids: list[int],
    spec: SamplingSpec,
    deliver: Deliver,
    vision: VisionInputs | None = None,
    seed: int | None = None,
    return_logprob: bool = False,
    logprob_start_len: int = -1,
    top_logprobs_num: int = 0,
) -> Sequence:
    """A :class:`Sequence` with its own generator (``seed`` or the engine's next seed)."""
    return Sequence(
        rid=rid,
        prompt_ids=prompt_ids,
        spec=spec,
        deliver=deliver,
        vision=vision,
        generator=make_generator(engine.next_seed() if seed is None else seed),
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
    )


__all__ = ["EngineCore", "EngineStats", "PauseMode", "Sequence", "make_sequence"]
