"""Shared pytest set-up.

The suite runs once per Keras backend (`KERAS_BACKEND=tensorflow|jax|torch`).
Tests of pure-Python code (model-card parsing, cost model, CLI) give the same
answer on every backend, so they carry the `backend_independent` marker and run
on one backend only; the others report them as skipped with the reason.
"""

import os

import pytest

# The backend-independent tests run under this backend (the one whose CI leg also
# has torch, which the transformers oracles need).
BACKEND_FOR_BACKEND_INDEPENDENT_TESTS = "torch"


# JAX compiles every eager op with XLA; on a 2-core CI machine the LLVM
# optimisation of those many tiny programs is most of the JAX leg's time. The
# tests check float32 results to 1e-5, which unoptimised code meets exactly as
# well, so they skip the expensive passes (halves the leg: 88 s -> 39 s for
# test_layers_api.py). On JAX, XLA's older elemental emitters, in one codegen piece,
# compile such tiny programs faster still (tests/layers/test_cache.py: 161 s -> 132 s,
# paired on a loaded 2-core machine); not on TensorFlow, whose tests read the HLO that
# users' compiles get. Set before anything imports jax; a caller's XLA_FLAGS win.
_JAX_ONLY = " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    + (_JAX_ONLY if os.environ.get("KERAS_BACKEND") == "jax" else ""),
)


# On a GPU, XLA computes float32 matmuls in TF32 unless told otherwise; the float32
# tests compare against float64 NumPy and torch references at 1e-5, which TF32's
# 10-bit mantissa misses. Exact float32 in the test run (no effect on CPUs); a
# caller's setting wins. torch keeps float32 matmuls exact by default.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


def current_backend() -> str:
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def pytest_configure(config):
    if current_backend() == "tensorflow":
        # TensorFlow also uses TF32 for float32 matmuls on Ampere and newer GPUs.
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    config.addinivalue_line(
        "markers",
        "backend_independent: pure-Python test; runs once, under "
        f"KERAS_BACKEND={BACKEND_FOR_BACKEND_INDEPENDENT_TESTS}",
    )


def pytest_collection_modifyitems(config, items):
    if current_backend() == BACKEND_FOR_BACKEND_INDEPENDENT_TESTS:
        return
    skip = pytest.mark.skip(
        reason="backend-independent (pure Python); runs once, under "
        f"KERAS_BACKEND={BACKEND_FOR_BACKEND_INDEPENDENT_TESTS}"
    )
    for item in items:
        if "backend_independent" in item.keywords:
            item.add_marker(skip)


# Keras calls gc.collect() for every variable a layer drops (`Layer.__delattr__`, as
# `quantize` does for each float kernel). A full collection walks every object the
# worker holds, which late in a leg is millions (seconds per quantized model). Objects
# alive when a test module starts are frozen out of the collector for that module
# (gc.freeze), so those collections walk only what the module made; unfrozen at the
# module's end, so the collector still frees what earlier modules left.
@pytest.fixture(autouse=True, scope="module")
def _collections_walk_only_this_modules_objects():
    from keras_mha.layers.quantization import cheap_collections

    with cheap_collections():  # reentrant: a `quantize` inside does not unfreeze early
        yield
