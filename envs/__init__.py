"""The environments shipped with relax-gym, registered under the ``relax/`` namespace.

``register_envs`` is the ``relax_gym.envs`` entry point: the registry calls it lazily the first
time an id is looked up, and it records only entry-point strings, so importing this package
does not import any env module.
"""

from __future__ import annotations

from relax_gym.registration import register, registry


def register_envs() -> None:
    """Register every shipped env (idempotent)."""
    if "relax/SenseCount-v0" in registry:
        return
    register(
        "relax/SenseCount-v0",
        "relax_gym.envs.sense_count:SenseCountEnv",
        modalities=("text", "image", "audio", "video"),
        tags=("counting", "multimodal"),
        max_turns=1,
        description="count dots (image) + beeps (audio) + flashes (video)",
    )
