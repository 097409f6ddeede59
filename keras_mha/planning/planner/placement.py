"""Where the weights and the KV cache live when several devices serve one model, the way
vLLM places them: tensor parallel (each weight split by its `WeightGroup.split` rule,
the KV cache by KV heads, replicated below one head per device; MLA's latent cache whole
on every device) and pipeline parallel (the decoder layers in consecutive stages, as
vLLM's `get_pp_indices`; the first stage also holds the embeddings, the last the LM
head). The rules and the shards they were checked against:
docs/concepts/memory-planner.md. Pure Python.

Example:
    >>> pipeline_stages(80, 3)
    [range(0, 27), range(27, 54), range(54, 80)]
    >>> kv_heads_per_device(8, 16)
    1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keras_mha.errors import UsageError
from keras_mha.planning.planner.inventory import WeightGroup
from keras_mha.planning.planner.quantization import WeightsFormat
from keras_mha.planning.spec import ModelSpec

PARTS = ("embeddings", "attention", "mlp", "norms", "lm_head", "other")


def pipeline_stages(num_layers: int, stages: int) -> list[range]:
    """The layer indices of each pipeline stage (vLLM's `get_pp_indices`).

    Example:
        >>> pipeline_stages(10, 4)
        [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    """
    sizes = [num_layers // stages] * stages
    for index in range(2, num_layers % stages + 2):
        sizes[-index] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append(range(start, start + size))
        start += size
    return bounds


def kv_heads_per_device(kv_heads: int, tensor_parallel: int) -> int:
    """KV heads each of `tensor_parallel` devices caches: an even share, at least one.

    Example:
        >>> kv_heads_per_device(8, 2), kv_heads_per_device(8, 8), kv_heads_per_device(2, 8)
        (4, 1, 1)
    """
    return max(1, -(-kv_heads // tensor_parallel))


@dataclass(frozen=True)
class Placement:
    """How the devices share the model: `tensor_parallel` devices per stage, and
    `pipeline_parallel` stages.

    Example:
        >>> Placement(2, 2).devices
        4
    """

    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    @property
    def devices(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def stages(self, spec: ModelSpec) -> list[range]:
        """Decoder layers of each stage; refuses more stages than layers."""
        layers = len(spec.layer_kinds)
        if self.pipeline_parallel > 1 and spec.is_encoder_decoder:
            raise UsageError(
                f"--pipeline-parallel {self.pipeline_parallel}: pipeline stages are planned for "
                f"decoder-only models; {spec.model_type} is an encoder-decoder (use tensor "
                "parallel alone)",
                key="--pipeline-parallel",
                value=self.pipeline_parallel,
            )
        if self.pipeline_parallel > layers:
            raise UsageError(
                f"--pipeline-parallel {self.pipeline_parallel} is more stages than the model's "
                f"{layers} layers",
                key="--pipeline-parallel",
                value=self.pipeline_parallel,
            )
        return pipeline_stages(layers, self.pipeline_parallel)

    def as_dict(self) -> dict:
        return {
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
        }


def _on_stage(group: WeightGroup, stage: range, first: bool, last: bool) -> int:
    """How many of `group`'s tensors the stage holds."""
    if group.stage == "first":
        return group.count if first else 0
    if group.stage == "last":
        return group.count if last else 0
    inside = sum(1 for layer in group.layers if layer in stage)
    return group.count * inside // len(group.layers)


def _dtype_bytes(elements: int, dtype: str) -> int:
    from keras_mha.planning.costs import KV_DTYPE_BITS

    return -(-elements * KV_DTYPE_BITS[dtype] // 8)


def group_bytes(group: WeightGroup, fmt: WeightsFormat, tensor_parallel: int = 1) -> int:
    """Bytes of one of `group`'s tensors on one of `tensor_parallel` devices, in `fmt`.

    Example:
        >>> from keras_mha.planning.planner.quantization import dtype_format
        >>> group = WeightGroup("mlp", "mlp", 256, 512, 1, (0,), "layer", "column")
        >>> group_bytes(group, dtype_format("bfloat16"), 2)  # 256 x 256 in 2 bytes
        131072
    """
    size_in, size_out = group.shard_shape(tensor_parallel)
    if group.is_matrix and group.role in fmt.quantized_roles:
        return fmt.matrix_bytes(size_in, size_out)
    elements = size_in * size_out if group.is_matrix else size_out
    return _dtype_bytes(elements, fmt.unquantized_dtype)


def weights_by_part(
    groups: Sequence[WeightGroup],
    fmt: WeightsFormat,
    *,
    tensor_parallel: int = 1,
    stage: range | None = None,
    first: bool = True,
    last: bool = True,
) -> dict[str, int]:
    """Bytes of the weights one device holds, per `ParameterCounts` part: all of them
    (`stage=None`) or those of one pipeline stage, split `tensor_parallel` ways.

    Example:
        >>> from keras_mha.planning.planner.quantization import dtype_format
        >>> groups = [WeightGroup("mlp", "mlp", 4, 8, 2, (0, 1), "layer", "column")]
        >>> weights_by_part(groups, dtype_format("float32"), stage=range(0, 1))["mlp"]
        128
    """
    by_part = dict.fromkeys(PARTS, 0)
    for group in groups:
        count = group.count if stage is None else _on_stage(group, stage, first, last)
        if count:
            by_part[group.part] += count * group_bytes(group, fmt, tensor_parallel)
    return by_part


def quantization_overhead(groups: Sequence[WeightGroup], fmt: WeightsFormat) -> int:
    """Bytes `fmt` adds beyond its bits per quantized weight: scales, zero points, indices.

    Example:
        >>> from keras_mha.planning.planner.quantization import dtype_format
        >>> groups = [WeightGroup("mlp", "mlp", 256, 2, 1, (0,), "layer", "column")]
        >>> quantization_overhead(groups, dtype_format("int8"))  # a bfloat16 scale per column
        4
    """
    overhead = 0
    for group in groups:
        if group.is_matrix and group.role in fmt.quantized_roles:
            stored = fmt.matrix_bytes(group.in_features, group.out_features)
            packed = -(-group.elements_each * fmt.bits // 8)
            overhead += group.count * (stored - packed)
    return overhead


def kv_share(spec: ModelSpec, tensor_parallel: int) -> tuple[int, int]:
    """`(numerator, denominator)`: the share of each self-attention layer's KV cache one
    device holds (its KV heads over all; MLA's latent: all of it).

    Example:
        >>> from types import SimpleNamespace
        >>> attention = SimpleNamespace(kv_lora_rank=None, num_key_value_heads=8)
        >>> kv_share(SimpleNamespace(attention=attention), 16)
        (1, 8)
    """
    if spec.attention.kv_lora_rank:
        return 1, 1
    heads = spec.attention.num_key_value_heads
    return kv_heads_per_device(heads, tensor_parallel), heads


def tensor_parallel_problem(spec: ModelSpec, tensor_parallel: int) -> str | None:
    """Why vLLM would refuse `tensor_parallel` devices per stage for `spec`, or None: the
    size must divide the query heads, and divide the KV heads or be a multiple of them.

    Example:
        >>> from types import SimpleNamespace
        >>> spec = SimpleNamespace(attention=SimpleNamespace(
        ...     num_attention_heads=32, num_key_value_heads=8, kv_lora_rank=None))
        >>> tensor_parallel_problem(spec, 16) is None, tensor_parallel_problem(spec, 3)[:33]
        (True, 'tensor parallel 3 does not divide')
    """
    if tensor_parallel == 1:
        return None
    heads, kv_heads = spec.attention.num_attention_heads, spec.attention.num_key_value_heads
    if heads % tensor_parallel:
        return (
            f"tensor parallel {tensor_parallel} does not divide the {heads} query heads "
            "(vLLM refuses it); the plan rounds each device's share up"
        )
    if (
        not spec.attention.kv_lora_rank
        and kv_heads % tensor_parallel
        and tensor_parallel % kv_heads
    ):
        return (
            f"tensor parallel {tensor_parallel} neither divides the {kv_heads} KV heads nor is "
            "a multiple of them (vLLM refuses it); the plan rounds each device's share up"
        )
    return None


__all__ = [
    "PARTS",
    "Placement",
    "group_bytes",
    "kv_heads_per_device",
    "kv_share",
    "pipeline_stages",
    "quantization_overhead",
    "tensor_parallel_problem",
    "weights_by_part",
]
