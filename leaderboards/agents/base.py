"""What an evaluated agent is: a factory of per-episode sessions that turn observations into actions.

The runner owns the environment; an agent only sees what the model would see. For each episode
the runner calls :meth:`Agent.session` once, then :meth:`AgentSession.act` with each new
observation (the reset observation first, then every step's), and steps the env with the action
it gets back. A session keeps its own conversation history, so agents that re-send the whole
conversation (chat APIs) and agents that keep state (the oracle's plan) look the same from
outside.

Errors are typed by how far they reach:

* :class:`AgentError` -- this episode cannot go on (a timeout, an unparseable reply); the runner
  records it on the episode and carries on with the others;
* :class:`FatalAgentError` -- every episode would fail the same way (wrong URL or key);
* :class:`ModalityRejected` -- the model cannot take a modality the env sends. Also fatal: a run
  that silently dropped the images would publish a text-only score under a multimodal name.
"""

from __future__ import annotations

import abc
import re
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from relax_gym.core import Env
from relax_gym.errors import RelaxGymError
from relax_gym.protocol import EngineError, EngineTimeout, EngineUnavailable
from relax_gym.types import Action, Message, Observation

_T = TypeVar("_T")
# Words servers use when they refuse content they cannot take (vLLM, SGLang, OpenAI, ours). A
# refusal must name the media: a bare "unsupported" (a sampling field, a tool_choice...) is not a
# modality refusal and must not stop the run as one.
_MODALITY_HINT = re.compile(
    r"image|audio|video|modalit|multimodal|vision|content part|input_audio",
    re.IGNORECASE,
)


class AgentError(RelaxGymError):
    """This episode's agent failed; the run goes on."""


class FatalAgentError(AgentError):
    """The agent cannot work at all (unreachable, unauthorised, misconfigured): stop the run."""


class ContextExhausted(AgentError):
    """The conversation fills the model's context: no room is left for a reply. The episode ends
    as truncated (``context_exhausted`` on its record), as a training rollout ends at its token
    budget; it is not an agent failure, and ``--resume`` does not replay it."""


class ModalityRejected(FatalAgentError):
    """The model or endpoint does not accept a modality the environment sends."""

    def __init__(self, modality: str, where: str, detail: str = "") -> None:
        self.modality = modality
        msg = (
            f"{where} does not accept {modality} input"
            + (f": {detail}" if detail else "")
            + f". The run stopped instead of evaluating without the {modality}; evaluate envs "
            f"without {modality} (e.g. another suite) or use a model that takes it."
        )
        super().__init__(msg)


@dataclass
class AgentOptions:
    """Options every agent understands (each uses what applies to it)."""

    model: str | None = None  # served model name (openai:) or model folder (sglang:/hf:)
    tokenizer: str | None = None  # tokenizer/processor folder when it differs from --model
    api_key: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 512
    thinking: bool | None = None  # None: the model's default; True/False: enable_thinking
    seed: int = 0  # base of every per-episode sampling seed
    timeout_s: float = 300.0
    tool_parser: str = "hermes"
    system_prompt: str | None = None
    max_context: int | None = None  # the model's context in tokens; None: what the server or model reports

    def sampling_config(self) -> dict[str, Any]:
        """The options that change what the model samples (they go into the config hash)."""
        extra = {} if self.max_context is None else {"max_context": self.max_context}  # old hashes hold
        return {**extra,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "max_tokens": self.max_tokens,
            "thinking": self.thinking,
            "seed": self.seed,
            "tool_parser": self.tool_parser,
            "system_prompt": self.system_prompt,
        }


@dataclass(frozen=True)
class EpisodeInfo:
    """Which episode a session plays: its key, and a seed for the agent's own randomness."""

    env_id: str
    seed: int
    attempt: int
    agent_seed: int

    @classmethod
    def create(cls, env_id: str, seed: int, attempt: int, base_seed: int = 0) -> EpisodeInfo:
        seq = np.random.SeedSequence([base_seed & 0xFFFFFFFF, zlib.crc32(env_id.encode()), seed, attempt])
        return cls(env_id, seed, attempt, int(seq.generate_state(1, dtype=np.uint32)[0] >> 1))

    def turn_seed(self, turn: int) -> int:
        """A sampling seed for one turn (differs per turn, fixed for a given key)."""
        seq = np.random.SeedSequence([self.agent_seed, turn])
        return int(seq.generate_state(1, dtype=np.uint32)[0] >> 1)


@dataclass
class TurnResult:
    """An agent's turn: the action for the env, the assistant message for the transcript, usage."""

    action: Action
    message: Message
    prompt_tokens: int = 0
    completion_tokens: int = 0
    media_sent: Counter[str] = field(default_factory=Counter)
    reasoning: str | None = None
    media_errors: list[str] = field(default_factory=list)  # clips the model read an error text for, by reason


class AgentSession(abc.ABC):
    """One episode of an agent."""

    @abc.abstractmethod
    async def act(self, observation: Observation) -> TurnResult:
        """Answer the latest observation (only its new messages; earlier ones were seen)."""

    async def aclose(self) -> None:
        """Release per-episode resources (default: nothing)."""


class Agent(abc.ABC):
    """An agent named by a spec string (``oracle``, ``openai:URL``...)."""

    spec: str = ""
    uses_sampling: bool = False  # do the sampling options change what this agent does?

    async def start(self) -> None:
        """Check the agent can work (reach its server, load its model) before episodes run."""

    @abc.abstractmethod
    def session(self, env: Env, episode: EpisodeInfo) -> AgentSession:
        """A new session for one episode of ``env`` (already reset by the runner)."""

    async def aclose(self) -> None:
        """Release shared resources (HTTP clients, models)."""

    def describe(self) -> dict[str, Any]:
        """What identifies this agent in a run's config (and so in its config hash)."""
        return {"spec": self.spec}

    def versions(self) -> dict[str, str]:
        """Versions of what the agent runs on (server, model, libraries), for summary.json."""
        return {}


def _think_blocks(text: str) -> tuple[list[str], str]:
    """Whole ``<think>...</think>`` blocks and the text around them, found left to right with
    ``str.find``: linear time (a lazy ``<think>(.*?)</think>`` regex rescans to the end for
    every unclosed ``<think>``, so 20k of them took a minute)."""
    thoughts: list[str] = []
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find("<think>", pos)
        end = text.find("</think>", start + len("<think>")) if start >= 0 else -1
        if end < 0:
            kept.append(text[pos:])
            return thoughts, "".join(kept)
        kept.append(text[pos:start])
        thoughts.append(text[start + len("<think>") : end])
        pos = end + len("</think>")


def split_thinking(text: str) -> tuple[str, str | None]:
    """Separate ``<think>...</think>`` blocks from the answer (Qwen3 style).

    An unclosed ``<think>`` (the model ran out of tokens while thinking) counts as all thinking:
    the env must not grade half a thought as the answer. A ``</think>`` without its opening tag
    (the template put ``<think>`` in the prompt) ends the thinking.
    """
    thoughts, rest = _think_blocks(text)
    if "</think>" in rest:  # the opening tag was in the prompt (thinking-only templates)
        head, _, rest = rest.rpartition("</think>")
        thoughts.insert(0, head.replace("<think>", ""))
    if "<think>" in rest:
        head, _, tail = rest.partition("<think>")
        thoughts.append(tail)
        rest = head
    reasoning = "\n".join(t.strip() for t in thoughts).strip() or None
    return rest.strip(), reasoning


async def call_engine(call: Awaitable[_T], refused: Callable[[EngineError], AgentError]) -> _T:
    """Await a model server's reply: a timeout or an unreachable server fails this episode, and
    ``refused`` says what a refusal (an HTTP error answer) means."""
    try:
        return await call
    except EngineTimeout as exc:
        raise AgentError(f"timed out: {exc}") from None
    except EngineUnavailable as exc:
        raise AgentError(f"server unavailable: {exc}") from None
    except EngineError as exc:
        raise refused(exc) from None


def refusal(exc: EngineError, where: str, modalities: Iterable[str]) -> AgentError:
    """A refused request as an agent error: a refused key stops the run, and so does a 4xx that
    names media the episode sent (:class:`ModalityRejected`); anything else fails the episode."""
    status = exc.status or 0
    if status in (401, 403):
        return FatalAgentError(f"the server refused the API key: {exc}")
    detail, sent = str(exc), sorted(set(modalities))
    if 400 <= status < 500 and sent and _MODALITY_HINT.search(detail):
        named = [m for m in sent if m in detail.lower()]
        return ModalityRejected(named[0] if named else "/".join(sent), where, detail)
    return AgentError(detail)


def count_media(messages: list[Message]) -> Counter[str]:
    """How many image / audio / video parts the messages carry."""
    return Counter(p.modality for m in messages for p in m.content if p.modality != "text")


__all__ = [
    "Agent",
    "AgentError",
    "AgentOptions",
    "AgentSession",
    "ContextExhausted",
    "EpisodeInfo",
    "FatalAgentError",
    "ModalityRejected",
    "TurnResult",
    "call_engine",
    "count_media",
    "refusal",
    "split_thinking",
]
