"""What runs inside each Ray actor of the Ray runtime (see ``ray_runtime``).

Kept free of heavy imports at module level: Ray imports this module in every actor process, and
a reward worker that restarts after a crash should be back in seconds, without loading torch.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from relax_gym.trainer.modes.roles import call_method  # stdlib imports only


def import_modules(names: list[str]) -> None:
    for name in names:
        importlib.import_module(name)


# ------------------------------------------------------------------------------------------------
# what runs inside each actor
# ------------------------------------------------------------------------------------------------
class EngineHost:
    """An engine served by this actor's process tree, on the node's address: an embedded engine,
    or (``sglang`` given: the ``engine.sglang`` section) an SGLang server on the GPUs Ray gave
    this actor (Ray sets ``CUDA_VISIBLE_DEVICES`` for it; the actor reserves ``tp`` GPUs)."""

    def __init__(self, model_path: str, api_key: str, *, seed: int, max_batch_size: int, threads: int | None,
                 log_file: str, startup_timeout_s: float, local: bool, sglang: dict[str, Any] | None = None) -> None:
        import ray

        # Ray registers even a local node under the machine's address (it resolves 127.0.0.1
        # away), so "local" comes from the runtime: a cluster it started itself
        self.node_ip = "127.0.0.1" if local else ray.util.get_node_ip_address()
        if sglang is not None:
            self.proc: Any = _start_sglang(model_path, api_key, sglang, log_file=log_file, local=local)
            self.port = int(self.proc.opts.port)
            return
        from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

        extra = ["--max-batch-size", str(max_batch_size), "--seed", str(seed), "--weight-version", "0"]
        if not local:  # other nodes must reach it: every route then needs the token
            extra += ["--host", "0.0.0.0", "--protect-generation"]
        self.proc = EmbeddedEngineProcess(model_path, api_key=api_key, extra_args=extra, log_file=log_file,
                                          threads=threads, startup_timeout_s=startup_timeout_s)
        self.proc.start()
        assert self.proc.port is not None
        self.port = int(self.proc.port)

    def url(self) -> str:
        return f"http://{self.node_ip}:{self.port}"

    def pid(self) -> int:
        assert self.proc.proc is not None
        return int(self.proc.proc.pid)

    def kill(self) -> None:
        """Fault injection: the engine dies at once."""
        self.proc.kill()

    def stop(self) -> None:
        self.proc.stop()


def _start_sglang(model_path: str, api_key: str, section: dict[str, Any], *, log_file: str, local: bool) -> Any:
    """An SGLang server for an :class:`EngineHost`: checked first on this node (sglang installed
    and new enough, a GPU, every flag accepted by its own parser: one clear line otherwise),
    then started on a free port, weight version 0, and waited for."""
    from relax_gym.trainer.config import SGLangLaunchConfig
    from relax_gym.trainer.engines.fleet import sglang_launch_options
    from relax_gym.trainer.engines.sglang_launcher import SGLangServer, preflight

    opts = sglang_launch_options(SGLangLaunchConfig.model_validate(section), model_path, api_key=api_key,
                                 log_file=log_file, host="127.0.0.1" if local else "0.0.0.0")
    preflight(opts)
    server = SGLangServer(opts)
    server.start()
    return server


class RoleActor:
    """Hosts one role object; ``call(name, ...)`` runs its method (awaiting coroutines)."""

    def __init__(self, kind: str, config_data: dict[str, Any], kwargs: dict[str, Any]) -> None:
        logging.basicConfig(level=logging.WARNING)
        imports = list(config_data.get("async_rl", {}).get("imports", []))
        import_modules(imports)
        self.kind = kind
        if kind == "reward":  # no training config (and no torch) in a reward worker
            from relax_gym.trainer.modes.reward_workers import RewardWorker

            r = config_data.get("rewards", {})
            self.obj: Any = RewardWorker(r.get("entries", [{"name": "env"}]), r.get("per_env") or None,
                                         float(r.get("timeout_s", 60.0)), imports=imports)
            return
        from relax_gym.trainer.config import TrainConfig

        config = TrainConfig.model_validate(config_data)
        if config.threads:
            import torch

            torch.set_num_threads(config.threads)
        self.obj = build_role(kind, config, kwargs)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await call_method(self.obj, name, *args, **kwargs)

    def ready(self) -> str:
        return self.kind


def role_object(kind: str, config_data: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """The role object a :class:`RoleActor` would host, for a process that hosts it itself
    (:class:`~.process_role.ProcessRole`)."""
    return RoleActor(kind, config_data, kwargs).obj


def build_role(kind: str, config: Any, kw: dict[str, Any]) -> Any:
    """The role object of ``kind`` (learner, engine, queue, rollout, logprob) for ``config``."""
    if kind == "learner":
        from relax_gym.trainer.modes.learner import Learner

        return Learner(config, resume=kw.get("resume", False))  # True or a step / checkpoint name
    if kind == "engine":
        return EngineHost(**kw)
    if kind == "queue":
        from relax_gym.trainer.modes.trajectory_queue import TrajectoryQueue

        a = config.async_rl
        return TrajectoryQueue(capacity=a.capacity(config.rollout.prompts_per_step), max_staleness=a.max_staleness,
                               stale_policy=a.stale_policy, version=int(kw.get("version", 0)))
    if kind == "rollout":
        from relax_gym.chat import ChatCodec

        from relax_gym.trainer.modes.producer import RolloutProducer
        from relax_gym.trainer.rollout import EngineRouter

        learner = kw["learner"]
        # joiners and revived engines get the learner's published weights; the learner's own
        # router follows this one's membership
        router = EngineRouter(kw["urls"], api_key=kw["api_key"], request_timeout_s=config.rollout.request_timeout_s,
                              weight_sync=lambda handle, version: learner.push_weights_to(handle.url),
                              on_change=lambda event, url: learner.track_engine(event, url))
        codec = ChatCodec.from_pretrained(kw["model_path"], template_kwargs=dict(config.model.template_kwargs),
                                          video=config.model.video.sampling(), audio=config.model.audio.sampling())
        return RolloutProducer(config, codec, router, kw["queue"], list(kw["rewards"]), owns_pause=True,
                               model_path=kw["model_path"])
    if kind == "logprob":
        from relax_gym.trainer.modes.logprob_workers import LogprobWorker

        return LogprobWorker(kw["which"], kw["model_path"], kw["queue"], temperature=config.rollout.temperature,
                             micro_batch_size=config.train.micro_batch_size)
    raise ValueError(f"unknown role kind {kind!r}")


__all__ = ["EngineHost", "RoleActor", "build_role", "import_modules", "role_object"]
