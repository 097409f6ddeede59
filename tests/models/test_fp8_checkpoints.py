"""fp8 block-scaled checkpoints (DeepSeek-V3 / Qwen3-FP8 format) load, dequantized.

The checkpoint: transformers' tiny Qwen2 (`tests/models_checkpoints.py`), its Linear
weights quantized to float8_e4m3fn with a `weight_scale_inv` per 32x48 block, as
transformers' `FineGrainedFP8` quantizer does (`_FP8_MAX / amax` per block, the inverse
stored) but with DeepSeek's ceil-divided grid, so most tensors end in partial blocks
(transformers' own `Fp8Quantize` passes such tensors through unquantized; where a tensor
divides, the test's quantizer is checked against it byte for byte). The reference:
transformers' float model given the weights dequantized by torch (and, where a tensor
divides, by transformers' own `Fp8Dequantize`). transformers cannot load the fp8 folder
itself here: its fp8 loader needs `accelerate`, which the test extra does not install.
"""

import copy
import json

import numpy as np
import pytest
from keras import ops

from keras_mha.errors import CheckpointError, ConfigError, UnsupportedModelError
from keras_mha.models import from_pretrained
from tests.models_checkpoints import checkpoint

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

BLOCK = (32, 48)
FP8_MAX = 448.0
# Left in float, as a release lists them in modules_to_not_convert.
NOT_CONVERTED = ("lm_head", "model.layers.1.mlp.down_proj")


def quantize_blocks(weight, block=BLOCK):
    """(float8 codes, weight_scale_inv) of a 2-D weight, a scale per block (ceil grid)."""
    rows, columns = weight.shape
    grid = (-(-rows // block[0]), -(-columns // block[1]))
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :columns] = weight.float()
    tiles = padded.reshape(grid[0], block[0], grid[1], block[1])
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))
    scaled = tiles * scale[:, None, :, None]
    codes = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(padded.shape)
    return codes[:rows, :columns].contiguous(), (1.0 / scale).float()


def dequantize_reference(codes, scale_inv, block=BLOCK):
    rows, columns = codes.shape
    scales = scale_inv.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)
    return codes.float() * scales[:, :columns]


def _converted(name):
    return (
        name.endswith(".weight")
        and ("self_attn." in name or "mlp." in name)
        and not name.startswith(NOT_CONVERTED)
    )


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    """(fp8 folder, float folder's checkpoint, transformers' model on the dequantized weights)."""
    made = checkpoint(tmp_path_factory, "qwen2")
    tensors = safetensors_torch.load_file(str(made.directory / "model.safetensors"))
    stored, dequantized = {}, {}
    for name, tensor in tensors.items():
        if _converted(name):
            codes, scale_inv = quantize_blocks(tensor)
            stored[name], stored[name + "_scale_inv"] = codes, scale_inv
            dequantized[name] = dequantize_reference(codes, scale_inv)
        else:
            stored[name] = tensor
    folder = tmp_path_factory.mktemp("qwen2_fp8")
    safetensors_torch.save_file(stored, str(folder / "model.safetensors"))
    config = json.loads((made.directory / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
        "modules_to_not_convert": list(NOT_CONVERTED),
    }
    (folder / "config.json").write_text(json.dumps(config))
    reference = copy.deepcopy(made.model)
    reference.load_state_dict({**tensors, **dequantized}, strict=False)
    with torch.no_grad():
        logits = reference(input_ids=torch.from_numpy(made.token_ids)).logits.numpy()
    return folder, made, logits, tensors, stored


def test_fp8_checkpoint_matches_transformers_on_its_dequantized_weights(fp8):
    folder, made, logits, tensors, _ = fp8
    model = from_pretrained(folder)
    got = ops.convert_to_numpy(model(made.token_ids.astype("int32")))
    np.testing.assert_allclose(got, logits, atol=1e-4 * np.abs(logits).max(), rtol=0)
    # The fp8 weights changed the model: the float checkpoint's logits are elsewhere.
    assert np.abs(made.reference - logits).max() > 1e-3


def test_fp8_checkpoint_quantized_while_loading_equals_quantize_after(fp8):
    folder, made, *_ = fp8
    after = from_pretrained(folder)
    after.quantize("int8")
    during = from_pretrained(folder, quantize="int8")
    assert during.blocks[0].attention.quantization_mode == "int8"
    ids = made.token_ids.astype("int32")
    np.testing.assert_array_equal(
        ops.convert_to_numpy(during(ids)), ops.convert_to_numpy(after(ids))
    )


@pytest.mark.backend_independent
def test_blocks_agree_with_transformers_quantizer_and_dequantizer(fp8):
    from types import SimpleNamespace

    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

    from keras_mha.models.quantized_checkpoints import dequantize_blocks

    _, _, _, tensors, stored = fp8
    name = "model.layers.0.mlp.down_proj.weight"  # (64, 96): whole 32x48 blocks
    config = FineGrainedFP8Config(weight_block_size=list(BLOCK))
    theirs = Fp8Quantize(SimpleNamespace(quantization_config=config))._quantize_one(
        name, tensors[name]
    )
    assert torch.equal(theirs[name].view(torch.uint8), stored[name].view(torch.uint8))
    torch.testing.assert_close(theirs[name + "_scale_inv"], stored[name + "_scale_inv"])
    expected = Fp8Dequantize(SimpleNamespace(quantization_config=config))._dequantize_one(
        stored[name], stored[name + "_scale_inv"], torch.float32
    )
    codes = stored[name].view(torch.uint8).numpy().view("float8_e4m3fn")
    ours = dequantize_blocks(codes, stored[name + "_scale_inv"].numpy(), BLOCK)
    np.testing.assert_array_equal(ours, expected.numpy())
    # A partial last block (q_proj: 64 columns in blocks of 48), against torch's reference.
    name = "model.layers.0.self_attn.q_proj.weight"
    codes = stored[name].view(torch.uint8).numpy().view("float8_e4m3fn")
    ours = dequantize_blocks(codes, stored[name + "_scale_inv"].numpy(), BLOCK, "bfloat16")
    expected = dequantize_reference(stored[name], stored[name + "_scale_inv"]).to(torch.bfloat16)
    np.testing.assert_array_equal(ours.astype("float32"), expected.float().numpy())


def _malformed(folder, tensors, quantization):
    folder.mkdir()
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"))
    config = {"model_type": "qwen2", "quantization_config": quantization}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


CODES = torch.ones(64, 96).to(torch.float8_e4m3fn)
SCALE = torch.ones(2, 2)
W = "model.layers.0.mlp.down_proj.weight"
FP8 = {"quant_method": "fp8", "weight_block_size": [32, 48]}
MALFORMED = {
    "scale shape": (
        {W: CODES, W + "_scale_inv": torch.ones(2, 3)},
        FP8,
        CheckpointError,
        r"'model.layers.0.mlp.down_proj.weight_scale_inv' has shape \(2, 3\); .* of shape "
        r"\(64, 96\) in blocks of 32x48 .* needs \(2, 2\)",
    ),
    "int8 weight": (
        {W: torch.ones(64, 96, dtype=torch.int8), W + "_scale_inv": SCALE},
        FP8,
        CheckpointError,
        "has dtype I8 but a scale_inv beside it; expected F8_E4M3",
    ),
    "e5m2 weight": (
        {W: torch.ones(64, 96).to(torch.float8_e5m2)},
        FP8,
        CheckpointError,
        "has dtype F8_E5M2; expected F8_E4M3",
    ),
    "missing scale": (
        {W: CODES},
        FP8,
        CheckpointError,
        "is F8_E4M3 but has no 'model.layers.0.mlp.down_proj.weight_scale_inv'",
    ),
    "scale without weight": (
        {W + "_scale_inv": SCALE},
        FP8,
        CheckpointError,
        "has no weight 'model.layers.0.mlp.down_proj.weight' beside it",
    ),
    "scale dtype": (
        {W: CODES, W + "_scale_inv": torch.ones(2, 2, dtype=torch.int32)},
        FP8,
        CheckpointError,
        r"has dtype I32; expected one of \['F32', 'BF16', 'F16'\]",
    ),
    "static activations": (
        {W: CODES, W + "_scale_inv": SCALE},
        {**FP8, "activation_scheme": "static"},
        UnsupportedModelError,
        "activation_scheme='static'",
    ),
    "fmt": ({W: CODES}, {**FP8, "fmt": "e5m2"}, UnsupportedModelError, "fmt='e5m2'"),
    "block size": (
        {W: CODES},
        {**FP8, "weight_block_size": [128]},
        ConfigError,
        r"weight_block_size=\[128\]; expected two positive integers",
    ),
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_fp8_checkpoints_are_refused_in_one_line(tmp_path, case):
    tensors, quantization, error_class, message = MALFORMED[case]
    folder = _malformed(tmp_path / "model", tensors, quantization)
    with pytest.raises(error_class, match=message) as error:
        from_pretrained(folder)
    assert "\n" not in str(error.value)
