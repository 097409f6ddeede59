"""PyTorch on the CPU: a whole decoder's single-token step as one function of torch ops.

At a single-token step a small model does almost no arithmetic, so its time is the
host's: every torch call costs a few microseconds to dispatch, and Keras's layer calls
and the layers' checks cost more. `ModelStep` runs the step of a model described by a
`keras_mha.backends.common.decoder_layout.DecoderLayout` on tensors bound once per
`generate` call, in few calls per block:

- one product for the query, key and value projections together, whose matrix also
  holds the query and key kernels with each head's rotating halves swapped (RoPE's
  `rotate_half` is a signed permutation of the projection's columns) and the query
  kernel scaled by the attention scale; RoPE is then `qk * cos + qk_rotated * sin` on
  rows of tables made once (1 and 0 on features that do not rotate);
- the key and value written into the cache in place, one query per KV head group
  attending over the written prefix (a view) in one SDPA call;
- the output projection and the residual in one `addmm` (head gates folded into the
  output kernel when one is not 1), the gate and up projections in one product, the
  activation and gating written into it, the down projection and residual in one `addmm`.

The fused matrices are copies of the kernels: they are made only for models whose
copies fit in `FUSED_BYTES` (the host cost matters for small models; a large one keeps
the layers' eager calls, whose dispatch is a small part of its step). They are made
again when a kernel's tensor changes (assigned, trained or pruned: `ModelStep.matches`).
The result is the layers' step up to float round-off (the products are summed in
another order); `generate`'s tests check that greedy tokens agree.

Example:
    >>> step = ModelStep.bind(layout, caches)  # doctest: +SKIP
    >>> logits = step.logits(torch.tensor([5]), 8)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from keras_mha.backends.common import attention_probe, kv_cache, masks
from keras_mha.backends.torch import model_calls

#: The most bytes of fused projection matrices a `ModelStep` makes (copies of kernels).
FUSED_BYTES = 256 << 20

_functional = torch.nn.functional
_sdpa = _functional.scaled_dot_product_attention


def _tensor(variable):
    return None if variable is None else model_calls._tensor(variable)


def _layout_tensors(layout):
    """Every variable of `layout` with its tensor and in-place version, in order."""
    variables = [layout.token_embedding, layout.position_embedding]

    def norm(record):
        if record is not None:
            variables.extend((record.scale, record.bias))

    for block in layout.blocks:
        attention = block.attention
        for name in ("query", "key", "value"):
            variables.append(getattr(attention, f"{name}_kernel"))
            variables.append(
                getattr(attention, f"{name}_bias", None) if attention.use_bias else None
            )
        variables.append(attention.output_kernel)
        variables.append(attention.output_bias if attention.use_output_bias else None)
        variables.append(attention.head_gates)
        for record in (block.attention_norm, block.post_attention_norm, block.mlp_norm,
                       block.post_mlp_norm):  # fmt: skip
            norm(record)
        for dense in (block.gate, block.up, block.down):
            if dense is not None:
                variables.extend((dense.kernel, dense.bias))
    norm(layout.final_norm)
    if layout.lm_head is not None:
        variables.extend((layout.lm_head.kernel, layout.lm_head.bias))
    found = []
    for variable in variables:
        tensor = _tensor(variable)
        found.append((tensor, None if tensor is None else tensor._version))
    return found


def fused_bytes(layout) -> int:
    """Bytes of the matrices `ModelStep` makes for `layout`: QKV (and the rotated QK
    copy), the gated MLP's gate and up together, gated output kernels."""
    total = 0
    for block in layout.blocks:
        attention = block.attention
        for kernel in (attention.query_kernel, attention.key_kernel, attention.value_kernel):
            total += _numel(kernel)
        if attention.use_rope:
            total += _numel(attention.query_kernel) + _numel(attention.key_kernel)
        if block.gate is not None:
            total += _numel(block.gate.kernel) + _numel(block.up.kernel)
    return total * 4


def _numel(variable):
    count = 1
    for size in variable.shape:
        count *= int(size)
    return count


def serves(layout, caches) -> bool:
    """Whether a `ModelStep` can run `layout` on `caches`: float caches (`KVCache`) on
    the CPU, one per block, fused copies within `FUSED_BYTES`, no attention recorded."""
    if layout is None or len(caches) != len(layout.blocks):
        return False
    for cache in caches:
        if type(cache) is not kv_cache.KVCache or not isinstance(cache.key, torch.Tensor):
            return False
        if cache.key.device.type != "cpu" or cache.key.dtype != torch.float32:
            return False
    if any(attention_probe.is_recording(block.attention) for block in layout.blocks):
        return False
    if model_calls.eager_calls() is None:  # a Keras scope: a variable's tensor is not its value
        return False
    return fused_bytes(layout) <= FUSED_BYTES


class _Block:
    """One block's bound tensors and traits (see the module docstring)."""

    def __init__(self, block, rope_tables):
        attention = block.attention
        self.heads, self.key_heads = attention.num_heads, attention.num_key_value_heads
        self.head_dim = head_dim = attention.head_dim
        self.window = attention.sliding_window
        self.causal = attention.causal
        options = attention._attention_options(None, False, None)
        scale = options.scale
        query = _tensor(attention.query_kernel) * scale
        key = _tensor(attention.key_kernel)
        value = _tensor(attention.value_kernel)
        biases = None
        if attention.use_bias:
            biases = (
                _tensor(attention.query_bias) * scale,
                _tensor(attention.key_bias),
                _tensor(attention.value_bias),
            )
        columns = [query, key, value]
        bias_columns = None if biases is None else list(biases)
        self.rope = None
        rotary_dim = attention.rotary_embedding.rotary_dim(head_dim) if attention.use_rope else 0
        if rotary_dim:
            columns += [_rotate_half(query, rotary_dim), _rotate_half(key, rotary_dim)]
            if biases is not None:
                bias_columns += [
                    _rotate_half(biases[0], rotary_dim),
                    _rotate_half(biases[1], rotary_dim),
                ]
            self.rope = rope_tables.tables(attention, rotary_dim)
        inputs = query.shape[0]
        self.qkv = torch.cat([c.reshape(inputs, -1) for c in columns], dim=1)
        self.qkv_bias = None
        if bias_columns is not None:
            self.qkv_bias = torch.cat([b.reshape(-1) for b in bias_columns])
        self.query_width = self.heads * head_dim
        self.qk_width = self.query_width + self.key_heads * head_dim
        self.value_end = self.qk_width + self.key_heads * head_dim
        output = _tensor(attention.output_kernel)
        gates = _tensor(attention.head_gates)
        if not bool((gates == 1).all()):
            output = output * gates.to(output.dtype)[:, None, None]
        self.output = output.reshape(-1, output.shape[-1])
        self.output_bias = _tensor(attention.output_bias) if attention.use_output_bias else None
        self.attention_norm = _Norm(block.attention_norm)
        self.post_attention_norm = _Norm.optional(block.post_attention_norm)
        self.mlp_norm = _Norm(block.mlp_norm)
        self.post_mlp_norm = _Norm.optional(block.post_mlp_norm)
        self.parallel = block.parallel_residual
        self.activation = model_calls.activation(*block.activation)
        self.intermediate = int(block.up.kernel.shape[-1])
        if block.gate is None:
            self.up, self.up_bias = _tensor(block.up.kernel), _tensor(block.up.bias)
        else:
            self.up = torch.cat([_tensor(block.gate.kernel), _tensor(block.up.kernel)], dim=1)
            self.up_bias = None
            if block.gate.bias is not None:
                self.up_bias = torch.cat([_tensor(block.gate.bias), _tensor(block.up.bias)])
        self.gated = block.gate is not None
        self.down, self.down_bias = _tensor(block.down.kernel), _tensor(block.down.bias)

    def attend(self, x, cache, position):
        """The attention branch's output `(B, hidden)` before its residual."""
        batch = x.shape[0]
        hidden = self.attention_norm(x)
        projected = _linear(hidden, self.qkv, self.qkv_bias)
        if self.rope is None:
            query_key = projected[:, : self.qk_width]
        else:
            cos, sin = self.rope
            query_key = projected[:, : self.qk_width].mul(cos[position])
            query_key.addcmul_(projected[:, self.value_end :], sin[position])
        head_dim, key_heads = self.head_dim, self.key_heads
        cache.key.select(2, position).copy_(
            query_key[:, self.query_width :].view(batch, key_heads, head_dim)
        )
        cache.value.select(2, position).copy_(
            projected[:, self.qk_width : self.value_end].view(batch, key_heads, head_dim)
        )
        first, stop = masks.visible_prefix(position, 1, self.window, self.causal)
        # The query heads of each KV head's group are that head's queries: plain SDPA.
        queries = query_key[:, : self.query_width].view(batch, key_heads, -1, head_dim)
        keys = cache.key.narrow(2, first, stop - first)
        values = cache.value.narrow(2, first, stop - first)
        attended = _sdpa(queries, keys, values, scale=1.0).view(batch, -1)
        return attended

    def __call__(self, x, cache, position):
        attended = self.attend(x, cache, position)
        if self.parallel:
            outputs = self._attention_output(attended, x)
            return self._mlp(self.mlp_norm(x), outputs)
        hidden = self._attention_output(attended, x)
        return self._mlp(self.mlp_norm(hidden), hidden)

    def _attention_output(self, attended, residual):
        if self.post_attention_norm is None:
            if self.output_bias is None:
                return torch.addmm(residual, attended, self.output)
            return torch.addmm(self.output_bias, attended, self.output).add_(residual)
        output = self.post_attention_norm(_linear(attended, self.output, self.output_bias))
        return output.add_(residual)

    def _mlp(self, hidden, residual):
        """`residual + mlp(hidden)` (`hidden` normalised)."""
        up = _linear(hidden, self.up, self.up_bias)
        if self.gated:
            inner = self.activation(up[:, : self.intermediate]).mul_(up[:, self.intermediate :])
        else:
            inner = self.activation(up)
        if self.post_mlp_norm is None and self.down_bias is None:
            return torch.addmm(residual, inner, self.down)
        output = _linear(inner, self.down, self.down_bias)
        if self.post_mlp_norm is not None:
            output = self.post_mlp_norm(output)
        return output.add_(residual)


def _linear(rows, matrix, bias):
    return rows @ matrix if bias is None else torch.addmm(bias, rows, matrix)


def _rotate_half(kernel, rotary_dim):
    """`kernel` `(..., D)` with RoPE's `rotate_half` applied to its last axis's first
    `rotary_dim` features (`[-second, first]`) and zeros after them: `x @ W` rotated is
    `x @ _rotate_half(W)`, exactly (a signed permutation)."""
    half = rotary_dim // 2
    parts = [-kernel[..., half:rotary_dim], kernel[..., :half]]
    if rotary_dim < kernel.shape[-1]:
        parts.append(torch.zeros_like(kernel[..., rotary_dim:]))
    return torch.cat(parts, dim=-1)


class _Norm:
    """An RMS norm or LayerNorm over the last axis, in float32 (`NormLayout`)."""

    def __init__(self, record):
        self.epsilon = record.epsilon
        self.shape = (int(record.scale.shape[-1]),)
        scale = _tensor(record.scale)
        self.rms = record.kind == "rms"
        self.weight = scale + record.scale_offset if record.scale_offset else scale
        self.bias = _tensor(record.bias)

    @classmethod
    def optional(cls, record):
        return None if record is None else cls(record)

    def __call__(self, x):
        if self.rms:
            # Not `rms_norm`, which on the CPU runs as some ten calls and conversions.
            scale = (x * x).mean(dim=-1, keepdim=True).add_(self.epsilon).rsqrt_()
            return (x * scale).mul_(self.weight)
        return _functional.layer_norm(x, self.shape, self.weight, self.bias, self.epsilon)


class RopeTables:
    """RoPE's `cos` and `sin` rows per position, `(1, (heads + kv_heads) * head_dim)`
    each, for the layers of one model: angles as `eager_decode._rotation` computes
    them (float32 positions times float32 inverse frequencies), 1 and 0 on features that
    do not rotate; the rows are views kept in lists, read without a torch call."""

    def __init__(self, length):
        self.length = length
        self._tables = {}

    def tables(self, attention, rotary_dim):
        rope = attention.rotary_embedding
        frequencies = rope._inverse_frequencies(rotary_dim)
        heads = attention.num_heads + attention.num_key_value_heads
        key = (frequencies, attention.head_dim, heads)
        found = self._tables.get(key)
        if found is None:
            inverse = torch.tensor(frequencies, dtype=torch.float32)
            positions = torch.arange(self.length, dtype=torch.int32).float()
            angles = positions[:, None] * inverse
            angles = torch.cat([angles, angles], dim=-1)
            passing = attention.head_dim - rotary_dim
            cos = torch.cat([angles.cos(), torch.ones(self.length, passing)], dim=-1)
            sin = torch.cat([angles.sin(), torch.zeros(self.length, passing)], dim=-1)
            found = self._tables[key] = tuple(
                list(table.repeat(1, heads)[:, None].unbind(0)) for table in (cos, sin)
            )
        return found


class ModelStep:
    """A `DecoderLayout`'s single-token step on bound tensors: `logits(tokens, position)`.

    Made by `bind`; `matches(layout)` says whether the model's tensors are still those
    bound (a kernel assigned, trained or replaced since needs a new `ModelStep`).
    """

    def __init__(self, layout, length):
        self.fingerprint = _layout_tensors(layout)
        self.length = length
        tables = RopeTables(length)
        self.blocks = [_Block(block, tables) for block in layout.blocks]
        self.table = _tensor(layout.token_embedding)
        self.positions = _tensor(layout.position_embedding)
        self.embedding_scale = layout.embedding_scale
        if self.embedding_scale is not None:  # Gemma rounds sqrt(hidden) to the dtype first
            self.embedding_scale = float(torch.tensor(self.embedding_scale, dtype=torch.float32))
        self.final_norm = _Norm(layout.final_norm)
        if layout.lm_head is None:
            self.head, self.head_bias = self.table.t(), None
        else:
            self.head = _tensor(layout.lm_head.kernel)
            self.head_bias = _tensor(layout.lm_head.bias)
        self.soft_cap = layout.logit_soft_cap
        self.caches = None

    @classmethod
    def bind(cls, layout, caches, previous=None):
        """A `ModelStep` for `layout` on `caches` (reusing `previous` when its tensors
        are still the model's and its RoPE tables long enough), or None where it does
        not serve them (`serves`)."""
        if not serves(layout, caches):
            return None
        length = int(caches[0].key.shape[2])
        step = previous
        if step is None or step.length < length or not step.matches(layout):
            step = cls(layout, length)
        step.caches = list(caches)
        return step

    def matches(self, layout):
        fingerprint = _layout_tensors(layout)
        if len(fingerprint) != len(self.fingerprint):
            return False
        return all(
            a is b and version == known
            for (a, version), (b, known) in zip(fingerprint, self.fingerprint, strict=True)
        )

    def logits(self, tokens, position):
        """`(B, V)` float32 logits of `tokens` `(B,)` written into the bound caches at
        `position` (an int below the caches' length)."""
        if not 0 <= position < self.caches[0].key.shape[2]:
            kv_cache.check_static_write(position, 1, self.caches[0].key.shape[2])
        x = _functional.embedding(tokens, self.table)
        if self.embedding_scale is not None:
            x = x * self.embedding_scale
        if self.positions is not None:
            x = x + self.positions[position]
        for block, cache in zip(self.blocks, self.caches, strict=True):
            x = block(x, cache, position)
        logits = _linear(self.final_norm(x), self.head, self.head_bias)
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return logits

    def forward(self, token_ids, key_mask, caches, index):
        """`generate`'s step signature: `(logits (B, V), caches)` for `token_ids` `(B, 1)`
        at `index`, with no key mask, on the bound caches."""
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # cheaper than `torch.no_grad()`'s wrapper
        try:
            return self.logits(token_ids.reshape(-1).long(), int(index)), caches
        finally:
            torch._C._set_grad_enabled(enabled)


__all__ = ["FUSED_BYTES", "ModelStep", "RopeTables", "fused_bytes", "serves"]
