"""Upper bounds on serving speed from the hardware alone: decode tokens per second as a
memory-bandwidth roofline (a step reads each device's share of the weights, only the
experts its tokens pick, and the KV cache), prefill time (time to first token) as a
compute roofline at the device's dense 16-bit or float8 peak. Real engines reach a
fraction of them. The formulas, and the check against a measured CPU:
docs/concepts/memory-planner.md. Pure Python.

Example:
    >>> from keras_mha.hub.config import load_config
    >>> from keras_mha.planning.spec import from_config
    >>> from keras_mha.planning.planner.gpus import find_gpu
    >>> from keras_mha.planning.planner.serving import ServingModel
    >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
    >>> bounds = speed_bounds(ServingModel(spec), find_gpu("H100"), batch=1, seq_len=8192)
    >>> round(bounds.decode_tokens_per_s)  # 3.35 TB/s over 15.01 GB + 1.07 GB
    208
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from keras_mha.planning.costs import parameter_counts
from keras_mha.planning.planner.gpus import GPU
from keras_mha.planning.planner.serving import ServingModel


@dataclass(frozen=True)
class SpeedBounds:
    """Upper bounds on serving speed (see the module docstring).

    Attributes:
        batch, seq_len: the request (decode at a context of `seq_len` tokens).
        decode_tokens_per_s: tokens per second over the whole batch, at most.
        decode_tokens_per_s_per_sequence: tokens per second one sequence sees, at most.
        decode_step_seconds: one decode step of the batch, at least.
        decode_bytes_per_step: bytes the fullest device reads per step.
        decode_limited_by: "memory bandwidth" or "compute".
        prefill_seconds: the batch's prompts of `seq_len` tokens, at least.
        prefill_flops: the FLOPs of that prefill.
        peak_flops: the per-device peak used, and `peak_dtype` its precision.
        bandwidth_bytes_per_s: per device.
        devices: devices working together.

    Example:
        >>> SpeedBounds(1, 8, 10.0, 10.0, 0.1, 5, "compute", 0.5, 2, 4.0, "bfloat16", 50, 1
        ...             ).as_dict()["upper_bound"]
        True
    """

    batch: int
    seq_len: int
    decode_tokens_per_s: float
    decode_tokens_per_s_per_sequence: float
    decode_step_seconds: float
    decode_bytes_per_step: int
    decode_limited_by: str
    prefill_seconds: float
    prefill_flops: int
    peak_flops: float
    peak_dtype: str
    bandwidth_bytes_per_s: int
    devices: int

    def as_dict(self) -> dict:
        """JSON-ready, with `"upper_bound": true` (what these figures are)."""
        return {**asdict(self), "upper_bound": True}


def expected_experts(num_experts: int, per_token: int, tokens: int) -> float:
    """Distinct experts `tokens` tokens pick when each picks `per_token` of `num_experts`
    uniformly: `E * (1 - (1 - k/E)**tokens)`.

    Example:
        >>> expected_experts(8, 2, 1), round(expected_experts(8, 2, 64), 3)
        (2.0, 8.0)
    """
    return num_experts * (1 - (1 - per_token / num_experts) ** tokens)


def _attention_keys(spec, seq_len: int) -> tuple[int, int]:
    """(keys one new token attends to at a context of `seq_len`, keys all the positions
    of a prompt of `seq_len` tokens attend to), summed over the attention layers."""
    decode = prefill = 0
    window = spec.attention.sliding_window
    full_prompt = seq_len * (seq_len + 1) // 2 if spec.is_decoder else seq_len * seq_len
    for kind in spec.layer_kinds:
        if kind == "none":
            continue
        if kind == "sliding" and window:
            w = min(window, seq_len)
            decode += w
            # positions 1..w see every earlier key, later ones the last w
            prefill += w * (w + 1) // 2 + (seq_len - w) * w
        else:
            decode += seq_len
            prefill += full_prompt
    return decode, prefill


def _attention_width(spec) -> int:
    """`heads * (d + dv)`: a query does `2 * heads * (d + dv)` FLOPs per key it sees (the
    score and the weighted value, a multiply-add each). MLA counts its expanded heads."""
    return spec.attention.num_attention_heads * (
        spec.attention.head_dim + spec.attention.value_head_dim
    )


def _matmul_parameters(spec) -> tuple[int, int]:
    """(parameters a token multiplies by in the blocks, parameters of the output head)."""
    counts = parameter_counts(spec)
    active = counts.active if counts.active is not None else counts.total
    head = 0
    if spec.head_kind in ("lm", "masked_lm"):
        head = spec.vocab_size * (spec.norms.word_embed_proj_dim or spec.hidden_size)
    # Embedding lookups and norms are not matrix products; the head is counted apart.
    blocks = active - counts.embeddings - counts.norms - counts.lm_head - counts.vision
    return max(blocks, 0), head


def speed_bounds(serving: ServingModel, gpu: GPU, *, batch: int, seq_len: int) -> SpeedBounds:
    """Decode and prefill bounds for `serving`'s model, format and placement on `gpu`
    devices (see the module docstring).

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> from keras_mha.planning.planner.gpus import find_gpu
        >>> spec = from_config({"model_type": "llama", "hidden_size": 64,
        ...     "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
        ...     "vocab_size": 100})
        >>> bounds = speed_bounds(ServingModel(spec), find_gpu("T4"), batch=1, seq_len=16)
        >>> bounds.peak_dtype, bounds.decode_limited_by
        ('float16', 'memory bandwidth')
    """
    spec, placement = serving.spec, serving.placement
    devices = placement.devices
    fp8 = serving.format.fp8_compute and gpu.dense_fp8_flops is not None
    peak = gpu.dense_fp8_flops if fp8 else gpu.dense_16bit_flops
    peak_dtype = "float8" if fp8 else gpu.compute_dtype

    expert_share = 1.0
    if spec.mlp.num_experts:
        expert_share = expected_experts(spec.mlp.num_experts, spec.mlp.num_experts_per_tok, batch)
        expert_share /= spec.mlp.num_experts
    stage_bytes = []
    for stage in serving.stages:
        weights = stage.weights_bytes - stage.lookup_bytes
        weights -= stage.expert_bytes * (1 - expert_share)
        state = serving.kv_bytes(stage, batch, seq_len) + batch * stage.recurrent_bytes_per_row
        stage_bytes.append(weights + state)
    bandwidth = gpu.bandwidth_bytes_per_s
    blocks, head = _matmul_parameters(spec)
    decode_keys, prefill_keys = _attention_keys(spec, seq_len)
    width = _attention_width(spec)
    flops_per_token = 2 * (blocks + head) + 2 * width * decode_keys
    compute_seconds = batch * flops_per_token / (peak * devices)
    memory_seconds = max(stage_bytes) / bandwidth
    step = max(memory_seconds, compute_seconds)
    sequential = max(sum(stage_bytes) / bandwidth, compute_seconds)

    prompt_tokens = batch * seq_len
    head_tokens = prompt_tokens if spec.head_kind == "masked_lm" else batch
    prefill_flops = 2 * blocks * prompt_tokens + 2 * head * head_tokens
    prefill_flops += 2 * width * prefill_keys * batch
    return SpeedBounds(
        batch=batch,
        seq_len=seq_len,
        decode_tokens_per_s=batch / step,
        decode_tokens_per_s_per_sequence=1 / sequential,
        decode_step_seconds=step,
        decode_bytes_per_step=round(max(stage_bytes)),
        decode_limited_by="memory bandwidth" if memory_seconds >= compute_seconds else "compute",
        prefill_seconds=prefill_flops / (peak * devices),
        prefill_flops=prefill_flops,
        peak_flops=peak,
        peak_dtype=peak_dtype,
        bandwidth_bytes_per_s=bandwidth,
        devices=devices,
    )


__all__ = ["SpeedBounds", "expected_experts", "speed_bounds"]
