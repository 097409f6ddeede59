"""PyTorch: `generate`'s decode loop with the tokens chosen on the device, and on CUDA the
model's step compiled into CUDA graphs.

On a GPU an eager step is host-bound: launching a 1B model's few hundred kernels one by
one takes longer than reading its weights. `cuda_graph_step` compiles the model's
one-token step with `torch.compile` and Inductor's CUDA graphs (what `mode=
"reduce-overhead"` turns on), guarding only the tensors' shapes, with the caches marked
as static addresses (they are written in place, which CUDA graphs allow only for
buffers that never move), as gpt-fast and transformers' static cache do. `device_loop`
runs the steps without reading anything back per token: the next token is chosen on the
device (`keras_mha.models.decode_loop.chooser`), fed to the next step as it is, and the tokens come
back once, at the end; whether every row has ended is read every `STOP_CHECK` tokens
only (the extra steps are cut off afterwards, so the tokens are the per-token path's).

Example:
    >>> step = cuda_graph_step(forward)  # doctest: +SKIP
    >>> tokens, count = device_loop(step, choose, logits, caches, None, 7, 32, 2, False)
    ... # doctest: +SKIP
"""

from __future__ import annotations

import keras

from keras_mha.backends.common import kv_cache
from keras_mha.backends.torch.model_step import ModelStep
from keras_mha.backends.torch.threads import DecodeThreads

#: Tokens between two reads of "has every row ended?" (each read waits for the device).
STOP_CHECK = 16


def on_cuda(model) -> bool:
    """Whether `model`'s weights live on a CUDA device."""
    import torch

    if not torch.cuda.is_available() or not model.variables:
        return False
    return model.variables[0].value.device.type == "cuda"


def decode_threads(model):
    """A `DecodeThreads` that picks the intra-op thread count of `model`'s decode steps on
    the CPU; None on CUDA, whose kernels do not run on torch's CPU threads."""
    return None if on_cuda(model) else DecodeThreads()


def cuda_graph_step(forward):
    """`step(token_ids, key_mask, caches, position) -> logits`: `forward` compiled with
    CUDA graphs; the int `position` goes in as a 0-d tensor on the device, filled by a
    kernel (not copied from the host, which would wait for the device)."""
    import torch

    def step(token_ids, key_mask, caches, index):
        # The loop checked that every write fits the cache: no guard in the graph.
        with kv_cache.index_checked_by_caller():
            return forward(token_ids, key_mask, caches, index)[0]

    def tensor_guards(guard_entries):
        return torch.compiler.keep_tensor_guards_unsafe(guard_entries, keep_parameters=True)

    compiled = torch.compile(
        step,
        dynamic=False,
        options={"triton.cudagraphs": True, "guard_filter_fn": tensor_guards},
    )
    marked = set()
    indices = {}  # device -> the 0-d int32 position tensor

    def run(token_ids, key_mask, caches, position):
        for buffer in keras.tree.flatten(caches):
            if id(buffer) not in marked:  # written in place: CUDA graphs need it fixed
                torch._dynamo.mark_static_address(buffer)
                marked.add(id(buffer))
        index = indices.get(token_ids.device)
        if index is None:
            index = indices[token_ids.device] = torch.zeros(
                (), dtype=torch.int32, device=token_ids.device
            )
        index.fill_(position)
        return compiled(token_ids, key_mask, caches, index)

    return run


def model_step(layout, caches, previous=None):
    """`generate`'s step over the whole model in torch ops (`model_step.ModelStep`) for
    `layout` (a `DecoderLayout`, or None) on `caches`, or None where it does not serve
    them (then the layers' eager calls run); `previous` is reused while it matches."""
    return ModelStep.bind(layout, caches, previous)


def host_conversions():
    """`per_token`'s `(logits -> NumPy, NumPy token ids -> tensor)` for the whole-model
    step (CPU tensors): torch's own, sharing memory, a few microseconds where Keras's
    conversions take tens.

    Example:
        >>> to_numpy, to_tensor = host_conversions()
        >>> to_numpy(to_tensor(np.arange(3, dtype="float32")))
        array([0., 1., 2.], dtype=float32)
    """
    import torch

    return _detached_numpy, torch.from_numpy


def _detached_numpy(tensor):
    return tensor.detach().numpy()


def greedy(logits, step, finished):
    """`device_loop`'s `choose` for greedy tokens without EOS ids: the argmax (ties to
    the lowest id, as `decode_loop.choose_tokens`) in one torch call."""
    return logits.argmax(-1), finished


def eager_step(forward):
    """`forward`'s logits, the step of `device_loop` without compilation (any device)."""

    def step(token_ids, key_mask, caches, index):
        return forward(token_ids, key_mask, caches, index)[0]

    return step


def device_loop(step, choose, logits, caches, key_mask, length, count, batch, stops):
    """`(tokens (B, n) int32, n)`: up to `count` new tokens from the prefill's `logits`,
    each chosen on the device by `choose(logits, step, finished) -> (chosen, finished)`
    (`decode_loop.chooser`); `step` is `cuda_graph_step(...)` or `eager_step(...)`.
    With `stops` (EOS ids given), the loop ends at the first check after every row has.
    """
    import torch

    finished = torch.zeros((batch,), dtype=torch.bool, device=logits.device)
    chosen_tokens = []
    with torch.no_grad():
        for step_number in range(count):
            if step_number:
                position = length + step_number - 1
                logits = step(chosen_tokens[-1][:, None], key_mask, caches, position)
            chosen, finished = choose(logits, step_number, finished)
            chosen_tokens.append(chosen)
            if stops and step_number % STOP_CHECK == STOP_CHECK - 1 and finished.all():
                break
        tokens = torch.stack(chosen_tokens, dim=1)
    return tokens, tokens.shape[1]


__all__ = [
    "STOP_CHECK",
    "cuda_graph_step",
    "decode_threads",
    "device_loop",
    "eager_step",
    "greedy",
    "host_conversions",
    "model_step",
    "on_cuda",
]
