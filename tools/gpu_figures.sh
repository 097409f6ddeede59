#!/usr/bin/env bash
# The GPU checks of docs/guides/gpu.md in one run: the layer and whole-model benchmarks on
# PyTorch and JAX, then the two suite legs side by side, each step under a time limit so a
# slow step cannot eat the others' time; the suites get what is left of SECONDS (default 600).
# Logs go to OUTDIR (with ARCHIVE set, also packed into that .tar.gz after every step); the
# last lines printed are a summary.
#
#   tools/gpu_figures.sh OUTDIR [SECONDS]
#
# PYTHON (default python3) must import keras_mha (an install, or PYTHONPATH with this checkout).
set -u
out=${1:?usage: tools/gpu_figures.sh OUTDIR [SECONDS]}
deadline=$((SECONDS + ${2:-600} - 20)) # 20 s for the summary and the archive
python=${PYTHON:-python3}
mkdir -p "$out"
# Two JAX processes (a suite leg, a bench worker) must share the card: allocate on demand.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shape=(--dtype bfloat16 --batch 4 --seq-len 4096 --heads 32 --kv-heads 8 --head-dim 128
  --decode-context 8192 --no-memory)

step() { # step NAME SECONDS COMMAND...: run, log to OUTDIR/NAME.log, note the status and time
  local name=$1 seconds=$2 start=$SECONDS
  shift 2
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status after $((SECONDS - start)) s (limit $seconds s)" | tee -a "$out/steps.txt"
  pack
}
pack() { [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$out" .; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
  >"$out/gpu.txt" 2>&1
"$python" -c "import keras, torch, jax; print('keras', keras.__version__, '| torch', \
torch.__version__, torch.cuda.get_device_name(), '| jax', jax.__version__, jax.devices())" \
  >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

step layers-torch 75 env KERAS_BACKEND=torch "$python" -m benchmarks layers --cases gqa,decode \
  "${shape[@]}" --format markdown
step layers-torch-compiled 100 env KERAS_BACKEND=torch "$python" -m benchmarks layers \
  --cases decode --torch-compile "${shape[@]}" --format markdown
step layers-jax 80 env KERAS_BACKEND=jax "$python" -m benchmarks layers --cases gqa,decode \
  "${shape[@]}" --format markdown
step model-torch 90 env KERAS_BACKEND=torch "$python" -m benchmarks model --full-size \
  --format markdown
step model-jax 100 env KERAS_BACKEND=jax "$python" -m benchmarks model --full-size \
  --format markdown

# The suite legs, side by side (timings do not matter here); keras tests only, since the
# backend-independent ones answer the same without a GPU.
suite_seconds=$((deadline - SECONDS))
suite() {
  env KERAS_BACKEND="$1" timeout "$suite_seconds" "$python" -m pytest -q -p no:cacheprovider \
    -m "not backend_independent" -n 6 --dist loadfile -rfE --continue-on-collection-errors \
    >"$out/suite-$1.log" 2>&1
  echo "suite-$1: exit $? (limit $suite_seconds s)" >>"$out/steps.txt"
}
suite torch &
suite jax &
wait

echo "== summary"
cat "$out/steps.txt"
for log in "$out"/layers-*.log "$out"/model-*.log; do
  echo "== $(basename "$log")"
  grep -E "^\||^(keras-mha|shapes|roofline|meta-llama)|Error" "$log" | tail -30
done
for leg in torch jax; do tail -n 3 "$out/suite-$leg.log"; done
pack
