#!/usr/bin/env bash
# GPU acceptance of the megatron trainer path on one machine with one or more NVIDIA GPUs,
# nothing downloaded: random Qwen3-0.6B- and Qwen3-VL-2B-shaped models built from config, an
# SGLang server started by our launcher, 3 GRPO/GSPO steps through `relax-gym train` with
# backend megatron under torchrun and NCCL weight sync, the engine's logprobs checked against
# the trainer's after a sync, and one table (step time, tokens/s, sync time, logprob mismatch,
# peak memory). A failing stage exits 1 naming it.
#
#   bash bench/gpu_acceptance.sh                # GPUs; needs sglang, megatron-core, CUDA torch
#   bash bench/gpu_acceptance.sh --dry-run-cpu  # CI twin: tiny models, CPU shim, embedded engine
set -euo pipefail
cd "$(dirname "$0")/.."
# the whole run is bounded (8 min; GPU_ACCEPTANCE_TIMEOUT=s to change, e.g. a loaded CPU box)
exec timeout "${GPU_ACCEPTANCE_TIMEOUT:-480}" python bench/gpu_acceptance.py "$@"
