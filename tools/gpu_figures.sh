#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md in one run, then (part `all` or `suite`) both suite
# legs side by side. Each step runs under its own time limit, in order of importance, so a
# slow one cannot eat the others' time; the bench part fits in 10 minutes on one H200:
#   1. whole-model decode, Llama-3.2-1B at full size in bfloat16 (`bench model --full-size`):
#      tok/s, the fraction of the planner's bound for the card, transformers eager and its
#      static cache + torch.compile beside it; batch 1 and 8 on PyTorch (CUDA graphs: the
#      default decode path there) and JAX (the whole loop in one program), TensorFlow when
#      it sees the GPU; PyTorch's eager per-token path too, for comparison;
#   2. the layer forward and forward+backward against the fused kernel (`bench layers`,
#      bfloat16) at batch 4 x 4096 and 1 x 32768 tokens, on all three backends;
#   3. the per-token host time of a tiny Llama (`bench host-cost`);
#   4. the layer decode step at context 8192, eager and replayed from a CUDA graph
#      (tools/cuda_graph_decode.py);
#   5. the layer decode step at context 2048, batch 1, 16 query / 2 KV heads (GQA) and
#      MHA, eager and under `torch.compile`, the plain layer call beside the decode
#      function, against the hand-written in-place step (the compiled CUDA GQA step of
#      issue 33);
#   6. keras-hub's compiled generate beside keras-mha on JAX (`bench model`, batch 1).
# The limits add up to 600 s; a step that would start with under 30 s left is skipped.
# Logs go to OUTDIR (with ARCHIVE set, also packed into that .tar.gz after every step);
# tables.md gathers the tables the docs quote; the last lines printed are a summary.
#
#   tools/gpu_figures.sh OUTDIR [bench|suite|all] [SECONDS]
#   GPU_FIGURES_DRY_RUN=1 tools/gpu_figures.sh /tmp/figures bench   # on a CPU: tiny shapes
#
# PYTHON (default python3) must import keras_mha (an install, or PYTHONPATH with this
# checkout). GPU_FIGURES_DRY_RUN=1 runs the same steps with tiny shapes and one round, to
# check the script's logic on a machine without a GPU (the figures mean nothing then).
set -u
out=${1:?usage: tools/gpu_figures.sh OUTDIR [bench|suite|all] [SECONDS]}
part=${2:-all}
deadline=$((SECONDS + ${3:-600} - 20)) # 20 s for the summary and the archive
python=${PYTHON:-python3}
dry=${GPU_FIGURES_DRY_RUN:-0}
mkdir -p "$out"
: >"$out/steps.txt"
# Two JAX processes (a suite leg, a bench worker) must share the card: allocate on demand.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if [ "$dry" = 1 ]; then
  model=(--scale 32 --prompt-length 8 --new-tokens 4 --rounds 1 --format markdown)
  long=(--batch 1 --seq-len 128)
  wide=(--batch 2 --seq-len 64)
  layer=(--cases gqa --heads 4 --kv-heads 2 --head-dim 16 --repeats 1 --warmup 1 --no-memory
    --in-process --format markdown)
  host=(--rounds 1 --new-tokens 4 --format markdown)
  kv=(--scale 32 --prompt-length 8 --new-tokens 4 --rounds 1 --format markdown)
  step2048=(--cases decode --heads 4 --kv-heads 2 --head-dim 16 --decode-context 64
    --decode-repeats 2 --no-memory --in-process --format markdown)
  scale=20 # dry runs on a loaded CPU: every limit times this
else
  model=(--full-size --prompt-length 64 --new-tokens 64 --rounds 3 --format markdown)
  long=(--batch 1 --seq-len 32768)
  wide=(--batch 4 --seq-len 4096)
  # Llama-3-8B's attention, in bfloat16.
  layer=(--cases gqa --dtype bfloat16 --heads 32 --kv-heads 8 --head-dim 128 --repeats 5
    --no-memory --in-process --format markdown)
  host=(--rounds 5 --format markdown)
  kv=(--full-size --prompt-length 8160 --new-tokens 32 --rounds 3 --format markdown)
  step2048=(--cases decode --batch 1 --heads 16 --kv-heads 2 --head-dim 64 --decode-context 2048
    --decode-repeats 30 --no-memory --in-process --format markdown)
  scale=1
fi

pack() { [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$out" .; }
step() { # step NAME SECONDS COMMAND...: run, log to OUTDIR/NAME.log, note the status and time
  local name=$1 seconds=$(($2 * scale)) start=$SECONDS
  shift 2
  if [ $((deadline - SECONDS)) -lt 30 ]; then
    echo "$name: skipped, out of time" | tee -a "$out/steps.txt"
    return
  fi
  [ "$seconds" -gt $((deadline - SECONDS)) ] && seconds=$((deadline - SECONDS))
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status after $((SECONDS - start)) s (limit $seconds s)" | tee -a "$out/steps.txt"
  pack
}
bench() { # bench NAME SECONDS BACKEND ARGS...: `python -m benchmarks ARGS` on BACKEND
  local name=$1 seconds=$2 backend=$3
  shift 3
  step "$name" "$seconds" env KERAS_BACKEND="$backend" "$python" -m benchmarks "$@"
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
'| torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() \
else 'no CUDA', '| jax', jax.__version__, jax.devices()[0].device_kind)" >>"$out/gpu.txt" 2>&1
backends=(torch jax)
# TensorFlow only where it sees the GPU (or in a dry run, on the CPU).
if [ "$dry" = 1 ] || "$python" -c "import tensorflow as tf, sys; \
sys.exit(not tf.config.list_physical_devices('GPU'))" >>"$out/gpu.txt" 2>&1; then
  backends+=(tensorflow)
fi
echo "backends: ${backends[*]}" >>"$out/gpu.txt"
cat "$out/gpu.txt"

if [ "$part" != suite ]; then
  # 1. Whole models: transformers (eager, static + compile) beside PyTorch; the other
  # backends carry the bound only (transformers' figures do not depend on them).
  # keras-hub's generate has a step of its own (below): its compile must not eat these.
  bench model-torch-b1 150 torch model "${model[@]}" --batch 1 --no-keras-hub
  bench model-jax-b1 60 jax model "${model[@]}" --batch 1 --no-transformers --no-keras-hub
  bench model-torch-b8 60 torch model "${model[@]}" --batch 8 --no-compiled-transformers \
    --no-keras-hub
  bench model-jax-b8 45 jax model "${model[@]}" --batch 8 --no-transformers --no-keras-hub
  if [[ " ${backends[*]} " == *" tensorflow "* ]]; then
    bench model-tensorflow-b1 60 tensorflow model "${model[@]}" --batch 1 --no-transformers \
      --no-keras-hub
  fi
  bench model-torch-b1-per-token 45 torch model "${model[@]}" --batch 1 --no-transformers \
    --no-keras-hub --decode-path per_token
  # 2. The layer forward and backward against the fused kernel.
  for backend in "${backends[@]}"; do
    bench "layers-$backend-4x4096" 20 "$backend" layers "${layer[@]}" "${wide[@]}"
    bench "layers-$backend-1x32768" 20 "$backend" layers "${layer[@]}" "${long[@]}"
  done
  # 3. Host cost per token; 4. the layer decode step.
  bench host-cost 30 torch host-cost "${host[@]}" --backends "$(IFS=,; echo "${backends[*]}")"
  if [ "$dry" != 1 ]; then
    step decode-cuda-graph 30 env KERAS_BACKEND=torch "$python" -m tools.cuda_graph_decode
  fi
  # 5. The decode step at context 2048, eager and compiled (GQA and MHA rows).
  bench decode-torch-eager-2048 25 torch layers "${step2048[@]}"
  bench decode-torch-compile-2048 60 torch layers "${step2048[@]}" --torch-compile
  # 6. keras-hub's compiled generate (jax.jit) beside keras-mha's on JAX, same checkpoint.
  bench model-jax-b1-keras-hub 90 jax model "${model[@]}" --batch 1 --no-transformers
fi
# --- Quantized KV cache (issue 32): float8 KV against the bfloat16 cache, context 8192 ---
# A separate step: bench model pairs keras-mha with `--kv-cache-dtype float8_e4m3fn`
# against its own bfloat16 cache in the same rounds, and states both caches' bytes.
if [ "$part" != suite ]; then
  for backend in torch jax; do
    step "kv-float8-$backend" 240 env KERAS_BACKEND=$backend "$python" -m benchmarks model \
      "${kv[@]}" --kv-cache-dtype float8_e4m3fn --no-transformers --no-keras-hub
  done
fi
if [ "$part" != bench ]; then
  suite torch $((deadline - SECONDS)) &
  suite jax $((deadline - SECONDS)) &
  wait
fi

# The tables the docs quote, each under its step's name.
for log in "$out"/model-*.log "$out"/layers-*.log "$out"/host-cost.log "$out"/decode-*.log \
  "$out"/kv-float8-*.log; do
  [ -e "$log" ] || continue
  echo "### $(basename "$log" .log)"
  echo
  grep -E "^\||^(keras-mha|shapes|roofline|meta-llama|Llama|decode bound|default|GQA|MHA|KV cache)" "$log"
  grep -E "Error|Traceback" "$log" | tail -3
  echo
done >"$out/tables.md"
echo "== summary"
cat "$out/steps.txt"
cat "$out/tables.md"
for log in "$out"/suite-*.log; do
  [ -e "$log" ] || continue
  grep -E "FAILED|ERROR" "$log" | head -40
  tail -n 1 "$log"
done
pack
