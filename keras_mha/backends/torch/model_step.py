"""PyTorch on the CPU: a whole decoder's single-token step as one function of torch ops.

At a single-token step a small model does almost no arithmetic, so its time is the
host's: every torch call costs a few microseconds to dispatch, and Keras's layer calls
and the layers' checks cost more. A large model's step is its weights read once, at
the memory's bandwidth. `ModelStep` runs the step of a model described by a
`keras_mha.backends.common.decoder_layout.DecoderLayout` on tensors bound once per
`generate` call, in few calls per block and reading each weight once:

- the query, key and value projections as one product (`_Product`), the query kernel
  scaled by the attention scale;
- RoPE as one complex product on the projected row (`_Rotation`): each head's rotating
  features sit in pairs `(x_j, x_{j + half})` side by side, so a complex view of them
  times `cos + i sin` is `x * cos + rotate_half(x) * sin`, and one `index_select` puts the
  row back in the heads' order; no rotated copy of the kernels is read;
- the key and value written into the cache in place, one query per KV head group
  attending over the written prefix (a view) in one SDPA call;
- the output projection and the residual in one `addmm_` (head gates folded into the
  output kernel when one is not 1), the gate and up projections in one product, the
  activation and gating written into it, the down projection and residual in one `addmm_`;
- an RMS norm before a product as its scale folded into the product's matrix and one
  factor per row (`_Norm`); the hidden state, the projections and the MLP's activations
  in buffers made once per batch size, with their views.

The fused matrices (QKV with the query and key columns in the rotation's order, gate
and up, the output kernel with gates, the LM head with the final norm; laid out
`(inputs, units)`: a tied head read through the table's transposed view streams
slower) are copies of the kernels, made only for models whose copies fit in
`FUSED_BYTES`. A larger model (`ModelStep.fused` False) runs the same step on its own
tensors, so its memory stays the model's: one product per kernel, the norms applied to
the row, the row gathered into the rotation's order first, the attention scale given
to SDPA and head gates applied to the attended rows. Its dispatch is a small part of
its step. The copies are made again when a kernel's tensor changes (assigned, trained
or pruned: `ModelStep.matches`). The result is the layers' step up to float round-off
(the products are summed in another order); `generate`'s tests check that greedy
tokens agree.

Example:
    >>> step = ModelStep.bind(layout, caches)  # doctest: +SKIP
    >>> logits = step.logits(torch.tensor([5]), 8)  # doctest: +SKIP
"""

from __future__ import annotations

import math

import torch

from keras_mha.backends.common import attention_probe, decode_copies, kv_cache, masks
from keras_mha.backends.torch import model_calls
from keras_mha.backends.torch.tensors import rows_linear

#: The most bytes of fused projection matrices a `ModelStep` makes (copies of kernels).
FUSED_BYTES = decode_copies.DECODE_COPY_BYTES

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
    """Bytes of the matrices `ModelStep` copies for `layout` when it fuses them (at most):
    QKV, the output kernels, the MLP's gate and up, the LM head."""
    total = 0
    for block in layout.blocks:
        attention = block.attention
        for kernel in (attention.query_kernel, attention.key_kernel, attention.value_kernel):
            total += _numel(kernel)
        total += _numel(attention.output_kernel) + _numel(block.up.kernel)
        if block.gate is not None:
            total += _numel(block.gate.kernel)
    head = layout.token_embedding if layout.lm_head is None else layout.lm_head.kernel
    return (total + _numel(head)) * 4


def _numel(variable):
    return math.prod(int(size) for size in variable.shape)


def serves(layout, caches) -> bool:
    """Whether a `ModelStep` can run `layout` on `caches`: float caches (`KVCache`) on
    the CPU, one per block, no attention recorded."""
    if layout is None or len(caches) != len(layout.blocks):
        return False
    for cache in caches:
        if type(cache) is not kv_cache.KVCache or not isinstance(cache.key, torch.Tensor):
            return False
        if cache.key.device.type != "cpu" or cache.key.dtype != torch.float32:
            return False
    if any(attention_probe.is_recording(block.attention) for block in layout.blocks):
        return False
    # A Keras scope: a variable's tensor is not its value.
    return model_calls.eager_calls() is not None


_POSITIONS: list = []


def _position(index):
    """The `(1,)` int64 tensor of a cache position, made once (`index_copy_` reads it)."""
    while len(_POSITIONS) <= index:
        _POSITIONS.append(torch.tensor([len(_POSITIONS)], dtype=torch.int64))
    return _POSITIONS[index]


def _rows(batch, width):
    """A zero `(batch, width)` buffer whose rows start at even offsets (a complex view of
    its columns needs them)."""
    return torch.zeros(batch, width + width % 2)[:, :width]


class _Norm:
    """An RMS norm or LayerNorm over the last axis (`NormLayout`), float32.

    Before a fused product, an RMS norm's scale is folded into the product's matrix
    (`fold`), and the per-row factor `rsqrt(sum(x^2) + width * epsilon)` (`factor`,
    one batched dot product plus the offset, and one in-place call) multiplies the
    product's rows: the same value as normalising first, in three calls instead of six.
    """

    def __init__(self, record):
        self.rms = record.kind == "rms"
        self.epsilon = record.epsilon
        self.width = int(record.scale.shape[-1])
        scale = _tensor(record.scale)
        self.weight = scale + record.scale_offset if record.scale_offset else scale
        self.bias = _tensor(record.bias)
        self.folded = self.weight * self.width**0.5 if self.rms else None
        self.offset = torch.full((1, 1, 1), self.width * self.epsilon)

    @classmethod
    def optional(cls, record):
        return None if record is None else cls(record)

    def fold(self, matrix):
        """`matrix` `(width, units)` with the RMS scale (and `sqrt(width)`) folded in."""
        return matrix * self.folded[:, None]

    def factor(self, buffers):
        """`(B, 1)`: `rsqrt(sum(x^2) + width * epsilon)` of `buffers.x`'s rows."""
        torch.baddbmm(self.offset, buffers.rows, buffers.columns, out=buffers.squares).rsqrt_()
        return buffers.factor

    def normalized(self, buffers):
        """The norm of `buffers.x`: into `buffers.normed` (RMS) or a new tensor."""
        if self.rms:
            factor = self.factor(buffers)
            return torch.mul(buffers.x, factor, out=buffers.normed).mul_(self.folded)
        return self(buffers.x)

    def __call__(self, x):
        """The norm of `x`, as a new tensor."""
        if self.rms:
            scale = (x * x).mean(dim=-1, keepdim=True).add_(self.epsilon).rsqrt_()
            return (x * scale).mul_(self.weight)
        return _functional.layer_norm(x, (self.width,), self.weight, self.bias, self.epsilon)


class _Product:
    """`norm(x) @ [m_1 | m_2 | ...] + bias`, written into a buffer.

    Fused: one product on a copy of the matrices side by side, laid out `(inputs,
    units)` (a transposed view, such as a tied head's table, streams slower), with an RMS
    norm's scale folded in (`_Norm`). Else one product per matrix on the model's own
    tensors after the norm: no copy.
    """

    def __init__(self, norm, matrices, bias, fused):
        self.norm = norm
        self.bias = bias
        self.width = sum(int(matrix.shape[1]) for matrix in matrices)
        self.folded = fused and norm.rms
        if fused:
            matrix = torch.cat(matrices, dim=1) if len(matrices) > 1 else matrices[0]
            matrices = [(norm.fold(matrix) if norm.rms else matrix).contiguous()]
        self.matrices = matrices

    def __call__(self, buffers, out=None):
        """The product, into `out` (a new tensor when None; one matrix only)."""
        if self.folded:
            factor = self.norm.factor(buffers)
            out = torch.mm(buffers.x, self.matrices[0], out=out)
            out.mul_(factor)
            if self.bias is not None:
                out.add_(self.bias)
            return out
        x = self.norm.normalized(buffers)
        if len(self.matrices) == 1:
            if self.bias is None:
                return torch.mm(x, self.matrices[0], out=out)
            return torch.addmm(self.bias, x, self.matrices[0], out=out)
        start = 0
        for matrix in self.matrices:
            stop = start + matrix.shape[1]
            torch.mm(x, matrix, out=out[:, start:stop])
            start = stop
        if self.bias is not None:
            out.add_(self.bias)
        return out


class _Buffers:
    """A step's hidden state `x` `(B, hidden)`, updated in place, with its views."""

    def __init__(self, batch, hidden):
        self.x = torch.zeros(batch, hidden)
        self.rows = self.x.view(batch, 1, hidden)
        self.columns = self.x.view(batch, hidden, 1)
        self.squares = torch.zeros(batch, 1, 1)
        self.factor = self.squares.view(batch, 1)
        self.normed = torch.zeros(batch, hidden)


class _Rotation:
    """RoPE on the query and key heads of a projected row, as one complex product.

    `order` lays each head's rotating features out as pairs `(x_j, x_{j + half})` side by
    side (the features that do not rotate after all pairs), so that a complex view of the
    pairs times `cos + i sin` is `x * cos + rotate_half(x) * sin`; `inverse` gathers the
    result back into the heads' order for the cache and attention. A fused QKV matrix
    has its query and key columns in `order` already (`permuted`); else the row is
    gathered into it first. The weights are read once: no rotated copy of the kernels.
    """

    def __init__(self, heads, head_dim, rotary_dim, table, permuted):
        half = rotary_dim // 2
        natural = torch.arange(heads * head_dim).view(heads, head_dim)
        pairs = torch.stack([natural[:, :half], natural[:, half:rotary_dim]], dim=-1)
        self.order = torch.cat([pairs.reshape(-1), natural[:, rotary_dim:].reshape(-1)])
        self.inverse = torch.argsort(self.order)
        self.pairs_width = heads * rotary_dim
        self.table = table
        self.permuted = permuted

    def bind(self, projected):
        """The `(B, heads * head_dim)` buffer the rotated row goes to, for `projected`."""
        batch, width = projected.shape[0], self.order.numel()
        self.projected = projected
        self.paired = projected if self.permuted else _rows(batch, width)
        pairs = self.paired[:, : self.pairs_width].view(batch, -1, 2)
        self.pairs = torch.view_as_complex(pairs)
        self.rotated = torch.zeros(batch, width)
        return self.rotated

    def __call__(self, position):
        if not self.permuted:
            torch.index_select(self.projected, 1, self.order, out=self.paired)
        self.pairs.mul_(self.table[position])
        torch.index_select(self.paired, 1, self.inverse, out=self.rotated)


class _Block:
    """One block's bound tensors and traits (see the module docstring); `fused`: its
    products on fused copies of the kernels, else on the model's own tensors."""

    def __init__(self, block, rope_tables, fused):
        attention = block.attention
        self.heads, self.key_heads = attention.num_heads, attention.num_key_value_heads
        self.head_dim = head_dim = attention.head_dim
        self.window = attention.sliding_window
        self.causal = attention.causal
        scale = attention._attention_options(None, False, None).scale
        names = ("query", "key", "value")
        kernels = [_tensor(getattr(attention, f"{name}_kernel")) for name in names]
        inputs = kernels[0].shape[0]
        kernels = [kernel.reshape(inputs, -1) for kernel in kernels]
        biases = None
        if attention.use_bias:
            biases = [_tensor(getattr(attention, f"{name}_bias")).reshape(-1) for name in names]
        # Fused, the attention scale is folded into the query columns; else SDPA applies it.
        self.scale = 1.0 if fused else scale
        if fused:
            kernels[0] = kernels[0] * scale
            if biases is not None:
                biases[0] = biases[0] * scale
        self.rotation = None
        rotary_dim = attention.rotary_embedding.rotary_dim(head_dim) if attention.use_rope else 0
        if rotary_dim:
            heads = self.heads + self.key_heads
            table = rope_tables.tables(attention, rotary_dim, heads)
            self.rotation = _Rotation(heads, head_dim, rotary_dim, table, permuted=fused)
            if fused:
                order = self.rotation.order
                kernels = [torch.cat(kernels[:2], dim=1).index_select(1, order), kernels[2]]
                if biases is not None:
                    biases = [torch.cat(biases[:2]).index_select(0, order), biases[2]]
        self.query_width = self.heads * head_dim
        self.qk_width = self.query_width + self.key_heads * head_dim
        self.value_end = self.qk_width + self.key_heads * head_dim
        self.attention_input = _Product(
            _Norm(block.attention_norm),
            kernels,
            None if biases is None else torch.cat(biases),
            fused,
        )
        output = _tensor(attention.output_kernel)
        gates = _tensor(attention.head_gates)
        self.gates = None
        if not bool((gates == 1).all()):
            if fused:  # folded into a copy of the output kernel
                output = output * gates.to(output.dtype)[:, None, None]
            else:  # on the attended rows
                self.gates = gates.to(output.dtype).view(self.key_heads, -1, 1)
        self.output = output.reshape(-1, output.shape[-1])
        self.output_bias = _tensor(attention.output_bias) if attention.use_output_bias else None
        self.post_attention_norm = _Norm.optional(block.post_attention_norm)
        self.post_mlp_norm = _Norm.optional(block.post_mlp_norm)
        self.parallel = block.parallel_residual
        self.activation = model_calls.activation(*block.activation)
        self.intermediate = int(block.up.kernel.shape[-1])
        self.gated = block.gate is not None
        up, up_bias = [_tensor(block.up.kernel)], _tensor(block.up.bias)
        if self.gated:
            up.insert(0, _tensor(block.gate.kernel))
            if up_bias is not None:
                up_bias = torch.cat([_tensor(block.gate.bias), up_bias])
        self.mlp_input = _Product(_Norm(block.mlp_norm), up, up_bias, fused)
        self.down, self.down_bias = _tensor(block.down.kernel), _tensor(block.down.bias)
        self.batch = None

    def bind(self, batch, cache):
        """Buffers for `batch` rows and their views; `cache` is this block's `KVCache`."""
        if self.batch != batch:
            self.batch = batch
            key_heads, head_dim = self.key_heads, self.head_dim
            self.projected = _rows(batch, self.attention_input.width)
            if self.rotation is None:
                query_key = self.projected[:, : self.qk_width]
            else:
                query_key = self.rotation.bind(self.projected)
            self.queries = query_key[:, : self.query_width].view(batch, key_heads, -1, head_dim)
            self.new_key = query_key[:, self.query_width :].view(batch, key_heads, 1, head_dim)
            self.new_value = self.projected[:, self.qk_width : self.value_end].view(
                batch, key_heads, 1, head_dim
            )
            self.up = torch.zeros(batch, self.mlp_input.width)
            if self.gated:
                self.gate_half = self.up[:, : self.intermediate]
                self.up_half = self.up[:, self.intermediate :]
        self.cache = cache

    def __call__(self, buffers, position):
        """`buffers.x` after this block, in place."""
        x = buffers.x
        if self.parallel:  # both branches read the block's input
            self.mlp_input(buffers, self.up)
            self._attention(buffers, position)
            self._mlp_output(x)
        else:
            self._attention(buffers, position)
            self.mlp_input(buffers, self.up)
            self._mlp_output(x)

    def _attention(self, buffers, position):
        self.attention_input(buffers, self.projected)
        if self.rotation is not None:
            self.rotation(position)
        cache, index = self.cache, _position(position)
        cache.key.index_copy_(2, index, self.new_key)
        cache.value.index_copy_(2, index, self.new_value)
        first, stop = masks.visible_prefix(position, 1, self.window, self.causal)
        keys = cache.key.narrow(2, first, stop - first)
        values = cache.value.narrow(2, first, stop - first)
        # The query heads of each KV head's group are that head's queries: plain SDPA.
        attended = _sdpa(self.queries, keys, values, scale=self.scale)
        if self.gates is not None:
            attended.mul_(self.gates)
        attended = attended.view(self.batch, -1)
        x = buffers.x
        if self.post_attention_norm is not None:
            output = rows_linear(attended, self.output, self.output_bias)
            x.add_(self.post_attention_norm(output))
            return
        x.addmm_(attended, self.output)
        if self.output_bias is not None:
            x.add_(self.output_bias)

    def _mlp_output(self, x):
        if self.gated:
            inner = self.activation(self.gate_half).mul_(self.up_half)
        else:
            inner = self.activation(self.up)
        if self.post_mlp_norm is not None:
            x.add_(self.post_mlp_norm(rows_linear(inner, self.down, self.down_bias)))
            return
        x.addmm_(inner, self.down)
        if self.down_bias is not None:
            x.add_(self.down_bias)


class RopeTables:
    """RoPE's `cos + i sin` rows per position, `(1, heads * rotary_dim / 2)` complex, for
    the layers of one model: one per rotating pair of every head (`_Rotation`'s order),
    angles as `eager_decode._rotation` computes them (float32 positions times float32
    inverse frequencies); the rows are views kept in lists, read without a torch call."""

    def __init__(self, length):
        self.length = length
        self._tables = {}

    def tables(self, attention, rotary_dim, heads):
        frequencies = attention.rotary_embedding._inverse_frequencies(rotary_dim)
        key = (frequencies, heads)
        found = self._tables.get(key)
        if found is None:
            inverse = torch.tensor(frequencies, dtype=torch.float32)
            positions = torch.arange(self.length, dtype=torch.int32).float()
            angles = positions[:, None] * inverse
            rows = torch.complex(angles.cos(), angles.sin()).repeat(1, heads)
            found = self._tables[key] = list(rows[:, None].unbind(0))
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
        # Small models: the products on fused copies of the kernels (fewer calls); else
        # on the model's own tensors, whose memory stays the model's.
        self.fused = fused_bytes(layout) <= FUSED_BYTES
        self.blocks = [_Block(block, tables, self.fused) for block in layout.blocks]
        self.table = _tensor(layout.token_embedding)
        self.hidden_size = int(self.table.shape[1])
        self.positions = _tensor(layout.position_embedding)
        self.embedding_scale = layout.embedding_scale
        if self.embedding_scale is not None:  # Gemma rounds sqrt(hidden) to the dtype first
            self.embedding_scale = float(torch.tensor(self.embedding_scale, dtype=torch.float32))
        head = self.table.t() if layout.lm_head is None else _tensor(layout.lm_head.kernel)
        head_bias = None if layout.lm_head is None else _tensor(layout.lm_head.bias)
        self.head = _Product(_Norm(layout.final_norm), [head], head_bias, self.fused)
        self.soft_cap = layout.logit_soft_cap
        self.buffers = None
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
        batch = int(caches[0].key.shape[0])
        if step.buffers is None or step.buffers.x.shape[0] != batch:
            step.buffers = _Buffers(batch, step.hidden_size)
        for block, cache in zip(step.blocks, caches, strict=True):
            block.bind(batch, cache)
        step.caches = list(caches)
        step.stop = length
        return step

    def release(self):
        """Forget the bound caches (they are not kept alive until the next call)."""
        for block in self.blocks:
            block.cache = None
        self.caches = None

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
        if not 0 <= position < self.stop:
            kv_cache.check_static_write(position, 1, self.stop)
        buffers = self.buffers
        x = torch.index_select(self.table, 0, tokens, out=buffers.x)
        if self.embedding_scale is not None:
            x.mul_(self.embedding_scale)
        if self.positions is not None:
            x.add_(self.positions[position])
        for block in self.blocks:
            block(buffers, position)
        logits = self.head(buffers)  # a new tensor: the caller keeps it past the next step
        if self.soft_cap is not None:
            logits.div_(self.soft_cap).tanh_().mul_(self.soft_cap)
        return logits

    def forward(self, token_ids, key_mask, caches, index):
        """`generate`'s step signature: `(logits (B, V), caches)` for `token_ids` `(B, 1)`
        at `index`, with no key mask, on the bound caches."""
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # cheaper than `torch.no_grad()`'s wrapper
        try:
            return self.logits(token_ids.view(-1), index), caches
        finally:
            torch._C._set_grad_enabled(enabled)


__all__ = ["FUSED_BYTES", "ModelStep", "RopeTables", "fused_bytes", "serves"]
