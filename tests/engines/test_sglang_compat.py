"""Our rollout path against the real ``sglang`` package (0.5.23), on CPU.

Runs when sglang can be found (``tests/sglang_real.py`` says how to install it; skipped with the
reason otherwise). What is checked, each against SGLang's own code:

* every ``/generate``, abort and weight-update payload our client sends passes SGLang's wire
  contract (``sglang/api/v1/api_types.py``, what the server applies to every body);
* every reply of the embedded engine (and the info routes) parses under the real response
  types, with the keys SGLang sends; SGLang-shaped replies go through our client correctly;
* every command line our launcher builds is accepted by SGLang's own argument parser;
* our trainer-side weight-update group meets SGLang's ``init_custom_process_group`` over gloo,
  for an engine with TP = 1 and one with TP = 2, and a broadcast of real tensors arrives;
* with a full install (``RELAX_GYM_SGLANG_PYTHON``), the same payloads through SGLang's pydantic
  request classes (``io_struct``, the OpenAI protocol models).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from relax_gym.protocol import (
    AbortRequest,
    ChatCompletionRequest,
    ChatCompletionResponse,
    EngineClient,
    GenerateRequest,
    GenerateResponse,
    InitWeightsUpdateGroupRequest,
    PauseGenerationRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
)
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.engines.sglang_launcher import SGLangOptions, build_command
from relax_gym.trainer.engines.weight_receiver import broadcast, dtype_name, new_process_group
from relax_gym.trainer.weights.broadcast import free_port

from .. import sglang_real
from .conftest import API_KEY, image_b64, random_image

REASON = sglang_real.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

IMAGE = "data:image/png;base64," + image_b64(random_image(0)) if REASON is None else ""


# ------------------------------------------------------------------------------------------------
# what our client sends
# ------------------------------------------------------------------------------------------------
def generate_payloads() -> dict[str, GenerateRequest]:
    """The /generate bodies our code paths build (rollout, teacher, GenRM, eval agent, health)."""
    rollout = SamplingParams(max_new_tokens=64, temperature=1.0, top_p=0.95, top_k=20, min_p=0.0,
                             stop_token_ids=[151645, 151643], skip_special_tokens=False, sampling_seed=7)
    return {
        "rollout": GenerateRequest(input_ids=[1, 2, 3], sampling_params=rollout, return_logprob=True, rid="ep:0"),
        "rollout_image": GenerateRequest(input_ids=[1, 2, 3], image_data=[IMAGE], sampling_params=rollout,
                                         return_logprob=True, rid="ep:1"),
        "teacher": GenerateRequest(input_ids=[1, 2, 3, 4], image_data=[IMAGE],
                                   sampling_params=SamplingParams(max_new_tokens=0, temperature=1.0),
                                   return_logprob=True, logprob_start_len=2),
        "scoring_text": GenerateRequest(text="Hello", sampling_params=SamplingParams(max_new_tokens=0),
                                        return_logprob=True, logprob_start_len=0, top_logprobs_num=3,
                                        return_text_in_logprobs=True),
        "audio_video": GenerateRequest(input_ids=[5, 6], audio_data=["data:audio/wav;base64,UklGRg=="],
                                       video_data=["/tmp/clip.mp4"],
                                       sampling_params=SamplingParams(max_new_tokens=8, stop=["</answer>"],
                                                                      ignore_eos=False, no_stop_trim=True)),
        "greedy": GenerateRequest(input_ids=[0], sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0)),
        # the media payloads our codec really builds (a 4-frame clip as mp4, a tone as float32 WAV)
        "rollout_video": GenerateRequest(input_ids=[1, 2, 3], video_data=[_clip_payload()], sampling_params=rollout,
                                         return_logprob=True, rid="ep:2"),
        "rollout_audio": GenerateRequest(input_ids=[1, 2, 3], audio_data=[_tone_payload()], sampling_params=rollout,
                                         return_logprob=True, rid="ep:3"),
    }


def _clip_payload() -> str:
    import numpy as np
    from relax_gym.video import video_payload

    frames = np.zeros((4, 32, 32, 3), dtype=np.uint8)
    frames[:, 8:24, 8:24, 0] = 200
    return video_payload(frames, 2.0)


def _tone_payload() -> str:
    import numpy as np
    from relax_gym.audio import audio_payload

    return audio_payload(np.sin(np.linspace(0, 440 * 2 * np.pi, 16000)).astype(np.float32) * 0.3)


def wire(model: Any) -> dict[str, Any]:
    """The JSON our client puts on the wire for ``model``."""
    return json.loads(model.model_dump_json(exclude_none=True))


def control_payloads() -> dict[str, tuple[str, dict[str, Any]]]:
    """Control bodies: (SGLang io_struct class, body)."""
    return {
        "abort_one": ("AbortReq", wire(AbortRequest(rid="ep:0"))),
        "abort_all": ("AbortReq", wire(AbortRequest(abort_all=True))),
        "pause": ("PauseGenerationReqInput", wire(PauseGenerationRequest(mode="in_place"))),
        "continue": ("ContinueGenerationReqInput", {}),
        "disk": ("UpdateWeightFromDiskReqInput",
                 wire(UpdateWeightsFromDiskRequest(model_path="/ckpt/v3", weight_version="3"))),
        "init_group": ("InitWeightsUpdateGroupReqInput", wire(InitWeightsUpdateGroupRequest(
            master_address="127.0.0.1", master_port=29600, rank_offset=1, world_size=3,
            group_name="relax_weights_0_29600", backend="nccl"))),
        "distributed": ("UpdateWeightsFromDistributedReqInput", wire(UpdateWeightsFromDistributedRequest(
            names=["model.embed_tokens.weight"], dtypes=["bfloat16"], shapes=[[10, 4]],
            group_name="relax_weights_0_29600", weight_version="3"))),
        "destroy_group": ("DestroyWeightsUpdateGroupReqInput", {"group_name": "relax_weights_0_29600"}),
    }


def chat_payloads() -> dict[str, dict[str, Any]]:
    tools = [{"type": "function", "function": {"name": "add", "description": "add two ints",
                                               "parameters": {"type": "object", "properties": {
                                                   "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    return {
        "plain": wire(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                            temperature=0.7)),
        "image_tools_logprobs": wire(ChatCompletionRequest(
            messages=[{"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                   {"type": "image_url", "image_url": {"url": IMAGE}}]}],
            tools=tools, tool_choice="auto", logprobs=True, top_logprobs=2, seed=3)),
    }


def test_generate_payloads_pass_the_wire_contract() -> None:
    api = sglang_real.api_types()
    for name, req in generate_payloads().items():
        parsed = api.GenerateRequest.from_json_value(wire(req))
        assert parsed.sampling_params is not None, name
    for name in ("abort_one", "abort_all"):
        api.AbortRequest.from_json_value(control_payloads()[name][1])


def test_the_contract_refuses_what_it_should() -> None:
    """The check can fail: an unknown sampling key is a 400 in SGLang."""
    api = sglang_real.api_types()
    body = wire(generate_payloads()["rollout"])
    body["sampling_params"]["not_a_param"] = 1
    with pytest.raises(api.JsonContractError, match="not_a_param"):
        api.GenerateRequest.from_json_value(body)


# ------------------------------------------------------------------------------------------------
# what the embedded engine answers, and what real SGLang answers
# ------------------------------------------------------------------------------------------------
#: the meta_info keys SGLang 0.5.23 puts on every finished /generate reply (tokenizer_manager)
SGLANG_META_KEYS = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                    "reasoning_tokens", "weight_version", "weight_versions", "num_retractions", "e2e_latency"}
#: and with return_logprob
SGLANG_LOGPROB_KEYS = {"output_token_logprobs", "input_token_logprobs", "output_top_logprobs",
                       "input_top_logprobs", "output_token_logprobs_length"}


async def _embedded_replies(url: str) -> dict[str, dict[str, Any]]:
    bodies = {
        "plain": {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}},
        "logprobs": {"input_ids": [5, 6, 7, 8], "return_logprob": True, "top_logprobs_num": 2,
                     "logprob_start_len": 1, "return_text_in_logprobs": True,
                     "sampling_params": {"max_new_tokens": 5, "top_p": None, "logit_bias": {}}},
        "score": {"input_ids": [5, 6, 7, 8], "return_logprob": True, "logprob_start_len": 0,
                  "sampling_params": {"max_new_tokens": 0}},
    }
    out: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for name, body in bodies.items():
            resp = await http.post("/generate", json=body)
            assert resp.status_code == 200, resp.text
            out[name] = resp.json()
        for route in ("/model_info", "/server_info"):
            out[route] = (await http.get(route)).json()
    return out


def test_embedded_replies_parse_under_the_real_types(text_engine: EmbeddedEngineProcess) -> None:
    api = sglang_real.api_types()
    replies = asyncio.run(_embedded_replies(text_engine.url))
    for name in ("plain", "logprobs", "score"):
        reply = replies[name]
        parsed = api.GenerateResponse.from_json_value(reply)
        meta = reply["meta_info"]
        assert SGLANG_META_KEYS <= set(meta), f"{name}: missing {SGLANG_META_KEYS - set(meta)}"
        if name != "plain":
            assert SGLANG_LOGPROB_KEYS <= set(meta), f"{name}: missing {SGLANG_LOGPROB_KEYS - set(meta)}"
        spans = [(s.version, s.start, s.end) for s in parsed.meta_info.weight_versions]
        assert spans[-1][2] == len(reply["output_ids"]) and spans[0][1] == 0
    logprobs = replies["logprobs"]["meta_info"]
    assert logprobs["input_token_logprobs"][0][0] is None and len(logprobs["input_token_logprobs"]) == 3
    assert all(isinstance(t[2], str) for t in logprobs["output_token_logprobs"])
    api.GetModelInfoResponse.from_json_value(replies["/model_info"])
    info = api.GetServerInfoResponse.from_json_value(replies["/server_info"])
    assert info.model_path and replies["/server_info"]["tp_size"] == 1


#: reply shapes as SGLang 0.5.23 builds them (tokenizer_manager.py; spans from
#: utils/weight_versions.py): a request paused in place across an update from "1" to "2"
REAL_REPLY = {
    "text": "abc",
    "output_ids": [11, 12, 13],
    "meta_info": {
        "id": "ep:0", "finish_reason": {"type": "length", "length": 3}, "prompt_tokens": 4,
        "weight_version": "2", "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": 3,
        "cached_tokens": 0, "e2e_latency": 0.5,
        "weight_versions": [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 3}],
        "input_token_logprobs": [[None, 4, None]],
        "output_token_logprobs": [[-0.5, 11, None], [-1.0, 12, None], [-0.25, 13, None]],
        "input_top_logprobs": [None], "output_top_logprobs": [None, None, None],
        "output_token_logprobs_length": 3,
    },
}


def test_real_reply_shapes_through_our_client() -> None:
    from relax_gym.trainer.rollout.episode import _token_versions

    api = sglang_real.api_types()
    api.GenerateResponse.from_json_value(REAL_REPLY)  # the shape is SGLang's own
    ours = GenerateResponse.model_validate(REAL_REPLY)
    assert ours.token_ids() == [11, 12, 13] and ours.token_logprobs() == [-0.5, -1.0, -0.25]
    assert _token_versions(ours, 3) == [1, 1, 2]  # not [2, 2, 2]


async def _teacher_against_sglang_shapes() -> torch.Tensor:
    """Our teacher path against a stand-in that scores like SGLang (leading None from any start)."""
    from aiohttp import web

    from relax_gym.trainer.rollout import Trajectory
    from relax_gym.trainer.rollout.teacher import teacher_logprobs

    seen: list[dict[str, Any]] = []

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        ids, start = body["input_ids"], body["logprob_start_len"]
        triples = [[None if k == start else -0.1 * k, ids[k], None] for k in range(start, len(ids))]
        return web.json_response({"text": "", "output_ids": [], "meta_info": {
            "id": "t", "finish_reason": {"type": "length", "length": 0}, "prompt_tokens": len(ids),
            "completion_tokens": 0, "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": 0}],
            "input_token_logprobs": triples, "output_token_logprobs": []}})

    app = web.Application()
    app.add_routes([web.post("/generate", generate)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        traj = Trajectory(token_ids=[1, 2, 3, 4, 5], loss_mask=[0, 0, 1, 1, 1], rollout_logprobs=[0.0] * 5,
                          weight_versions=[0] * 5, prompt_length=2)
        async with EngineClient(f"http://127.0.0.1:{port}") as client:
            (out,) = await teacher_logprobs(client, [traj])
    finally:
        await runner.cleanup()
    api = sglang_real.api_types()
    for body in seen:
        api.GenerateRequest.from_json_value(body)
    return out


def test_teacher_logprobs_align_with_sglang_scoring() -> None:
    out = asyncio.run(_teacher_against_sglang_shapes())
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.2, -0.3, -0.4])


# ------------------------------------------------------------------------------------------------
# the launcher against SGLang's own parser
# ------------------------------------------------------------------------------------------------
LAUNCHES = [
    SGLangOptions(model="/models/qwen3-8b"),
    SGLangOptions(model="/models/qwen3-8b", port=30001, tp=2, mem_fraction_static=0.7, api_key="k",
                  weight_version="0", served_model_name="policy"),
    SGLangOptions(model="/models/qwen3-vl", extra_args=["--context-length", "8192", "--enable-metrics"]),
]


def test_launcher_commands_pass_sglang_parser() -> None:
    server_args = sglang_real.submodule("srt.server_args")
    if server_args is None:
        pytest.skip("sglang.srt.server_args does not import here (needs torch, orjson, pybase64, pyzmq, triton)")
    for opts in LAUNCHES:
        argv = build_command(opts)[3:]  # after `python -m sglang.launch_server`
        args = server_args.prepare_server_args(argv)
        assert args.model_path == opts.model and args.tp_size == opts.tp and args.port == opts.port
    with pytest.raises(SystemExit):
        server_args.prepare_server_args(["--model-path", "m", "--no-such-flag"])


# ------------------------------------------------------------------------------------------------
# the weight-update group against SGLang's init_custom_process_group
# ------------------------------------------------------------------------------------------------
ENGINE_RANK = textwrap.dedent("""
    import datetime as dt, os, sys, types, importlib.util, torch, torch.distributed as dist
    extra = os.environ.get("RELAX_GYM_SGLANG_PATH")
    if extra:
        sys.path.append(extra)
    spec = importlib.util.find_spec("sglang")
    pkg = types.ModuleType("sglang"); pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["sglang"] = pkg
    from sglang.srt.utils.common import init_custom_process_group
    port, rank_offset, tp_rank, world, name = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                               int(sys.argv[4]), sys.argv[5])
    # as SGLang's WeightUpdater.init_weights_update_group: rank = rank_offset + tp_rank
    pg = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world,
                                   rank=rank_offset + tp_rank, group_name=name,
                                   timeout=dt.timedelta(seconds=60))
    shapes = [tuple(s) for s in eval(sys.argv[6])]
    dtypes = sys.argv[7].split(",")
    got = [torch.empty(s, dtype=getattr(torch, d)) for s, d in zip(shapes, dtypes)]
    works = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in got]
    for w in works:
        w.wait()
    print(repr([t.float().tolist() for t in got]), flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_weight_group_meets_sglang_engine_ranks(tp: int) -> None:
    """Two engines: one of TP=1 (rank 1) and one of TP=``tp`` (ranks 2..): our rank 0 meets them."""
    if sglang_real.submodule("srt.utils.common") is None:
        pytest.skip("sglang.srt.utils.common does not import here (needs orjson, pybase64, pyzmq, triton)")
    import os

    sent = [torch.randn(4, 3), torch.arange(5).to(torch.bfloat16)]
    port, name = free_port(), f"relax_weights_{uuid.uuid4().hex[:6]}_{tp}"
    engines = [1, tp]  # TP size of each engine, in rank order
    world = 1 + sum(engines)
    env = {**os.environ, "RELAX_GYM_SGLANG_PATH": str(sglang_real.sglang_dir().parent)}  # type: ignore[union-attr]
    procs, offset = [], 1
    for size in engines:
        for tp_rank in range(size):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", ENGINE_RANK, str(port), str(offset), str(tp_rank), str(world), name,
                 repr([list(t.shape) for t in sent]), ",".join(dtype_name(t.dtype) for t in sent)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        offset += size
    try:
        start = time.monotonic()
        handle = new_process_group("127.0.0.1", port, 0, world, group_name=name, timeout_s=90)
        broadcast(handle, sent, 0)
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err[-3000:]
            assert out.strip() == repr([t.float().tolist() for t in sent])
        assert time.monotonic() - start < 120
    finally:
        for p in procs:
            p.kill()


# ------------------------------------------------------------------------------------------------
# the full install: SGLang's pydantic request classes, in its own interpreter
# ------------------------------------------------------------------------------------------------
FULL_CHECK = textwrap.dedent("""
    import json, sys
    from pydantic import TypeAdapter
    from sglang.srt.managers import io_struct
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    payloads = json.load(open(sys.argv[1]))
    bad = []
    for name, body in payloads["generate"].items():
        try:
            req = TypeAdapter(io_struct.GenerateReqInput).validate_python(body)
            req.normalize_batch_and_arguments()
        except Exception as exc:
            bad.append(f"generate/{name}: {type(exc).__name__}: {str(exc)[:300]}")
    for name, (cls, body) in payloads["control"].items():
        try:
            TypeAdapter(getattr(io_struct, cls)).validate_python(body)
        except Exception as exc:
            bad.append(f"{cls}/{name}: {type(exc).__name__}: {str(exc)[:300]}")
    for name, body in payloads["chat"].items():
        try:
            ChatCompletionRequest.model_validate(body)
        except Exception as exc:
            bad.append(f"chat/{name}: {type(exc).__name__}: {str(exc)[:300]}")
    print(json.dumps(bad))
""")


@pytest.mark.slow
def test_payloads_pass_sglang_request_classes(tmp_path: Path) -> None:
    python = sglang_real.full_python()
    if python is None:
        pytest.skip("no full sglang install: set RELAX_GYM_SGLANG_PYTHON to the python of a venv with "
                    "`pip install sglang==0.5.23` (11 GB; it pins torch 2.14.1)")
    payloads = {"generate": {k: wire(v) for k, v in generate_payloads().items()},
                "control": control_payloads(), "chat": chat_payloads()}
    path = tmp_path / "payloads.json"
    path.write_text(json.dumps(payloads))
    done = subprocess.run([python, "-c", FULL_CHECK, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_chat_reply_parses_as_ours(text_engine: EmbeddedEngineProcess) -> None:
    """The embedded chat reply: every logprob entry has top_logprobs, metadata has the spans."""
    body = chat_payloads()["plain"] | {"logprobs": True, "top_logprobs": 0}
    resp = httpx.post(f"{text_engine.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"})
    assert resp.status_code == 200, resp.text
    data = resp.json()
    ChatCompletionResponse.model_validate(data)
    entries = data["choices"][0]["logprobs"]["content"]
    assert entries and all(e["top_logprobs"] == [] for e in entries)
    assert data["metadata"]["weight_versions"][0]["start"] == 0


@pytest.mark.slow
def test_preflight_runs_sglang_parser_before_a_launch() -> None:
    """What `engine.kind: sglang` runs before any server starts: version and flags, one line."""
    from relax_gym.trainer.engines.launch import ServerStartError
    from relax_gym.trainer.engines.sglang_launcher import preflight

    env = {"PYTHONPATH": str(sglang_real.sglang_dir().parent)}  # type: ignore[union-attr]
    assert preflight(SGLangOptions(model="/m", tp=2, env=env), need_gpu=False) >= "0.5.23"
    with pytest.raises(ServerStartError, match="rejects the launch flags.*--no-such-flag") as info:
        preflight(SGLangOptions(model="/m", extra_args=["--no-such-flag"], env=env), need_gpu=False)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------
# the table in docs/engine.md, generated from what these tests see
# ------------------------------------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
BEGIN, END = "<!-- sglang-table:begin -->", "<!-- sglang-table:end -->"
ROUTES = ["/generate", "/model_info", "/server_info", "/get_model_info", "/get_server_info", "/health",
          "/health_generate", "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model:path}",
          "/abort_request", "/pause_generation", "/continue_generation", "/flush_cache",
          "/update_weights_from_disk", "/update_weights_from_tensor", "/init_weights_update_group",
          "/update_weights_from_distributed", "/destroy_weights_update_group", "/update_weight_version",
          "/get_load", "/get_weight_version"]


def protocol_table(embedded_meta: set[str], embedded_routes: set[str]) -> str:
    """Markdown: route or meta_info field | real SGLang 0.5.23 | embedded engine | client reads it."""
    import inspect

    import relax_gym.protocol as protocol
    from relax_gym.protocol import MetaInfo

    api = sglang_real.api_types()
    server_src = (sglang_real.sglang_dir() / "srt" / "entrypoints" / "http_server.py").read_text()  # type: ignore[operator]
    client_src = inspect.getsource(protocol.EngineClient)
    real_meta = set(api.GenerateMetaInfo.__struct_fields__) | {"num_retractions", "e2e_latency"}
    yes = {True: "yes", False: "no"}
    rows = ["| route / `meta_info` field | real SGLang 0.5.23 | embedded engine | client reads it |",
            "| --- | --- | --- | --- |"]
    for route in ROUTES:
        real = f'"{route}"' in server_src
        rows.append(f"| `{route}` | {yes[real]} | {yes[route in embedded_routes]} | "
                    f"{yes[f'{chr(34)}{route}{chr(34)}' in client_src]} |")
    for key in sorted(real_meta | embedded_meta):
        rows.append(f"| `meta_info.{key}` | {yes[key in real_meta]} | {yes[key in embedded_meta]} | "
                    f"{yes[key in MetaInfo.model_fields]} |")
    return "\n".join(rows)


def test_protocol_table_in_docs_is_current(text_engine: EmbeddedEngineProcess) -> None:
    """docs/engine.md carries this table; RELAX_GYM_WRITE_TABLE=1 rewrites it."""
    import os

    replies = asyncio.run(_embedded_replies(text_engine.url))
    meta = set(replies["plain"]["meta_info"]) | set(replies["logprobs"]["meta_info"])
    table = protocol_table(meta, embedded_route_paths())
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if os.environ.get("RELAX_GYM_WRITE_TABLE") == "1":
        DOC.write_text(text[:start] + "\n" + table + "\n" + text[end:])
        return
    assert text[start:end].strip() == table, "docs/engine.md's table is stale: rerun with RELAX_GYM_WRITE_TABLE=1"


def embedded_route_paths() -> set[str]:
    """The embedded engine's routes, from its own route table (no engine needed)."""
    import inspect

    from relax_gym.trainer.engines import server

    src = inspect.getsource(server._route_table)
    found = {line.split('"')[1] for line in src.splitlines() if line.strip().startswith('("/')}
    found |= {server.WEIGHT_TENSOR_ROUTE} if hasattr(server, "WEIGHT_TENSOR_ROUTE") else set()
    return found | {"/health"}
