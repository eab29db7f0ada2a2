"""The tests' handle on the megatron CPU shim (implemented in relax_gym.trainer.backends.megatron.cpu_debug)."""

from relax_gym.trainer.backends.megatron.cpu_debug import megatron_on_cpu

__all__ = ["megatron_on_cpu"]
