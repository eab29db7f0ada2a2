"""``relax-gym envs export``: write an env's tasks, with their media, as a Parquet dataset.

::

    relax-gym envs export relax/SceneQuery-v0 --episodes 512 --out scenes.parquet -k difficulty=single

Each episode (seeds ``seed .. seed + episodes - 1``) becomes one row:

* ``prompt`` -- the opening messages as ``[{role, content: [{type, text}]}]``, with
  ``{"type": "image"|"audio"|"video"}`` placeholders where the media sat;
* ``images`` / ``audio`` / ``video`` -- the media, as Hugging Face ``Image`` / ``Audio`` /
  ``Video`` features (PNG, WAV and mp4 bytes);
* ``answer`` -- the task's canonical answer, ``oracle`` -- the oracle's reply, ``oracle_success``;
* ``env_id``, ``seed``, ``env_kwargs`` -- where the row came from.

Beside ``OUT.parquet`` goes ``OUT.yaml``: the dataset-env keywords that read it back
(``relax-gym eval --env relax/Dataset-v0 -k relax/Dataset-v0:config=OUT.yaml``). Only one-turn
envs can be exported: a multi-turn env's later observations depend on the model's moves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from relax_gym.answers import last_boxed
from relax_gym.errors import RelaxGymError
from relax_gym.media import encode_audio, encode_image, encode_video
from relax_gym.types import AudioPart, ImagePart, Message, TextPart, VideoPart


class ExportError(RelaxGymError, ValueError):
    """The env cannot be exported as asked."""


def _message_row(msg: Message, media: dict[str, list[dict[str, Any]]], stem: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for part in msg.content:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            n = len(media["images"])
            media["images"].append({"bytes": encode_image(part.image), "path": f"{stem}-image{n}.png"})
            content.append({"type": "image", "text": None})
        elif isinstance(part, AudioPart):
            n = len(media["audio"])
            media["audio"].append({"bytes": encode_audio(part.waveform, part.sample_rate),
                                   "path": f"{stem}-audio{n}.wav"})
            content.append({"type": "audio", "text": None})
        elif isinstance(part, VideoPart):
            n = len(media["video"])
            media["video"].append({"bytes": encode_video(part.frames, part.fps), "path": f"{stem}-video{n}.mp4",
                                   "fps": float(part.fps), "frames": part.num_frames})
            content.append({"type": "video", "text": None})
    return {"role": msg.role, "content": content}


def export_env(env_id: str, episodes: int, out: str | Path, *, seed: int = 0,
               kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``episodes`` tasks of ``env_id`` to ``out`` (.parquet) and the reading config beside it."""
    import relax_gym
    from relax_gym.envs.dataset_source import _datasets

    out = Path(out)
    if out.suffix.lower() != ".parquet":
        raise ExportError(f"--out {str(out)!r}: give a .parquet file")
    if episodes < 1:
        raise ExportError("--episodes must be at least 1")
    kwargs = dict(kwargs or {})
    env = relax_gym.make(env_id, **kwargs)
    if env.max_turns != 1 or "tools" in env.tags:
        raise ExportError(
            f"{env_id} is a multi-turn env (max_turns={env.max_turns}); only one-turn envs can be exported, "
            "since later observations depend on the model's moves"
        )
    if not env.has_oracle:
        raise ExportError(f"{env_id} has no oracle, so its answers cannot be exported")
    rows: list[dict[str, Any]] = []
    successes = 0
    stem_id = env_id.replace("/", "_")
    for i in range(episodes):
        s = seed + i
        obs, _ = env.reset(seed=s)
        media: dict[str, list[dict[str, Any]]] = {"images": [], "audio": [], "video": []}
        prompt = [_message_row(m, media, f"{stem_id}-{s}") for m in obs.messages]
        task = getattr(env.unwrapped, "task", None)
        answer = getattr(task, "answer", None)
        reply = next(iter(env.oracle()))
        reply_text = reply if isinstance(reply, str) else reply.text
        if answer is None:  # an env without a canonical answer: the oracle's boxed reply is one
            answer = last_boxed(reply_text)
        _, _, _, _, info = env.step(reply_text)
        ok = bool(info.get("success"))
        successes += ok
        rows.append({
            "prompt": prompt, "images": media["images"], "audio": [{"bytes": a["bytes"], "path": a["path"]}
                                                                   for a in media["audio"]],
            "video": [{"bytes": v["bytes"], "path": v["path"]} for v in media["video"]],
            "answer": None if answer is None else str(answer), "oracle": reply_text, "oracle_success": ok,
            "env_id": env_id, "seed": s, "env_kwargs": json.dumps(kwargs, sort_keys=True),
            "_video_meta": media["video"],
        })
    env.close()
    video_meta = [v for r in rows for v in r.pop("_video_meta")]
    datasets = _datasets()
    has = {k: any(r[k] for r in rows) for k in ("images", "audio", "video")}
    features: dict[str, Any] = {
        "prompt": datasets.List({"role": datasets.Value("string"),
                                 "content": datasets.List({"type": datasets.Value("string"),
                                                           "text": datasets.Value("string")})}),
        "answer": datasets.Value("string"), "oracle": datasets.Value("string"),
        "oracle_success": datasets.Value("bool"), "env_id": datasets.Value("string"),
        "seed": datasets.Value("int64"), "env_kwargs": datasets.Value("string"),
    }
    media_features = {"images": datasets.Image(), "audio": datasets.Audio(decode=False),
                      "video": datasets.Video(decode=False)}
    stored = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    for key in media_features:
        if has[key]:
            features[key] = datasets.List(stored)
        else:
            for r in rows:
                r.pop(key)
    ds = datasets.Dataset.from_list(rows, features=datasets.Features(features))
    for key, feat in media_features.items():
        if has[key]:  # a cast of the stored bytes: no encoder runs (datasets' Audio encoder needs torchcodec)
            ds = ds.cast_column(key, datasets.List(feat))
    out.parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(out))
    config: dict[str, Any] = {"path": out.name, "prompt": "prompt", "answer": "answer", "oracle_column": "oracle",
                              "reward": "normalized_match"}
    for key, column in (("images", "image"), ("audio", "audio"), ("video", "video")):
        if has[key]:
            config[column] = key
    if video_meta:
        config["video_fps"] = max(v["fps"] for v in video_meta)
        config["video_max_frames"] = max(v["frames"] for v in video_meta)
    config_path = out.with_suffix(".yaml")
    header = (f"# relax-gym dataset-env config for {out.name}: {episodes} tasks of {env_id} "
              f"(seeds {seed}..{seed + episodes - 1}, kwargs {json.dumps(kwargs, sort_keys=True)}).\n"
              f"# relax-gym eval --env relax/Dataset-v0 -k relax/Dataset-v0:config={config_path} --agent oracle ...\n")
    config_path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return {"out": str(out), "config": str(config_path), "rows": len(rows), "oracle_success": successes / len(rows)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="a registered one-turn env, e.g. relax/SceneQuery-v0")
    parser.add_argument("--episodes", type=int, required=True, help="how many tasks (seeds) to write")
    parser.add_argument("--out", required=True, help="the .parquet file to write (OUT.yaml goes beside it)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("-k", "--kwarg", action="append", metavar="KEY=VALUE", help="an env constructor kwarg")


def run(args: argparse.Namespace) -> int:
    from relax_gym.cli.common import fail, parse_kwargs

    try:
        result = export_env(args.env_id, args.episodes, args.out, seed=args.seed, kwargs=parse_kwargs(args.kwarg))
    except (RelaxGymError, ValueError, OSError) as exc:
        return fail(str(exc), 2)
    print(f"wrote {result['rows']} rows to {result['out']} (oracle success {result['oracle_success']:.3f}); "
          f"read it back with config {result['config']}")
    return 0
