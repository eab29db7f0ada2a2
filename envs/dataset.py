"""Dataset envs: one row of a dataset per episode, graded by a reward from the registry.

::

    env = relax_gym.make("relax/Dataset-v0", path="math.jsonl", prompt="question",
                         answer="answer", reward="math_equiv", split="train", test_fraction=0.1)

    relax_gym.envs.from_dataset("me/ChartQA-v0", path="charts/", prompt="question",
                                image="image", reward="normalized_match")

* **Data** -- a JSONL / JSON / CSV / Parquet file, a folder of them, a list of files, or an
  in-memory ``datasets.Dataset`` (``path=``), read through the ``datasets`` library.
* **Columns** -- ``prompt`` (text, or a list of chat messages), ``system`` (a column) or
  ``system_prompt`` (fixed text), ``answer`` (the reward's label), ``image`` / ``audio`` /
  ``video`` (one column or several; paths relative to the data file, bytes, HF media features
  or lists of them), ``tools_column`` (per-row tool names), ``reward_kwargs_column`` (per-row
  keyword arguments for the reward), ``extra_columns`` (copied into the reward's metadata).
* **Reward** -- a registered name (``math_equiv``, ``exact_match``, ``genrm``...), a
  ``module:function`` path, or a composition (a list of ``{name, weight, kwargs}`` entries).
  ``success`` is ``total >= success_threshold``.
* **Tools** -- ``tools`` (built-in names or ``module:attr``) or ``tools_column`` make the env a
  multi-turn :class:`~relax_gym.tools.ToolEnv`.
* **Splits** -- ``split`` with ``split_column`` (rows whose column equals the split) or with
  ``test_fraction`` (a split seeded by ``split_seed``).
* **Order** -- seed ``s`` is row ``order(s % n)`` of epoch ``s // n``: every epoch visits each
  row once, shuffled by ``(shuffle_seed, epoch)``; the same seed always gives the same row.
  ``reset()`` without a seed takes the next position after the last one.
* **Filters** -- ``max_prompt_tokens`` with ``tokenizer`` drops long prompts;
  ``drop_missing_media`` drops rows whose media files do not exist. Both are counted in
  ``info["dataset"]`` and logged. A row that fails during a run (an unreadable image) is
  counted and skipped; past ``max_bad_rows`` the env raises.

``config: file.yaml`` reads these keyword arguments from a YAML file (paths in it are relative
to the file); keywords given beside it win.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from relax_gym.core import Env, StepResult
from relax_gym.errors import RelaxGymError
from relax_gym.registration import WRAPPER_KWARGS, EnvSpec, register
from relax_gym.types import MODALITIES, Action, Message, Observation

from .dataset_source import DatasetConfigError, DatasetSource, RowError, RowTask, SourceOptions, source_for

_PATH_KEYS = ("path", "media_root", "tokenizer", "cache_dir")


class DatasetOptions(BaseModel):
    """Every keyword a dataset env takes (unknown keywords are refused by name)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    path: Any = Field(description="a data file, a folder of them, a list of files, or a datasets.Dataset")
    format: str | None = Field(None, description="json | jsonl | csv | parquet (default: from the suffix)")
    prompt: str = "prompt"
    answer: str | None = "answer"
    system: str | None = Field(None, description="a column holding each row's system prompt")
    system_prompt: str | None = Field(None, description="a system prompt for every row")
    instruction: str | None = Field(None, description="text appended to a text prompt (e.g. the answer format)")
    image: str | list[str] | None = None
    audio: str | list[str] | None = None
    video: str | list[str] | None = None
    media_root: str | None = Field(None, description="resolve relative media paths here (default: the data file's folder)")
    extra_columns: list[str] = Field(default_factory=list, description="columns passed to the reward as metadata")
    reward: Any = Field("normalized_match", description="a reward name, 'module:function', or a list of entries")
    reward_kwargs_column: str | None = None
    success_threshold: float = 1.0
    oracle_format: str = Field("\\boxed{{{answer}}}", description="the oracle's reply; {answer} is the answer cell")
    oracle_column: str | None = Field(None, description="a column holding the oracle's full reply instead")
    tools: list[str] = Field(default_factory=list, description="tools for every row: built-in names or module:attr")
    tools_column: str | None = None
    max_tool_calls: int = Field(8, ge=0)
    tool_parser: str = "hermes"
    tool_timeout_s: float = Field(60.0, gt=0)
    split: str | None = None
    split_column: str | None = None
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    split_seed: int = 0
    shuffle: bool = True
    shuffle_seed: int = 0
    max_prompt_tokens: int | None = Field(None, ge=1)
    tokenizer: str | None = None
    drop_missing_media: bool = True
    validate_rows: int = Field(8, ge=0)
    max_bad_rows: int = Field(100, ge=0)
    cache_dir: str | None = None
    video_fps: float = Field(2.0, gt=0)
    video_max_frames: int = Field(16, ge=1)
    audio_sample_rate: int | None = Field(None, ge=1)

    @field_validator("image", "audio", "video")
    @classmethod
    def _columns(cls, v: str | list[str] | None) -> list[str]:
        return [] if v is None else [v] if isinstance(v, str) else list(v)

    def source_options(self) -> SourceOptions:
        return SourceOptions(
            path=self.path if not isinstance(self.path, list) else tuple(self.path),
            format=self.format, prompt=self.prompt, answer=self.answer, system=self.system,
            image=tuple(self.image or ()), audio=tuple(self.audio or ()), video=tuple(self.video or ()),
            tools_column=self.tools_column, reward_kwargs_column=self.reward_kwargs_column,
            oracle_column=self.oracle_column, extra_columns=tuple(self.extra_columns),
            media_root=self.media_root, split=self.split, split_column=self.split_column,
            test_fraction=self.test_fraction, split_seed=self.split_seed, shuffle=self.shuffle,
            shuffle_seed=self.shuffle_seed, max_prompt_tokens=self.max_prompt_tokens, tokenizer=self.tokenizer,
            drop_missing_media=self.drop_missing_media, validate_rows=self.validate_rows,
            max_bad_rows=self.max_bad_rows, cache_dir=self.cache_dir, video_fps=self.video_fps,
            video_max_frames=self.video_max_frames, audio_sample_rate=self.audio_sample_rate,
        )


def resolve_options(kwargs: Mapping[str, Any]) -> DatasetOptions:
    """Validate keyword arguments (after reading ``config:``), naming the bad one."""
    kwargs = dict(kwargs)
    config = kwargs.pop("config", None)
    if config is not None:
        kwargs = {**read_config(config), **kwargs}
    if "path" not in kwargs:
        raise DatasetConfigError("a dataset env needs path= (a data file, a folder, or a datasets.Dataset)")
    try:
        return DatasetOptions.model_validate(kwargs)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'kwargs'}: {e['msg']}" for e in exc.errors())
        raise DatasetConfigError(f"dataset env options: {problems}") from None


def read_config(config: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML file of dataset-env keywords; relative paths in it resolve against its folder."""
    f = Path(config).expanduser()
    try:
        data = yaml.safe_load(f.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetConfigError(f"config {str(f)!r}: cannot read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise DatasetConfigError(f"config {str(f)!r}: invalid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise DatasetConfigError(f"config {str(f)!r}: expected a mapping of dataset-env keywords")
    data = dict(data["kwargs"]) if isinstance(data.get("kwargs"), dict) else data
    return resolve_paths(data, f.parent)


def resolve_paths(kwargs: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``kwargs`` with relative file keywords (path, media_root, tokenizer, cache_dir) made
    relative to ``base``."""
    data = dict(kwargs)
    for key in _PATH_KEYS:
        value = data.get(key)
        if isinstance(value, str) and not os.path.isabs(os.path.expanduser(value)):
            data[key] = str(base / value)
        elif key == "path" and isinstance(value, list):
            data[key] = [str(base / v) if isinstance(v, str) and not os.path.isabs(v) else v for v in value]
    return data


class DatasetEnv(Env):
    """One dataset row per episode; see the module docstring for every option."""

    modalities = MODALITIES
    tags = ("dataset",)
    max_turns = 1

    def __init__(self, **kwargs: Any) -> None:
        self.options = resolve_options(kwargs)
        o = self.options
        self.source: DatasetSource = source_for(o.source_options())
        self._rewards = _reward_config(o.reward)
        self.modalities = ("text",) + tuple(k for k in ("image", "audio", "video") if getattr(o, k))
        self._static_tools = [_resolve_tool(name) for name in o.tools]
        self.tags = ("dataset",) + (("tools", "multi-turn") if self.uses_tools else ())
        self.task: RowTask | None = None
        self._position: int | None = None

    @property
    def uses_tools(self) -> bool:
        o = self.options
        return bool(o.tools or o.tools_column)

    # -- episodes -------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "position" in options:
            position = int(options["position"])
        elif seed is not None:
            position = int(seed)
        elif self._position is not None:
            position = self._position + 1
        else:
            position = int(self.np_random.integers(0, 2**31 - 1))
        self._position = position
        self.task = self._load(position)
        messages = list(self.task.messages)
        if self.options.system_prompt and not any(m.role == "system" for m in messages):
            messages.insert(0, Message.system(self.options.system_prompt))
        if self.options.instruction:
            last = max(i for i, m in enumerate(messages) if m.role == "user")
            m = messages[last]
            messages[last] = Message(m.role, [*m.content, f"\n{self.options.instruction}"] if m.content else
                                     [self.options.instruction])
        self._prompt = messages
        info = {"row": self.task.row, "source": self.task.where, "dataset": self.source.report.to_dict()}
        return Observation(messages), info

    def _load(self, position: int) -> RowTask:
        """The row at ``position``; a row that fails is counted and the next one is used."""
        src = self.source
        last: RowError | None = None
        for k in range(min(len(src), self.options.max_bad_rows + 1)):
            row = src.row_for_seed(position + k)
            if src.is_bad(row):
                continue
            try:
                return src.build(row)
            except RowError as exc:
                last = exc
                src.record_bad(row, exc)  # raises past max_bad_rows
        raise DatasetConfigError(f"no usable row near position {position}: {last}")

    def step(self, action: Action | str) -> StepResult:
        from relax_gym.tools.declaration import run_sync

        return run_sync(self.astep_inner(Action.coerce(action)))

    async def astep(self, action: Action | str) -> StepResult:
        return await self.astep_inner(Action.coerce(action))

    async def astep_inner(self, action: Action) -> StepResult:
        from relax_gym.rewards import RewardInput

        task = self._require_task()
        composer = self._composer(task)
        sample = RewardInput(
            prompt=list(self._prompt), response=action.text,
            messages=[*self._prompt, Message.assistant(action.text)], label=task.answer,
            metadata={"env_id": getattr(self.spec, "id", None), "row": task.row, **task.extra},
        )
        result = (await composer.score([sample]))[0]
        total = 0.0 if result.total is None else float(result.total)
        info: dict[str, Any] = {
            "success": result.total is not None and total >= self.options.success_threshold,
            "reward_components": dict(result.components),
            "row": task.row,
            "target": task.answer if isinstance(task.answer, (str, int, float)) else str(task.answer),
        }
        if result.failed:
            info["reward_error"] = result.error
        return Observation(), total, True, False, info

    def _composer(self, task: RowTask) -> Any:
        from relax_gym.rewards import RewardComposer

        if not task.reward_kwargs:
            if not hasattr(self, "_shared_composer"):
                self._shared_composer = RewardComposer.from_config(self._rewards)
            return self._shared_composer
        entries = [{**e, "kwargs": {**e.get("kwargs", {}), **task.reward_kwargs}} for e in _entries(self._rewards)]
        return RewardComposer(entries)

    def _require_task(self) -> RowTask:
        if self.task is None:
            raise RuntimeError("DatasetEnv: call reset() first")
        return self.task

    # -- oracle, random agent, tools ------------------------------------------------------------
    def oracle(self) -> Iterator[str]:
        task = self._require_task()
        if task.oracle is not None:
            yield task.oracle
            return
        if task.answer is None:
            raise RelaxGymError("this dataset env has no answer column, so it has no oracle")
        answer = task.answer[0] if isinstance(task.answer, list) and task.answer else task.answer
        yield self.options.oracle_format.format(answer=answer)

    @property
    def has_oracle(self) -> bool:
        return bool(self.options.answer or self.options.oracle_column)

    def random_action(self, rng: np.random.Generator) -> str:
        """The answer of another row: a guess in the dataset's own answer format."""
        src = self.source
        row = src.row_for_seed(int(rng.integers(0, 2**31 - 1)))
        answer = src.dataset[row][self.options.answer] if self.options.answer else ""
        return self.options.oracle_format.format(answer=answer)

    def tools(self) -> list[Any]:
        """The tools of this episode: the env's and the row's own (ToolEnv asks at each reset)."""
        out = list(self._static_tools)
        names = {t.name for t in out}
        if self.task is not None:
            for name in self.task.tools:
                if name not in names:
                    out.append(_resolve_tool(name))
                    names.add(name)
        return out

    def report(self) -> dict[str, Any]:
        """Rows read, used and dropped (with reasons) and rows that failed during the run."""
        return self.source.report.to_dict()


# ------------------------------------------------------------------------------------------------
# rewards and tools by name
# ------------------------------------------------------------------------------------------------
def _entries(config: Any) -> list[dict[str, Any]]:
    if isinstance(config, Mapping) and "rewards" in config:
        config = config["rewards"]
    if isinstance(config, (str, Mapping)):
        config = [config]
    return [{"name": e} if isinstance(e, str) else dict(e) for e in config]


def _reward_config(config: Any) -> Any:
    """Check a reward config now (names resolve, entries validate), so a typo fails at make."""
    from relax_gym.rewards import RewardComposer

    try:
        RewardComposer.from_config(config if isinstance(config, Mapping) and "rewards" in config else _entries(config))
    except (KeyError, ValueError, TypeError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise DatasetConfigError(f"reward {config!r}: {message}") from None
    return config if isinstance(config, Mapping) and "rewards" in config else _entries(config)


def _resolve_tool(name: str) -> Any:
    """A built-in tool by name, or any tool / typed function given as ``module:attr``."""
    from relax_gym.tools import as_tool, builtin_tools

    builtins = builtin_tools()
    if name in builtins:
        return builtins[name]
    if ":" in name:
        import importlib

        module, _, attr = name.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise DatasetConfigError(f"tool {name!r}: cannot load it ({exc})") from None
        return as_tool(obj)
    raise DatasetConfigError(f"unknown tool {name!r}; built-in tools: {builtins.names()}; or give 'module:attr'")


# ------------------------------------------------------------------------------------------------
# the registered factory
# ------------------------------------------------------------------------------------------------
def make_dataset_env(**kwargs: Any) -> Env:
    """The ``relax/Dataset-v0`` entry point: a :class:`DatasetEnv`, wrapped in a ToolEnv when
    it has tools (``tools`` or ``tools_column``; ``mcp_servers`` is taken by ``relax_gym.make``)."""
    env = DatasetEnv(**kwargs)
    if not env.uses_tools:
        return env
    from relax_gym.tools import ToolEnv

    o = env.options
    return ToolEnv(env, parser=o.tool_parser, max_tool_calls=o.max_tool_calls, tool_timeout_s=o.tool_timeout_s)


make_dataset_env.env_class = DatasetEnv  # type: ignore[attr-defined]  # what the registry lists


def from_dataset(id: str, *, override: bool = False, description: str = "", **kwargs: Any) -> EnvSpec:
    """Register ``id`` as a dataset env with these keywords (checked now: the file is opened,
    the columns and the reward resolved, the first rows built). Returns the spec."""
    env = make_dataset_env(**{k: v for k, v in kwargs.items() if k not in WRAPPER_KWARGS})
    try:
        modalities = tuple(env.modalities)
        tags = tuple(env.tags)
    finally:
        env.close()
    return register(id, make_dataset_env, kwargs=kwargs, modalities=modalities, tags=tags,
                    description=description or "rows of a dataset", override=override)


def register_datasets(config: str | os.PathLike[str]) -> list[str]:
    """Register every dataset env of a YAML file ``{envs: [{id, kwargs}...]}`` (or one
    ``{id, kwargs}``); returns the ids. Relative paths resolve against the file's folder."""
    f = Path(config).expanduser()
    try:
        data = yaml.safe_load(f.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise DatasetConfigError(f"datasets file {str(f)!r}: {exc}") from None
    entries = data.get("envs", [data]) if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise DatasetConfigError(f"datasets file {str(f)!r}: expected envs: [{{id, kwargs}}, ...]")
    ids = []
    for e in entries:
        resolved = resolve_paths(dict(e.get("kwargs", {})), f.parent)
        from_dataset(e["id"], description=str(e.get("description", "")), **resolved)
        ids.append(e["id"])
    return ids
