"""relax-gym: an environment-first gym for agentic, multimodal RL of large models.

The core (this package) is light: it imports gymnasium, numpy, Pillow and the standard
library, never torch, transformers, ray or megatron. Environments, tools, rewards, the trainer
and the leaderboards live in the sub-packages ``relax_gym.envs``, ``relax_gym.tools``,
``relax_gym.rewards``, ``relax_gym.trainer`` and ``relax_gym.leaderboards``.
"""

from relax_gym.checker import CheckReport, CheckResult, check_env
from relax_gym.core import Env, EpisodeGuard, Wrapper
from relax_gym.errors import (
    EnvCheckError,
    EnvStepError,
    EpisodeEndedError,
    MediaError,
    RegistrationError,
    RelaxGymError,
    ResetNeededError,
)
from relax_gym.registration import (
    EnvSpec,
    EpisodeKey,
    Suite,
    deregister,
    list_envs,
    list_suites,
    make,
    make_suite,
    register,
    register_suite,
    registry,
    spec,
)
from relax_gym.spaces import ObservationSpace, TextActionSpace
from relax_gym.types import (
    Action,
    AudioPart,
    ContentPart,
    ImagePart,
    Message,
    Observation,
    TextPart,
    ToolCall,
    ToolSpec,
    VideoPart,
)
from relax_gym.vector import AsyncEnvPool, VectorEnv, make_vec

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AsyncEnvPool",
    "AudioPart",
    "CheckReport",
    "CheckResult",
    "ContentPart",
    "Env",
    "EnvCheckError",
    "EnvSpec",
    "EnvStepError",
    "EpisodeEndedError",
    "EpisodeGuard",
    "EpisodeKey",
    "ImagePart",
    "MediaError",
    "Message",
    "Observation",
    "ObservationSpace",
    "RegistrationError",
    "RelaxGymError",
    "ResetNeededError",
    "Suite",
    "TextActionSpace",
    "TextPart",
    "ToolCall",
    "ToolSpec",
    "VectorEnv",
    "VideoPart",
    "Wrapper",
    "check_env",
    "deregister",
    "list_envs",
    "list_suites",
    "make",
    "make_suite",
    "make_vec",
    "register",
    "register_suite",
    "registry",
    "spec",
]
