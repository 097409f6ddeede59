#!/usr/bin/env bash
# The GPU checks of docs/guides/gpu.md: the layer decode step at context 8192 (also
# replayed from a CUDA graph, tools/cuda_graph_decode.py) and the
# whole-model bench at full size (PyTorch and JAX, bfloat16), then both suite legs side by
# side. Each step runs under a time limit so that a slow one cannot eat the others' time;
# the suites get what is left of SECONDS (default 600). Logs go to OUTDIR (with ARCHIVE
# set, also packed into that .tar.gz after every step); the last lines are a summary.
#
#   tools/gpu_figures.sh OUTDIR [bench|suite|all] [SECONDS]
#
# PYTHON (default python3) must import keras_mha (an install, or PYTHONPATH with this
# checkout). On an H100 the bench part takes about 5 minutes, most of it compiling
# (torch.compile, XLA) and building the 1.2B-parameter checkpoint on the CPU.
set -u
out=${1:?usage: tools/gpu_figures.sh OUTDIR [bench|suite|all] [SECONDS]}
part=${2:-all}
deadline=$((SECONDS + ${3:-600} - 20)) # 20 s for the summary and the archive
python=${PYTHON:-python3}
mkdir -p "$out"
# Two JAX processes (a suite leg, a bench worker) must share the card: allocate on demand.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# Llama-3-8B's attention; in one process per bench (no peak-memory processes).
decode=(--cases decode --dtype bfloat16 --batch 4 --heads 32 --kv-heads 8 --head-dim 128
  --decode-context 8192 --decode-repeats 30 --no-memory --in-process --format markdown)

pack() { [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$out" .; }
step() { # step NAME SECONDS COMMAND...: run, log to OUTDIR/NAME.log, note the status and time
  local name=$1 seconds=$2 start=$SECONDS
  shift 2
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status after $((SECONDS - start)) s (limit $seconds s)" | tee -a "$out/steps.txt"
  pack
}
# The suite legs, side by side (timings do not matter here); keras tests only, since the
# backend-independent ones answer the same without a GPU. -v names each failure as it
# happens, so a leg stopped at its limit still says which tests failed.
suite() {
  env KERAS_BACKEND="$1" timeout "$2" "$python" -m pytest -v --tb=line -p no:cacheprovider \
    -m "not backend_independent" -n 6 --dist loadfile --continue-on-collection-errors \
    >"$out/suite-$1.log" 2>&1
  echo "suite-$1: exit $? (limit $2 s)" >>"$out/steps.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1
KERAS_BACKEND=torch "$python" -c "import keras, torch, jax; print('keras', keras.__version__, \
'| torch', torch.__version__, torch.cuda.get_device_name(), '| jax', jax.__version__)" \
  >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

if [ "$part" != suite ]; then
  step decode-torch 60 env KERAS_BACKEND=torch "$python" -m benchmarks layers "${decode[@]}"
  step decode-torch-compiled 150 env KERAS_BACKEND=torch "$python" -m benchmarks layers \
    "${decode[@]}" --torch-compile
  step decode-jax 90 env KERAS_BACKEND=jax "$python" -m benchmarks layers "${decode[@]}"
  step decode-cuda-graph 60 env KERAS_BACKEND=torch "$python" -m tools.cuda_graph_decode
  step model-torch 150 env KERAS_BACKEND=torch "$python" -m benchmarks model --full-size \
    --format markdown
  step model-jax 150 env KERAS_BACKEND=jax "$python" -m benchmarks model --full-size \
    --format markdown
fi
# --- Quantized KV cache (issue 32): float8 KV against the bfloat16 cache, context 8192 ---
# A separate step: bench model pairs keras-mha with `--kv-cache-dtype float8_e4m3fn`
# against its own bfloat16 cache in the same rounds, and states both caches' bytes.
if [ "$part" != suite ]; then
  for backend in torch jax; do
    step "kv-float8-$backend" 240 env KERAS_BACKEND=$backend "$python" -m benchmarks model \
      --full-size --kv-cache-dtype float8_e4m3fn --prompt-length 8160 --new-tokens 32 \
      --rounds 3 --no-transformers --format markdown
  done
fi
if [ "$part" != bench ]; then
  suite torch $((deadline - SECONDS)) &
  suite jax $((deadline - SECONDS)) &
  wait
fi

echo "== summary"
cat "$out/steps.txt"
for log in "$out"/decode-*.log "$out"/model-*.log "$out"/kv-float8-*.log; do
  [ -e "$log" ] || continue
  echo "== $(basename "$log")"
  grep -E "^\||^(keras-mha|shapes|roofline|meta-llama|GQA|MHA|KV cache)|Error" "$log" | tail -30
done
for log in "$out"/suite-*.log; do
  [ -e "$log" ] || continue
  grep -E "FAILED|ERROR" "$log" | head -40
  tail -n 1 "$log"
done
pack
