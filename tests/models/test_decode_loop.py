"""`generate`'s decode loops (one compiled program on JAX and TensorFlow, tokens chosen on
the device on PyTorch) against its per-token path, token for token: greedy, seeded
sampling with `top_k` / `top_p` and EOS stops. (Left-padded prompts take the default
path, the loop on JAX and TensorFlow, in test_parity's comparison with transformers.)"""

import keras
import numpy as np
import pytest

from keras_mha.backends.common import decode_copies
from keras_mha.errors import UsageError
from keras_mha.models import generate, generation_stats
from keras_mha.models.decode_loop import Sampling, choose_tokens, uniform_draws
from keras_mha.models.generation import _choose
from tests.models_checkpoints import loaded

LOOP = "device_loop" if keras.backend.backend() == "torch" else "loop"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return loaded(tmp_path_factory, "llama")


def test_the_default_path_is_the_measured_fastest(llama):
    made, model = llama
    generate(model, made.token_ids[:, :4], 2)
    stats = generation_stats(model)
    if keras.backend.backend() != "torch":
        assert stats["path"] == "loop"
        return
    # On the CPU: the whole model's step in torch ops, tokens chosen on the device, on
    # the thread count that timed fastest; with a key mask, the layers' steps.
    assert (stats["path"], stats["step"]) == ("device_loop", "whole_model"), stats
    assert "decode_threads" in stats
    padding_mask = np.ones((2, 4), dtype=bool)
    padding_mask[1, 0] = False
    generate(model, made.token_ids[:, :4], 2, padding_mask=padding_mask)
    stats = generation_stats(model)
    assert (stats["path"], stats["step"]) == ("per_token", "layers"), stats


@pytest.mark.parametrize(
    "options",
    [{}, {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 2}],
    ids=["greedy", "sampled"],
)
def test_the_loop_gives_the_per_token_tokens(llama, options):
    made, model = llama
    # test_loading's sampling prompts (4 tokens): the compiled prefill is shared.
    prompt = made.token_ids[:, :4]
    expected = generate(model, prompt, 9, decode_path="per_token", **options)
    # EOS ids from the tokens: each row ends at its own step, the loop stops after both.
    eos = [int(expected[0, 6]), int(expected[1, 8])]
    stopped = generate(model, prompt, 9, decode_path="per_token", eos_token_id=eos, **options)
    assert stopped.shape[1] < expected.shape[1] or np.isin(stopped[:, -1], eos).all()
    if not options:  # a loop that cannot stop is another program: greedy only
        np.testing.assert_array_equal(generate(model, prompt, 9, decode_path=LOOP), expected)
    looped = generate(model, prompt, 9, decode_path=LOOP, eos_token_id=eos, **options)
    assert generation_stats(model)["path"] == LOOP
    np.testing.assert_array_equal(looped, stopped)


@pytest.mark.parametrize(
    "sampling",
    [Sampling(0.8), Sampling(1.3, top_k=7), Sampling(0.6, top_p=0.5), Sampling(1.0, 3, 0.9)],
)
def test_tokens_chosen_on_the_device_are_the_hosts(sampling):
    logits = np.random.default_rng(5).normal(size=(16, 40)).astype("float32") * 3
    expected = _choose(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                       np.random.default_rng(9))  # fmt: skip
    draws = uniform_draws(np.random.default_rng(9), 1, 16)[0]
    values = tuple(keras.ops.convert_to_tensor(v) for v in sampling.values())
    chosen = choose_tokens(
        keras.ops.convert_to_tensor(logits),
        sampling.key(40),
        keras.ops.convert_to_tensor(draws),
        values,
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(chosen), expected)


def test_a_path_the_backend_lacks_is_refused(llama):
    made, model = llama
    missing = "loop" if keras.backend.backend() == "torch" else "device_loop"
    with pytest.raises(UsageError, match=f"decode_path='{missing}' is not available on"):
        generate(model, made.token_ids[:, :4], 2, decode_path=missing)
    with pytest.raises(UsageError, match=r"decode_path='fast'; expected one of auto, loop"):
        generate(model, made.token_ids[:, :4], 2, decode_path="fast")


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the CUDA-graph path is PyTorch's")
def test_a_failing_cuda_graph_path_falls_back_to_steps(llama, monkeypatch):
    from keras_mha.backends.torch import generation as home
    from keras_mha.models.generation import _decoder_for

    made, model = llama
    prompt = made.token_ids[:, :4]
    expected = generate(model, prompt, 5, decode_path="per_token")
    decoder = _decoder_for(model, compile_torch=False)
    # As on a GPU whose compiler fails: "auto" picks the CUDA-graph path, which raises.
    monkeypatch.setattr(decoder, "paths", ("cuda_graph", "device_loop", "per_token"))
    monkeypatch.setattr(decoder, "cuda_graph_error", None)
    monkeypatch.setattr(decoder, "_cuda_step", None)

    def fails(forward):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(home, "cuda_graph_step", fails)
    np.testing.assert_array_equal(generate(model, prompt, 5), expected)
    stats = generation_stats(model)
    assert stats["path"] == "per_token"
    assert "RuntimeError: operation not permitted" in stats["cuda_graph_error"]
    assert decoder.default_path() == "per_token"  # later calls go there directly
    monkeypatch.delitem(decoder.stats, "cuda_graph_error")


COPIES_HEAD = pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="the compiled loops of JAX and TF keep the copy"
)


@COPIES_HEAD
def test_the_loop_reads_the_tied_head_from_a_copy_made_again_when_the_table_changes(
    tmp_path_factory,
):
    made, model = loaded(tmp_path_factory, "llama_tied_bias")
    prompt = made.token_ids[:, :4]
    np.testing.assert_array_equal(
        generate(model, prompt, 6), generate(model, prompt, 6, decode_path="per_token")
    )
    assert generation_stats(model)["head_copy"]
    copy = decode_copies.kept_head_copy(model)
    generate(model, prompt, 6)
    assert copy.made == 1  # the table did not change: the same copy
    table = model.token_embedding.embeddings
    original = keras.ops.copy(table.value)
    # Another table (embeddings and head alike): a stale copy would score the old one.
    table.assign(keras.ops.flip(original, axis=0) * 3.0)
    try:
        expected = generate(model, prompt, 6, decode_path="per_token")
        np.testing.assert_array_equal(generate(model, prompt, 6), expected)
        assert copy.made == 2
    finally:
        table.assign(original)  # the checkpoint is shared with other modules' tests


@COPIES_HEAD
def test_a_lora_table_enabled_after_the_first_loop_is_read_as_it_is(tmp_path_factory):
    from keras_mha.models import from_pretrained

    made, _ = loaded(tmp_path_factory, "llama_tied_bias")
    model = from_pretrained(made.directory)  # its own: LoRA changes the model
    prompt = made.token_ids[:, :4]
    generate(model, prompt, 6)
    assert generation_stats(model)["head_copy"]
    embedding = model.token_embedding
    embedding.enable_lora(2)
    # LoRA's second factor starts at zero: random, so the table (and the head) change.
    factor = embedding.lora_embeddings_b
    factor.assign(keras.random.normal(factor.shape, seed=1))
    expected = generate(model, prompt, 6, decode_path="per_token")
    np.testing.assert_array_equal(generate(model, prompt, 6), expected)
    assert not generation_stats(model)["head_copy"]
