"""Training backends: the contract (:mod:`.base`) and its implementations (:mod:`.pytorch`,
:mod:`.megatron`); ``train.backend`` in the config picks one."""

from relax_gym.errors import RelaxGymError


class BackendSetupError(RelaxGymError, RuntimeError):
    """A backend cannot start with this config on this machine (parallel layout, model type,
    device switch); the CLI prints the one-line message and exits 2 instead of a traceback."""


__all__ = ["BackendSetupError"]
