#!/usr/bin/env bash
# GPU check of the Megatron backend (conversion, logprobs vs HF, streamed export) at real size:
# a random Qwen3-0.6B-shaped model and a Qwen3-VL-2B-shaped (8-layer) model.
#
#   bash bench/gpu_megatron.sh            # TP = number of visible GPUs, capped at 2
#   TP=1 bash bench/gpu_megatron.sh       # force a TP size
#   bash bench/gpu_megatron.sh --dry-run-cpu   # no GPU: check the script itself (tiny, CPU shim)
#
# Prints one JSON line per model (max |logprob diff|, load/forward/export times, export GB/s,
# peak memory) and one for GRPO training steps through MegatronBackend (step time, tokens/s). Needs torch with CUDA, megatron-core and transformers in the active env.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ " $* " == *" --dry-run-cpu "* ]]; then
  NPROC="${TP:-2}"
else
  if ! python -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_megatron: no CUDA device visible; nothing to check (try --dry-run-cpu)" >&2
    exit 2
  fi
  GPUS="$(python -c 'import torch; print(torch.cuda.device_count())')"
  NPROC="${TP:-$(( GPUS >= 2 ? 2 : 1 ))}"
fi

exec torchrun --standalone --nproc_per_node="$NPROC" bench/gpu_megatron.py --tp "$NPROC" "$@"
