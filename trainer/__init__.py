"""The training side of relax-gym: RL on environments with SGLang-protocol engines.

The folders follow the system (see docs/architecture.md for the diagram):

* ``config.py`` -- the one training config (``relax-gym train CONFIG``), torch-free to validate;
* ``algorithms/`` -- advantages, KL, policy losses, batching from rollouts to tensors;
* ``backends/`` -- where the gradient step runs: ``base`` (the contract), ``pytorch``,
  ``megatron/`` (megatron-core);
* ``engines/`` -- the embedded SGLang-protocol engine, launching engines, the engine fleet;
* ``rollout/`` -- episodes against engines: chat encoding, the manager, router, sampler;
* ``weights/`` -- moving the trainer's weights into the engines;
* ``modes/`` -- colocate, fully_async and hybrid, on one machine or on Ray;
* ``models/`` -- tiny models and tokenizers for CPU runs and tests;
* checkpoints (``checkpoint``, ``safe_state``), run output (``observability``), the SFT
  warm-start (``sft``) and the CLI entry points (``train_cli``, ``sft_cli``, ``engine_cli``).
"""
