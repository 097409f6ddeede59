"""Loading without holding the checkpoint twice: reads, adoption of buffers, the fallbacks.

The memory figure itself (peak RSS while loading a 156 MB checkpoint, < 1.5x) is
measured by `examples/load_memory.py`, not asserted here (a subprocess per backend
would cost CI tens of seconds). These tests pin the mechanisms it rests on:

- `SafetensorsCheckpoint.read` gives the bits safetensors/torch wrote, for every dtype,
  in one 64-byte-aligned array; truncated or inconsistent files are named.
- A variable built inside `deferred_variables()` has no value until `fill`, which makes
  the loaded array its buffer (no copy) on the current backend; Keras's own list of
  pending variables keeps none of them (no later Keras scope initialises them).
- The eager fallback (no deferral) loads the same weights; a failed load leaves nothing
  pending; a bfloat16 checkpoint loads bit-exactly as bfloat16 and widened to float32.
"""

import copy
import json
import struct

import keras
import ml_dtypes
import numpy as np
import pytest

from keras_mha.errors import CheckpointError
from keras_mha.models import deferred, from_pretrained
from keras_mha.models.safetensors_reader import BUFFER_ALIGNMENT, SafetensorsCheckpoint
from keras_mha.models.weight_names import hub_tensors
from tests.models_checkpoints import checkpoint, loaded


def _on_cpu(variable) -> bool:
    """Whether `variable`'s value lives in host memory (JAX, PyTorch or TensorFlow)."""
    value = variable.value
    if callable(getattr(value, "devices", None)):  # a JAX array
        return all(device.platform == "cpu" for device in value.devices())
    return "cpu" in str(value.device).lower()  # torch.device("cpu"), ".../device:CPU:0"


def _keras_pending_list():
    from keras.src.backend.common import global_state

    return list(global_state.get_global_attribute("uninitialized_variables", []) or [])


# -- reading ----------------------------------------------------------------------------------


@pytest.mark.backend_independent
def test_read_gives_the_written_bits_in_an_aligned_array(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=generator),
        "f16": torch.randn(7, generator=generator).half(),
        "bf16": torch.randn(2, 3, 4, generator=generator).to(torch.bfloat16),
        "i64": torch.arange(-3, 3),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    checkpoint = SafetensorsCheckpoint(tmp_path)
    for key, tensor in tensors.items():
        array = checkpoint.read(key)
        assert array.shape == tuple(tensor.shape), key
        assert array.flags.c_contiguous, key
        # (An empty array has no data to align.)
        assert array.size == 0 or array.ctypes.data % BUFFER_ALIGNMENT == 0, key
        if tensor.dtype == torch.bfloat16:
            assert array.dtype == ml_dtypes.bfloat16
            expected = tensor.view(torch.int16).numpy()
            np.testing.assert_array_equal(array.view(np.int16), expected)
            # get() widens exactly, as torch's float() does.
            np.testing.assert_array_equal(checkpoint.get(key), tensor.float().numpy())
        else:
            np.testing.assert_array_equal(array, tensor.numpy(), err_msg=key)
            assert array.dtype == tensor.numpy().dtype, key


@pytest.mark.backend_independent
def test_truncated_and_inconsistent_files_are_named(tmp_path):
    from safetensors.numpy import save_file

    file = tmp_path / "model.safetensors"
    save_file({"w": np.ones((64, 64), np.float32)}, file)
    data = file.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])

    def write(header=None, cut=0):
        text = json.dumps(header).encode() if header else data[8 : 8 + length]
        file.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length : len(data) - cut])
        return SafetensorsCheckpoint(tmp_path)

    # Refused when opened, by the safetensors library's own validation.
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: not a .*partial download"
    ) as error:
        write(cut=100)
    assert "\n" not in str(error.value)
    header = json.loads(data[8 : 8 + length])
    header["w"]["shape"] = [64, 65]  # the offsets still span 64 x 64 floats
    with pytest.raises(CheckpointError, match=r"invalid shape, data type, or offset for tensor"):
        write(header)
    header["w"]["shape"] = "64x64"
    with pytest.raises(CheckpointError, match=r"not a valid safetensors file \(invalid JSON"):
        write(header)
    # A file cut after it was opened: named when the tensor is read.
    checkpoint = write()
    file.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=r"tensor 'w' needs 16384 bytes.*truncated"):
        checkpoint.read("w")


# -- deferred variables ----------------------------------------------------------------------


def test_filled_variables_adopt_the_array_and_nothing_stays_pending():
    assert deferred.deferral_supported()
    already_pending = _keras_pending_list()
    with deferred.deferred_variables() as pending:
        layer = keras.layers.Dense(4)
        layer.build((None, 3))
    assert pending.deferred and len(pending.variables) == 2
    assert all(deferred.is_pending(v) for v in pending.variables)
    assert _keras_pending_list() == already_pending

    array = deferred.owned_array(np.arange(12, dtype=np.float32).reshape(3, 4), "float32")
    deferred.fill(layer.kernel, array)
    pending.initialize_rest()
    assert not any(deferred.is_pending(v) for v in pending.variables)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.bias), np.zeros(4))
    # On the CPU the array is the variable's buffer: no second copy was made.
    array[0, 0] = 42.0
    if _on_cpu(layer.kernel):
        assert keras.ops.convert_to_numpy(layer.kernel)[0, 0] == 42.0
    # A view shared with another variable, or of another dtype, is copied instead.
    source = np.ones((3, 4), np.float32)
    assert deferred.owned_array(source, "float32", shared=True) is not source
    assert deferred.owned_array(source, "bfloat16").dtype == ml_dtypes.bfloat16
    with keras.StatelessScope():  # Keras initialises its pending variables on exit
        pass
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.kernel)[1], [4, 5, 6, 7])


def test_eager_fallback_loads_the_same_weights(tmp_path_factory, monkeypatch):
    made, model = loaded(tmp_path_factory, "llama")
    monkeypatch.setattr(deferred, "deferral_supported", lambda: False)
    eager = from_pretrained(made.directory)
    assert len(eager.variables) == len(model.variables)
    for ours, theirs in zip(eager.variables, model.variables, strict=True):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs), err_msg=ours.path
        )


def test_failed_load_leaves_nothing_pending(tmp_path_factory, tmp_path):
    from safetensors.numpy import load_file, save_file

    made = checkpoint(tmp_path_factory, "llama")
    tensors = load_file(made.directory / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((made.directory / "config.json").read_text())
    before = _keras_pending_list()
    with pytest.raises(CheckpointError, match="up_proj.weight' is missing"):
        from_pretrained(tmp_path)
    assert _keras_pending_list() == before


def test_bfloat16_checkpoint_loads_bit_exactly(tmp_path_factory, tmp_path):
    torch = pytest.importorskip("torch")
    made = checkpoint(tmp_path_factory, "llama")
    half = copy.deepcopy(made.model).to(torch.bfloat16)  # the shared model stays float32
    half.save_pretrained(tmp_path)
    written = {name: tensor.float().numpy() for name, tensor in half.state_dict().items()}
    for dtype in ("bfloat16", None):  # None: float32 on a CPU (widened exactly), else kept
        model = from_pretrained(tmp_path, dtype=dtype)
        expected_dtype = dtype or ("float32" if _on_cpu(model.weights[0]) else "bfloat16")
        assert {v.dtype for v in model.weights} == {expected_dtype}
        exported = dict(hub_tensors(model))
        assert set(exported) == set(written)
        for name, tensor in exported.items():
            np.testing.assert_array_equal(tensor.astype(np.float32), written[name], err_msg=name)
