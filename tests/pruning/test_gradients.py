"""d(loss)/d(head gates) on each backend: against finite differences and each other."""

import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_mha.layers import MultiHeadAttention
from keras_mha.pruning import find_attention_layers
from keras_mha.pruning.batches import resolve_loss
from keras_mha.pruning.gate_gradients import gate_gradients
from tests.pruning.test_models import (
    all_variables,
    assert_untouched,
    block_model,
    classification_data,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def deterministic_model():
    """`block_model()` with weights drawn from NumPy, identical on every backend."""
    model = block_model()
    rng = np.random.default_rng(42)
    for variable in model.trainable_variables:
        variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))
    return model


def regression_batch():
    rng = np.random.default_rng(7)
    x, _ = classification_data(num_examples=6, seed=3)
    y = rng.normal(size=(6, 3)).astype("float32")
    sample_weight = rng.uniform(0.5, 1.5, size=6).astype("float32")
    return x, y, sample_weight


def finite_difference_gradients(model, loss_fn, x, y, sample_weight, step=1e-2):
    """Central differences, written through the gate variables with plain forward passes."""
    gradients = []
    for layer in find_attention_layers(model).values():
        base = np.array(keras.ops.convert_to_numpy(layer.head_gates))
        gradient = np.zeros(layer.num_heads)
        for head in range(layer.num_heads):
            losses = []
            for sign in (1.0, -1.0):
                shifted = base.copy()
                shifted[head] += sign * step
                layer.head_gates.assign(shifted)
                loss = loss_fn(y, model(x, training=False), sample_weight)
                losses.append(float(keras.ops.convert_to_numpy(loss)))
            gradient[head] = (losses[0] - losses[1]) / (2 * step)
        layer.head_gates.assign(base)
        gradients.append(gradient)
    return gradients


@pytest.mark.parametrize("gates", ["ones", "partly_pruned"])
def test_gate_gradients_match_finite_differences(gates):
    model = deterministic_model()
    layers = find_attention_layers(model)
    if gates == "partly_pruned":
        layers["block_0/attention"].head_gates.assign([1.0, 0.0, 1.0, 0.0])
        layers["block_1/attention"].head_gates.assign([0.0, 0.0, 1.0, 1.0])
    loss_fn = resolve_loss(model, "mse")
    x, y, sample_weight = regression_batch()
    before = all_variables(model)
    loss, gradients = gate_gradients(
        model,
        [layer.head_gates for layer in layers.values()],
        x,
        y,
        sample_weight,
        loss_fn=loss_fn,
    )
    assert_untouched(model, before)  # Gates were swapped in a StatelessScope, never written.
    expected_loss = float(keras.ops.convert_to_numpy(loss_fn(y, model(x), sample_weight)))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    reference = finite_difference_gradients(model, loss_fn, x, y, sample_weight)
    for gradient, expected in zip(gradients, reference, strict=True):
        assert gradient.shape == expected.shape
        np.testing.assert_allclose(gradient, expected, rtol=2e-3, atol=2e-4)
    assert max(np.abs(g).max() for g in gradients) > 1e-2  # Not vacuously small.


class WithSpareAttention(keras.Model):
    """Tracks an attention layer that `call` never uses: its gates cannot reach the loss."""

    def __init__(self):
        super().__init__()
        self.used = MultiHeadAttention(2, name="used")
        self.spare = MultiHeadAttention(2, name="spare")

    def build(self, input_shape):
        self.used.build(input_shape)
        self.spare.build(input_shape)

    def call(self, x):
        return self.used(x)


def test_gate_gradients_of_a_layer_the_loss_does_not_reach_are_zero():
    model = WithSpareAttention()
    x, _, _ = regression_batch()
    y = np.ones_like(x)
    model(x)
    layers = find_attention_layers(model)
    assert list(layers) == ["used", "spare"]
    _, gradients = gate_gradients(
        model,
        [layer.head_gates for layer in layers.values()],
        x,
        y,
        loss_fn=resolve_loss(model, "mse"),
    )
    assert np.abs(gradients[0]).max() > 0
    np.testing.assert_array_equal(gradients[1], [0.0, 0.0])


_CROSS_BACKEND_SCRIPT = """
import json, sys
from keras_mha.layers import MultiHeadAttention
from keras_mha.pruning import find_attention_layers
from keras_mha.pruning.batches import resolve_loss
from keras_mha.pruning.gate_gradients import gate_gradients
from tests.pruning.test_gradients import deterministic_model, regression_batch
model = deterministic_model()
layers = find_attention_layers(model)
x, y, sample_weight = regression_batch()
loss, grads = gate_gradients(model, [l.head_gates for l in layers.values()], x, y,
                             sample_weight, loss_fn=resolve_loss(model, "mse"))
print(json.dumps({"loss": loss, "gradients": [g.tolist() for g in grads]}))
"""


def _gradients_on(backend):
    module = {"jax": "jax", "torch": "torch", "tensorflow": "tensorflow"}[backend]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs all three backends; {module} is not installed")
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _CROSS_BACKEND_SCRIPT],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.backend_independent
def test_the_three_backend_branches_agree():
    """jax.grad, torch.autograd and tf.GradientTape on the same model and batch."""
    results = {backend: _gradients_on(backend) for backend in ("jax", "torch", "tensorflow")}
    reference = results["torch"]
    for backend, result in results.items():
        np.testing.assert_allclose(result["loss"], reference["loss"], rtol=1e-5, err_msg=backend)
        for gradient, expected in zip(result["gradients"], reference["gradients"], strict=True):
            np.testing.assert_allclose(gradient, expected, rtol=1e-4, atol=1e-6, err_msg=backend)
