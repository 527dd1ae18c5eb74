#!/usr/bin/env bash
# The CUDA paths in one short run, for a machine with a GPU (a few minutes on an H100):
# a short training run of the tiny config on CUDA (bf16 autocast, fused AdamW, torch.compile,
# checkpoint save and resume), then the benchmark (throughput, MFU, decoding, attention cost)
# for the GPU-sized and the 124M configs. Needs data/tinyshakespeare.txt (or the internet).
# Writes JSON and the run under ${OUT:-docs}/ and ${OUT:-/tmp}/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-docs}"
runs="${OUT:-/tmp}/gpu-check-runs"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(), 'bf16:', torch.cuda.is_bf16_supported())"
python scripts/train.py --config configs/tiny.yaml --device cuda --run-name cuda-smoke --no-progress \
    --stop-at-step 10 --set train.out_dir="$runs" train.compile=true train.precision=auto
python scripts/train.py --resume "$runs/cuda-smoke" --device cuda --no-progress --set train.out_dir="$runs"
python scripts/bench.py --device cuda --compile --batch-size 64 --config configs/shakespeare_char_gpu.yaml \
    --max-context 8192 --json "$out/bench-gpu-shakespeare.json"
python scripts/bench.py --device cuda --compile --batch-size 16 --vocab-size 50304 \
    --config configs/gpt2_small.yaml --skip attention --json "$out/bench-gpu-124m.json"
