"""megatron-core backend: Qwen3 / Qwen3-VL on GPTModel and the HF <-> Megatron weight bridge.

Importing this package does not import megatron-core or transformers; the submodules do:

- ``config``: ``MegatronConfig`` (parallel sizes, dtype) and ``dims_from_hf_config``.
- ``model``: ``init_model_parallel``, ``build_gpt_model``.
- ``bridge``: ``load_hf_weights``, ``iter_hf_buckets`` (streamed export), ``save_hf_folder``.
- ``logprobs``: TP-aware per-token log-probabilities and entropy.
- ``vl``: Qwen3-VL (Megatron language model + HF vision tower, mRoPE, vision-token merge).
- ``packing``: padding-free packed micro-batches (block-causal mask, per-sequence positions).
- ``backend``: ``MegatronBackend``, the ``TrainerBackend`` for ``backend: megatron``.
- ``cpu_debug``: CPU shim for tests / debugging only (``RELAX_MEGATRON_CPU_SHIM=1``).

See docs/megatron.md.
"""
