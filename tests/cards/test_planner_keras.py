"""The training formula's weights and optimizer state against what Keras allocates, on
every backend: a keras-mha attention layer rebuilt from a config, its optimizer built,
the variables counted and their bytes summed."""

import math

import keras
import pytest

from keras_mha.models.rebuild import build_attention
from keras_mha.planning.costs import parameter_counts
from keras_mha.planning.planner import memory
from keras_mha.planning.spec import from_config
from tests.configs import tiny_llama

# A small Llama: 4 query heads sharing 2 KV heads, 32 features, 2 layers.
CONFIG = tiny_llama(vocab_size=64)


SCALARS = ("iteration", "iterations", "learning_rate")


def _nbytes(variable) -> int:
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int64": 8}
    return math.prod(variable.shape) * itemsize[keras.backend.standardize_dtype(variable.dtype)]


def _model(spec):
    """One rebuilt attention layer, an MLP and an output projection: a tiny trainable model."""
    inputs = keras.Input((6, spec.hidden_size))
    hidden = build_attention(spec, 0)(inputs)
    hidden = keras.layers.Dense(spec.mlp.intermediate_size, use_bias=False)(hidden)
    outputs = keras.layers.Dense(spec.vocab_size, use_bias=False)(hidden)
    return keras.Model(inputs, outputs)


@pytest.fixture
def policy():
    previous = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(previous)


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(),
    "adamw": lambda: keras.optimizers.AdamW(),
    "sgd-momentum": lambda: keras.optimizers.SGD(momentum=0.9),
    "sgd": lambda: keras.optimizers.SGD(),
}


@pytest.mark.parametrize("policy_name", ["float32", "mixed_bfloat16"])
def test_training_state_matches_keras_optimizer_variables(policy_name, policy):
    keras.mixed_precision.set_global_policy(policy_name)
    spec = from_config(CONFIG)
    model = _model(spec)
    trainable = model.trainable_variables
    parameters = sum(math.prod(variable.shape) for variable in trainable)
    # The rebuilt attention layer holds exactly the cost model's attention parameters.
    attention_layer = model.layers[1]
    assert sum(math.prod(v.shape) for v in attention_layer.trainable_variables) == (
        parameter_counts(spec).attention // spec.num_layers
    )

    for optimizer_name, make_optimizer in OPTIMIZERS.items():
        _check_optimizer(optimizer_name, make_optimizer(), trainable, parameters, policy_name)


def _check_optimizer(optimizer_name, optimizer, trainable, parameters, policy_name):
    optimizer.build(trainable)
    moments = memory.OPTIMIZER_MOMENTS[optimizer_name]
    # Keras keeps a step counter and the learning rate beside one slot per moment and variable.
    assert len(optimizer.variables) == moments * len(trainable) + 2

    precision = "float32" if policy_name == "float32" else "mixed"
    state = memory.training_state_bytes(parameters, optimizer=optimizer_name, precision=precision)
    slots = [v for v in optimizer.variables if v.path.split("/")[-1] not in SCALARS]
    scalars = [v for v in optimizer.variables if v.path.split("/")[-1] in SCALARS]
    assert len(scalars) == 2
    assert sum(_nbytes(variable) for variable in slots) == 4 * moments * parameters
    # The formula counts the scalars as 12 bytes: an int64 step counter (TensorFlow; int32
    # elsewhere) and a float32 learning rate.
    scalar_bytes = sum(_nbytes(variable) for variable in scalars)
    assert scalar_bytes == (12 if keras.backend.backend() == "tensorflow" else 8)
    assert state["optimizer"] == 4 * moments * parameters + memory.OPTIMIZER_SCALAR_BYTES
    # Keras keeps float32 variables under both policies: 4 bytes a parameter, which is the
    # formula's float32 weights, or its 16-bit weights + float32 master copy less the
    # 16-bit gradients it counts separately (Keras's gradients are float32: 2 + 4 + 2 = 4 + 4).
    variable_bytes = sum(_nbytes(variable) for variable in trainable)
    assert variable_bytes == 4 * parameters
    gradient_bytes = variable_bytes  # one float32 gradient per float32 variable
    formula = state["weights"] + state["master_weights"] + state["gradients"]
    assert formula == variable_bytes + gradient_bytes
