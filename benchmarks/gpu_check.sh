#!/usr/bin/env bash
# The GPU check of issue 14: one run on one GPU (about 9 minutes on an H200) that measures
#   (a) the CUDA-marked tests (pytest -m cuda: tests/test_cuda.py and any other)
#   (b) the baby config (configs/shakespeare_char_gpu.yaml, 6L/6H/384, context 256) trained for
#       train.time_budget=60s: validation curve, wall time, seconds to a validation loss <= 1.47
#   (c) the 124M config (configs/gpt2_small.yaml): training tokens/s and MFU in bf16, eager and
#       compiled, against the measured matmul peak (8192 on CUDA; peak.json has 2048 too)
#   (d) decoding with the KV cache, batch 1 and 16, eager and compiled (CUDA graphs), time to
#       first token, for the baby and the 124M shapes
#   (e) the attention cost table, fused against explicit, to context 8192
#   (f) 2 processes on gloo, and a torchrun launch (tests/test_train.py); multi-GPU NCCL is not measured
# then (if time is left) the baby config again with Muon. GPU_CHECK_PLAN=runs runs instead the
# follow-up of the first H200 check (docs/BENCHMARKS.md): the baby config with Muon for 1,000
# steps, with AdamW for nanoGPT's published 5,000, and the main config with a 60 s budget.
# Each step has its own timeout and
# a failure stops only that step; it is recorded, with its log, and the next one runs. The
# whole script stops starting steps after GPU_CHECK_SECONDS (540) so that it ends inside one
# 10-minute device call.
#
# Output, all in $OUT (at most 8 files come back from the device; here there are 4):
#   gpu_check.json  every figure and every step's status (rewritten after each step)
#   summary.txt     the short summary printed at the end
#   logs.tar.gz     each step's log, the figures' JSON, pytest's XML, the training runs'
#                   train.log, config.yaml and TensorBoard events (no checkpoints)
#   console.log     this script's whole output
#
# On the device (the device tool's `run`; data/ is git-ignored, so the corpus is carried, and
# the wheels come from `make gpu-wheels` run here first):
#   run(command="bash benchmarks/gpu_check.sh", timeout_s=600,
#       carry=["gpu-wheels", "data/tinyshakespeare.txt"])
# On the CPU, the rehearsal (device forced to cpu, tiny sizes and steps, about 3 minutes):
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_TINY=1 OUT=/tmp/gpucheck bash benchmarks/gpu_check.sh
#
# Settings: OUT (default /tmp/gpu-check-out); PYTHON (default .venv/bin/python where it exists,
# else python3: on the H200 the one with its own torch, which nothing here installs over);
# GPU_CHECK_DEVICE (cuda); GPU_CHECK_TINY (0); GPU_CHECK_SECONDS (540); GPU_CHECK_WORK (the
# scratch folder, default /tmp/gpu-check-work); GPU_CHECK_BUDGET (the baby run's
# train.time_budget, default 60s); GPU_CHECK_PLAN (check, or runs: the follow-up above).
set -uo pipefail  # no -e: a failing step is recorded and the next one runs
cd "$(dirname "$0")/.."
started=$SECONDS
PY="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
TINY="${GPU_CHECK_TINY:-0}"
LIMIT="${GPU_CHECK_SECONDS:-540}"
BUDGET="${GPU_CHECK_BUDGET:-60s}"
PLAN="${GPU_CHECK_PLAN:-check}"
case "$PLAN" in
    check | runs) ;;
    *) echo "GPU_CHECK_PLAN=$PLAN is not accepted: expected check (the default) or runs" >&2; exit 2 ;;
esac
OUT="${OUT:-/tmp/gpu-check-out}"
WORK="${GPU_CHECK_WORK:-/tmp/gpu-check-work}"
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK/logs" "$WORK/json" "$WORK/runs"
exec > >(tee "$OUT/console.log") 2>&1
TEE_PID=$!

# The wheels go to a folder of their own, first on the path; the repository is imported from
# its folder (no pip install -e: that would need the network for its build backend).
SITE="$WORK/site"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TINYATTN_CACHE_DIR="$WORK/tinyattn-cache"

finish() {  # refresh gpu_check.json, summary.txt and logs.tar.gz from what the steps left
    "$PY" -m benchmarks.gpu_check_report summary "$WORK" --json "$OUT/gpu_check.json" --text "$OUT/summary.txt" \
        >"$WORK/logs/summary.log" 2>&1 || echo "summary failed: see logs/summary.log"
    (cd "$WORK" && tar -czf "$OUT/logs.tar.gz.tmp" logs json steps.jsonl \
        $(cd "$WORK" && find runs -name train.log -o -name config.yaml -o -name 'events.out.tfevents.*' \
          -o -name samples.txt 2>/dev/null) && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz") \
        || echo "packing the logs failed"
}

# step NAME TIMEOUT_S MIN_S COMMAND...: runs COMMAND with its output in logs/NAME.log, under
# `timeout`, unless fewer than MIN_S seconds of GPU_CHECK_SECONDS are left; records the status.
step() {
    local name=$1 limit=$2 min=$3
    shift 3
    local left=$((LIMIT - (SECONDS - started))) status rc=0 t0=$SECONDS
    if ((left < min)); then
        status="skipped: ${left} s left of ${LIMIT}, needs ${min}"
    else
        ((limit > left)) && limit=$left
        echo "=== $name (timeout ${limit} s) $(date -u +%H:%M:%S): $*"
        # timeout signals the whole process group (torchrun's workers too); bash -c runs the
        # exported functions below as well as plain commands.
        timeout --kill-after=15 "$limit" bash -c '"$@"' "$name" "$@" >"$WORK/logs/$name.log" 2>&1 || rc=$?
        tail -n 4 "$WORK/logs/$name.log" | sed 's/^/    /'
        case $rc in
            0) status=ok ;;
            124 | 137) status="timed out after ${limit} s" ;;
            *) status="failed (exit $rc)" ;;
        esac
    fi
    echo "--- $name: $status ($((SECONDS - t0)) s)"
    printf '{"name": "%s", "status": "%s", "seconds": %d, "timeout": %d, "command": "%s"}\n' \
        "$name" "$status" $((SECONDS - t0)) "$limit" "$(echo "$*" | tr -d '"\\')" >>"$WORK/steps.jsonl"
    finish
}

install_wheels() {  # the packages the device lacks, from gpu-wheels/ (make gpu-wheels), never torch
    if ! ls gpu-wheels/*.whl >/dev/null 2>&1; then
        echo "no gpu-wheels/: run make gpu-wheels here and carry it"
        return 1
    fi
    local names
    names=$(ls gpu-wheels/*.whl | xargs -n1 basename | sed 's/-.*//' | sort -u | grep -vx torch)
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --find-links gpu-wheels --target "$SITE" $names
}

environment() {
    install_wheels || echo "installing the wheels failed; datasets may be missing (nothing measured here needs it)"
    "$PY" -m benchmarks.gpu_check_report env --json "$WORK/json/env.json"
    "$PY" -m benchmarks.gpu_check_report peak --device "$DEVICE" --precision "$PRECISION" --sizes $PEAK_SIZES \
        --json "$WORK/json/peak.json"
    if command -v nvidia-smi >/dev/null; then nvidia-smi; fi
}

if [[ "$TINY" == 1 ]]; then  # the rehearsal: every step's code path, at sizes a 2-core CPU runs in seconds
    PRECISION=fp32 PEAK_SIZES="256 512"
    SMALL=(model.n_layer=2 model.n_head=2 model.n_kv_head=null model.n_embd=64 model.context_length=64)
    BABY_SET=("${SMALL[@]}" train.batch_size=8 train.compile=false train.eval_interval=20 train.eval_windows=8
              train.time_budget=20s)
    BENCH_124M=(--precision fp32 --batch-size 2 --steps 2 --set "${SMALL[@]}")
    DECODE_BABY=(--config configs/tiny.yaml --vocab-size 65 --dtypes fp32 --compile no yes --new-tokens 20
                 --prompt-tokens 10 --uncached-tokens 5 --repeats 1 --batch-sizes 1 4)
    DECODE_124M=(--config configs/tiny.yaml --vocab-size 50304 --dtypes fp32 --compile no --new-tokens 20
                 --prompt-tokens 10 --uncached-tokens 5 --repeats 1 --batch-sizes 1 4)
    MAX_CONTEXT=256
    PYTEST_CUDA=(tests/test_cuda.py)  # its CPU halves run; the CUDA ones report skipped
    RUNS_SET=("${SMALL[@]}" train.batch_size=8 train.compile=false train.eval_interval=20 train.eval_windows=8)
    MUON_STEPS=40 ADAMW_STEPS=60
    MAIN_SET=(model.n_layer=2 model.n_embd=64 train.compile=false train.eval_windows=8 train.time_budget=20s)
else
    PRECISION=bf16 PEAK_SIZES="2048 8192"
    BABY_SET=(train.time_budget="$BUDGET")
    BENCH_124M=(--precision bf16 --compile --batch-size 16 --steps 10)
    DECODE_BABY=(--config configs/shakespeare_char_gpu.yaml --vocab-size 65 --dtypes bf16 --compile no yes
                 --uncached-tokens 100 --batch-sizes 1 16)
    DECODE_124M=(--config configs/gpt2_small.yaml --vocab-size 50304 --dtypes bf16 --compile no yes
                 --uncached-tokens 100 --batch-sizes 1 16)
    MAX_CONTEXT=8192
    PYTEST_CUDA=(-m cuda --continue-on-collection-errors tests/)
    RUNS_SET=()
    MUON_STEPS=1000 ADAMW_STEPS=5000  # Muon where the 60 s run had its best; nanoGPT's published schedule
    MAIN_SET=(train.time_budget=60s)
fi
MUON_SET=(train.optimizer=muon train.muon_lr=6.0e-3 train.lr=4.0e-3 train.embedding_lr=1.0e-2)

train_config() {  # train_config CONFIG NAME OVERRIDES...: CONFIG trained on the device, then its figures
    local config=$1 name=$2
    shift 2
    "$PY" scripts/train.py --config "$config" --device "$DEVICE" --no-progress \
        --run-name "$name" --set train.out_dir="$WORK/runs" data.cache_dir="$WORK/data-cache" "$@"
    local rc=$?
    "$PY" -m benchmarks.gpu_check_report run "$WORK/runs/$name" --target-loss 1.47 --json "$WORK/json/$name.json"
    return $rc
}
train_baby() { train_config configs/shakespeare_char_gpu.yaml "$@"; }  # train_baby NAME OVERRIDES...
train_main() { train_config configs/shakespeare_char.yaml "$@"; }  # the main config (make train's)

export PY DEVICE WORK SITE PRECISION PEAK_SIZES
export -f install_wheels environment train_config train_baby train_main

echo "gpu_check: device $DEVICE, tiny $TINY, python $PY, out $OUT, work $WORK, $(date -u)"
if [[ "$PLAN" == runs ]]; then  # the follow-up: three training runs, about 4 minutes on an H200
    step wheels 60 10 install_wheels
    step baby-muon-1000 100 40 train_baby baby-muon-1000 "${RUNS_SET[@]}" "${MUON_SET[@]}" train.max_steps="$MUON_STEPS"
    step baby-adamw-5000 160 60 train_baby baby-adamw-5000 "${RUNS_SET[@]}" train.max_steps="$ADAMW_STEPS"
    step main-60s 90 45 train_main main-60s "${MAIN_SET[@]}"
else
    step env 150 30 environment
    step pytest-cuda 240 60 "$PY" -m pytest -q -p no:cacheprovider "${PYTEST_CUDA[@]}" \
        --junitxml="$WORK/json/pytest-cuda.xml"
    step baby-adamw 150 90 train_baby baby-adamw "${BABY_SET[@]}"
    step train-124m 200 90 "$PY" -m benchmarks.suite --device "$DEVICE" --config configs/gpt2_small.yaml \
        --vocab-size 50304 --skip decode attention "${BENCH_124M[@]}" --json "$WORK/json/train-124m.json"
    step decode-baby 150 45 "$PY" -m benchmarks.decode --device "$DEVICE" --threads 1 --pack no \
        "${DECODE_BABY[@]}" --json "$WORK/json/decode-baby.json"
    step decode-124m 180 60 "$PY" -m benchmarks.decode --device "$DEVICE" --threads 1 --pack no \
        "${DECODE_124M[@]}" --json "$WORK/json/decode-124m.json"
    step attention 90 20 "$PY" -m benchmarks.suite --device "$DEVICE" --config configs/shakespeare_char_gpu.yaml \
        --skip training decode --max-context "$MAX_CONTEXT" --json "$WORK/json/attention.json"
    step pytest-gloo 150 40 "$PY" -m pytest -q -p no:cacheprovider tests/test_train.py::test_two_process_gloo_run \
        tests/test_train.py::test_a_stop_signal_to_one_rank_stops_every_rank_with_a_checkpoint \
        --junitxml="$WORK/json/pytest-gloo.xml"
    step baby-muon 150 90 train_baby baby-muon "${BABY_SET[@]}" "${MUON_SET[@]}"
fi

echo "=== summary ($((SECONDS - started)) s in all; figures in $OUT/gpu_check.json, logs in $OUT/logs.tar.gz)"
cat "$OUT/summary.txt" 2>/dev/null || echo "no summary: see $OUT/console.log"
exec >&- 2>&-
wait "$TEE_PID"  # console.log complete before the device collects $OUT
