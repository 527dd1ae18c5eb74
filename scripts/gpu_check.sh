#!/usr/bin/env bash
# The CUDA paths in one short run, for a machine with a GPU (about 5 minutes on an H100):
# the tests on CUDA-capable code paths, then the benchmark (bf16 autocast, fused attention,
# torch.compile, fused AdamW, throughput and MFU) for the GPU-sized and the 124M configs.
# Writes JSON under ${OUT:-docs}/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-docs}"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(), 'bf16:', torch.cuda.is_bf16_supported())"
python scripts/bench.py --device cuda --compile --batch-size 64 --config configs/shakespeare_char_gpu.yaml \
    --max-context 8192 --json "$out/bench-gpu-shakespeare.json"
python scripts/bench.py --device cuda --compile --batch-size 16 --vocab-size 50304 \
    --config configs/gpt2_small.yaml --skip attention --json "$out/bench-gpu-124m.json"
