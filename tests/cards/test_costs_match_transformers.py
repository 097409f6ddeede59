"""The cost model against what transformers actually builds, for every bundled card.

Parameters: every card's `architectures[0]` class is instantiated on the meta device
(no memory, no weights), and `parameter_counts(spec).total` must equal
`sum(p.numel() for p in model.parameters())` exactly (tied weights count once).

Attention parameters, the rule: take every module of the language model (not a vision
tower or multimodal projector) whose class name ends in "Attention", keep only the
outermost of nested ones (BERT's `BertAttention` holds `BertSelfAttention`), and sum
its parameters except those of norm modules (class name containing "Norm") whose
attribute name does not start with "q" or "k". That keeps q/k norms and MLA's
`q_a_layernorm`/`kv_a_layernorm`, and leaves out the residual norms some families keep
inside the attention wrapper (BERT's `attention.output.LayerNorm`, T5's
`layer_norm`), which the cost model counts under `norms`.

KV cache: each card is shrunk on CPU (small hidden size and head size, few layers
that keep the layer pattern, a 5-token window, small vocabulary, few experts), one
forward pass runs with `use_cache=True`, and the per-layer key and value tensors of the
cache transformers returns are compared with `kv_cache_cost(...).layers` for the same
shrunk config. Known, documented differences of transformers' implementation:

- `DynamicCache` trims sliding-window layers to `window - 1` tokens between steps (the
  next token's own key completes the window); the cost model counts `window`, which
  is what `StaticCache` allocates (checked separately).
- Falcon's `new_decoder_architecture` attention broadcasts its `num_kv_heads` K/V
  heads to all query heads before caching; the cost model counts the distinct heads.

DeepSeek's MLA: transformers >= 5 caches the latent as two one-head tensors (the
normalised `kv_lora_rank` part and the rope key of `qk_rope_head_dim`), exactly the
cost model's default `mla_cache="latent"`.

Also checked on the full-size configs: the layer kinds and windows the cost model uses
match the layer types transformers derives for its cache.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from pathlib import Path

import pytest

from keras_mha.planning.costs import kv_cache_cost, parameter_counts
from keras_mha.planning.spec import from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.backend_independent, pytest.mark.slow]

CARDS_ROOT = Path(__file__).resolve().parents[2] / "cards"
CARD_IDS = sorted(
    f"{path.parent.parent.name}/{path.parent.name}" for path in CARDS_ROOT.glob("*/*/config.json")
)
# Flan-T5 stores a separate lm_head.weight (tie_word_embeddings=false). transformers >= 5
# ties T5's head in `from_config` anyway (T5Config forces tie_word_embeddings=True) and
# unties it in `from_pretrained` when the checkpoint's two tensors differ, so the loaded
# model has the untied head the cost model counts. The oracle re-creates that untied head.
SHRUNK_SEQ_LEN, SHRUNK_ENCODER_SEQ_LEN, SHRUNK_BATCH, SHRUNK_WINDOW = 9, 7, 2, 5
LAYER_TYPE_KINDS = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "linear_attention": "none",
    "dummy": "none",
}


@pytest.fixture(autouse=True)
def _quiet_transformers():
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def load_card(card_id: str) -> dict:
    return json.loads((CARDS_ROOT / card_id / "config.json").read_text())


def transformers_config(raw: dict):
    """The transformers config for a raw dict, without remote-code and quantisation keys."""
    # transformers edits nested dicts (rope_scaling) in place: hand it a copy.
    clean = {
        k: copy.deepcopy(v) for k, v in raw.items() if k not in ("auto_map", "quantization_config")
    }
    try:
        config_class = transformers.CONFIG_MAPPING[clean["model_type"]]
    except KeyError:
        pytest.skip(f"transformers {transformers.__version__} has no {clean['model_type']!r}")
    return config_class.from_dict(clean)


def model_class(raw: dict):
    name = raw["architectures"][0]
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no class {name}")
    return cls


def build_on_meta(raw: dict):
    config = transformers_config(raw)
    with torch.device("meta"):
        model = model_class(raw)(config)
    if raw.get("model_type") == "t5" and raw.get("tie_word_embeddings") is False:
        with torch.device("meta"):
            model.lm_head = torch.nn.Linear(config.d_model, config.vocab_size, bias=False)
    return model


def count_parameters(model) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def count_attention_parameters(model) -> int:
    """Parameters of the language model's attention blocks (the rule in the module docstring)."""
    total = 0

    def visit(module, path: str):
        nonlocal total
        if "vision_tower" in path or "multi_modal_projector" in path:
            return
        if type(module).__name__.endswith("Attention"):
            residual_norms = set()
            for name, child in module.named_modules():
                attribute = name.rsplit(".", 1)[-1]
                is_norm = name and "Norm" in type(child).__name__
                if is_norm and not attribute.startswith(("q", "k")):
                    residual_norms.update(id(p) for p in child.parameters())
            total += sum(p.numel() for p in module.parameters() if id(p) not in residual_norms)
            return
        for name, child in module.named_children():
            visit(child, f"{path}.{name}")

    visit(model, "")
    return total


def count_vision_parameters(model) -> int:
    """Parameters of the vision tower and the multimodal projector (0 for a text model)."""
    return sum(
        parameter.numel()
        for name, parameter in model.named_parameters()
        if "vision_tower" in name or "multi_modal_projector" in name
    )


@pytest.mark.parametrize("card_id", CARD_IDS)
def test_parameter_counts_match_transformers_on_meta(card_id):
    raw = load_card(card_id)
    counts = parameter_counts(from_config(raw, model_id=card_id))
    model = build_on_meta(raw)
    assert counts.total == count_parameters(model)
    assert counts.attention == count_attention_parameters(model)
    assert counts.vision == count_vision_parameters(model)


# Flags the bundled cards leave at their defaults, each flipped on a card's config.
VARIANTS = [
    ("meta-llama/Llama-3.2-1B", {"attention_bias": True, "mlp_bias": True, "head_dim": 32}),
    ("Qwen/Qwen3-8B", {"attention_bias": True, "num_hidden_layers": 4}),
    ("microsoft/phi-2", {"qk_layernorm": True, "num_key_value_heads": 8}),
    ("tiiuae/falcon-7b", {"parallel_attn": False, "multi_query": False, "bias": True}),
    ("tiiuae/falcon-40b", {"num_ln_in_parallel_attn": 1, "ffn_hidden_size": 1024}),
    ("bigcode/starcoder", {"multi_query": False, "n_inner": None}),
    ("EleutherAI/pythia-1b", {"attention_bias": False, "tie_word_embeddings": True}),
    ("facebook/opt-1.3b", {"word_embed_proj_dim": 512, "do_layer_norm_before": False}),
    ("facebook/opt-1.3b", {"enable_bias": False, "layer_norm_elementwise_affine": False}),
    ("google-bert/bert-base-uncased", {"tie_word_embeddings": False}),
    ("google-bert/bert-base-uncased", {"architectures": ["BertModel"], "type_vocab_size": 4}),
    ("google-t5/t5-small", {"feed_forward_proj": "gated-gelu", "num_decoder_layers": 3}),
    ("google-t5/t5-small", {"architectures": ["T5Model"]}),
    ("facebook/bart-large", {"architectures": ["BartForConditionalGeneration"]}),
    ("facebook/bart-large", {"encoder_attention_heads": 8, "num_hidden_layers": 3}),
    # Both spellings with different values: transformers' generic alias wins.
    ("facebook/bart-large", {"encoder_layers": 3, "decoder_layers": 2}),
    ("deepseek-ai/DeepSeek-V3", {"q_lora_rank": None, "attention_bias": True}),
    ("deepseek-ai/DeepSeek-V2-Lite", {"mlp_bias": True, "first_k_dense_replace": 5}),
    ("Qwen/Qwen3-30B-A3B", {"decoder_sparse_step": 2, "mlp_only_layers": [0, 5]}),
    ("ai21labs/Jamba-v0.1", {"num_experts": 1, "attn_layer_period": 4, "attn_layer_offset": 1}),
    ("ai21labs/Jamba-v0.1", {"mamba_dt_rank": "auto", "mamba_proj_bias": True}),
    ("mistralai/Mixtral-8x7B-v0.1", {"num_local_experts": 4, "num_experts_per_tok": 1}),
    ("google/gemma-2b", {"attention_bias": True, "tie_word_embeddings": False}),
    ("databricks/dbrx-base", {"attn_config": {"kv_n_heads": 4, "rope_theta": 10000}}),
    ("Qwen/Qwen2.5-0.5B", {"tie_word_embeddings": False}),
    # Multimodal: LLaVA's projector over several feature layers, without biases, tied;
    # PaliGemma's projection size and SigLIP's pooling head; a CLIP tower of another size.
    (
        "llava-hf/llava-1.5-7b-hf",
        {"vision_feature_layer": [-2, -5], "multimodal_projector_bias": False},
    ),
    ("llava-hf/llava-1.5-7b-hf", {"tie_word_embeddings": True}),
    (
        "llava-hf/llava-1.5-7b-hf",
        {"vision_config": {"model_type": "clip_vision_model", "num_hidden_layers": 2}},
    ),
    (
        "google/paligemma-3b-pt-224",
        {"projection_dim": 1024, "vision_config": {"vision_use_head": True, "image_size": 448}},
    ),
]


def apply_variant(raw: dict, overrides: dict) -> dict:
    variant = copy.deepcopy(raw)
    variant.update(copy.deepcopy(overrides))
    return variant


@pytest.mark.parametrize(
    ("card_id", "overrides"), VARIANTS, ids=[f"{c}-{sorted(o)}" for c, o in VARIANTS]
)
def test_parameter_counts_match_transformers_for_variants(card_id, overrides):
    raw = apply_variant(load_card(card_id), overrides)
    counts = parameter_counts(from_config(raw))
    model = build_on_meta(raw)
    assert counts.total == count_parameters(model)
    assert counts.attention == count_attention_parameters(model)
    assert counts.vision == count_vision_parameters(model)


def test_gemma3_vision_head_counts_match_transformers():
    raw = load_card("google/gemma-3-4b-it")
    raw["vision_config"] = dict(raw["vision_config"], vision_use_head=True, num_hidden_layers=2)
    raw["text_config"] = dict(raw["text_config"], num_hidden_layers=3)
    counts = parameter_counts(from_config(raw))
    assert counts.total == count_parameters(build_on_meta(raw))


def transformers_cache_layout(text_config) -> tuple[list[str], list[dict]]:
    """Per-layer cache types and kwargs, as the installed transformers derives them.

    transformers 5 has `cache_utils.get_layer_types_and_kwargs`; 4.5x has no such
    function and builds its caches from `config.layer_types`, else one type for every
    layer from `sliding_window` / `attention_chunk_size` (`DynamicCache.__init__`).
    """
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:
        get_layer_types_and_kwargs = None
    if get_layer_types_and_kwargs is not None and hasattr(text_config, "per_layer_config"):
        return get_layer_types_and_kwargs(text_config)
    sliding_window = getattr(text_config, "sliding_window", None)
    chunk = getattr(text_config, "attention_chunk_size", None)
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is None:
        kind = "sliding_attention" if sliding_window else "chunked_attention" if chunk else None
        layer_types = [kind or "full_attention"] * text_config.num_hidden_layers
    layer_types = ["dummy" if t in ("moe", "mlp") else t for t in layer_types]
    window = {"sliding_attention": sliding_window, "chunked_attention": chunk}
    kwargs = [{"sliding_window": window[t]} if t in window else {} for t in layer_types]
    return layer_types, kwargs


@pytest.mark.parametrize("card_id", CARD_IDS)
def test_layer_kinds_match_the_cache_layout_transformers_derives(card_id):
    raw = load_card(card_id)
    spec = from_config(raw)
    text_config = transformers_config(raw).get_text_config(decoder=True)
    layer_types, layer_kwargs = transformers_cache_layout(text_config)
    assert tuple(LAYER_TYPE_KINDS[layer_type] for layer_type in layer_types) == spec.layer_kinds
    windows = {kwargs["sliding_window"] for kwargs in layer_kwargs if "sliding_window" in kwargs}
    assert windows == ({spec.attention.sliding_window} if spec.attention.sliding_window else set())


@pytest.mark.parametrize("card_id", CARD_IDS)
def test_configs_resaved_by_transformers_read_the_same(card_id):
    """transformers 5 rewrites configs (rope_parameters, layer_types, filled defaults)."""
    raw = load_card(card_id)
    resaved = json.loads(transformers_config(raw).to_json_string())
    original, reread = from_config(raw), from_config(resaved)
    for record, name in (
        ("attention", "layer_kinds"),
        ("attention", "sliding_window"),
        ("attention", "num_key_value_heads"),
        ("attention", "head_dim"),
        ("positions", "rope_theta"),
    ):
        assert getattr(getattr(reread, record), name) == getattr(getattr(original, record), name)
    assert reread.positions.rope_local_theta == original.positions.rope_local_theta
    assert reread.attention.attention_scale == pytest.approx(original.attention.attention_scale)
    assert kv_cache_cost(reread, seq_len=8192) == kv_cache_cost(original, seq_len=8192)
    if card_id == "google/flan-t5-base":
        # The re-saved file says tie_word_embeddings=true (T5Config forces it): 222.9M, not 247.6M.
        assert parameter_counts(reread).total == parameter_counts(original).total - 32128 * 768
    else:
        assert parameter_counts(reread) == parameter_counts(original)


# -- KV cache on shrunk configs ---------------------------------------------------------------

_HEAD_SIZE = 16
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_FFN_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "d_ff",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "moe_intermediate_size",
)


def _layers_keeping_pattern(config: dict) -> int:
    """Few layers, but enough to hold every kind of layer the full model has."""
    model_type = config.get("model_type", "")
    if model_type.startswith("gemma3"):
        return 7  # five sliding, one full, one sliding (pattern 6)
    if model_type == "gemma2":
        return 3
    if model_type == "jamba":
        return 9  # attention at 4 (period 8), MoE on odd layers
    if model_type.startswith("deepseek"):
        return (config.get("first_k_dense_replace") or 0) + 1
    return 2


def shrink(raw: dict) -> dict:
    """The same architecture at toy size: same head counts and layer pattern, tiny tensors."""
    shrunk = copy.deepcopy(raw)
    text = shrunk.get("text_config") if isinstance(shrunk.get("text_config"), dict) else shrunk
    if text is not shrunk:
        # A text_config may leave its sizes to the config class's (full-size) defaults.
        for key in ("num_attention_heads", "hidden_size", "intermediate_size", "num_hidden_layers"):
            text.setdefault(key, 8)
        text["head_dim"] = _HEAD_SIZE
    for config in (shrunk, text):
        # Half-precision dtypes would build a half-precision model on CPU.
        config.pop("torch_dtype", None)
        config.pop("dtype", None)

    def set_if_present(key, value):
        if text.get(key) is not None:
            text[key] = value

    heads = next(
        text[key]
        for key in (
            "num_attention_heads",
            "n_head",
            "num_heads",
            "n_heads",
            "decoder_attention_heads",
        )
        if text.get(key)
    )
    for key in ("hidden_size", "n_embd", "d_model"):
        set_if_present(key, heads * _HEAD_SIZE)
    set_if_present("head_dim", _HEAD_SIZE)
    set_if_present("d_kv", 8)
    for key in _LAYER_KEYS:
        set_if_present(key, _layers_keeping_pattern(text))
    set_if_present("encoder_layers", 2)
    set_if_present("decoder_layers", 3)
    set_if_present("num_decoder_layers", 3)
    set_if_present("max_window_layers", 1)
    set_if_present("vocab_size", 128)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(text.get(key), int) and text[key] >= 128:
            text[key] = 0
    for key in _FFN_KEYS:
        set_if_present(key, 16)
    if text.get("model_type") == "falcon":
        text["ffn_hidden_size"] = 16
    if text.get("model_type") in ("gpt2", "gpt_bigcode"):
        text["n_inner"] = 16
    if isinstance(text.get("ffn_config"), dict):
        text["ffn_config"].update(ffn_hidden_size=16, moe_num_experts=4, moe_top_k=2)
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        set_if_present(key, 4)
    for key in ("n_group", "topk_group"):
        set_if_present(key, 1)
    if text.get("num_experts_per_tok"):
        text["num_experts_per_tok"] = min(2, text["num_experts_per_tok"])
    set_if_present("kv_lora_rank", 16)
    set_if_present("q_lora_rank", 24)
    set_if_present("qk_rope_head_dim", 8)
    set_if_present("qk_nope_head_dim", 8)
    set_if_present("v_head_dim", 12)
    for key in ("sliding_window", "sliding_window_size"):
        set_if_present(key, SHRUNK_WINDOW)
    if isinstance(shrunk.get("vision_config"), dict):
        shrunk["vision_config"].update(
            hidden_size=32,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        shrunk["mm_tokens_per_image"] = 4
    return shrunk


def run_with_cache(raw: dict, past_key_values=None):
    """One forward pass of the shrunk model on CPU; returns the model output."""
    torch.manual_seed(0)
    config = transformers_config(raw)
    model = model_class(raw)(config).eval()
    decoder_ids = torch.randint(3, 100, (SHRUNK_BATCH, SHRUNK_SEQ_LEN))
    with torch.no_grad():
        if config.is_encoder_decoder:
            encoder_ids = torch.randint(3, 100, (SHRUNK_BATCH, SHRUNK_ENCODER_SEQ_LEN))
            return model(input_ids=encoder_ids, decoder_input_ids=decoder_ids, use_cache=True)
        return model(input_ids=decoder_ids, use_cache=True, past_key_values=past_key_values)


def _cached(layer):
    keys = getattr(layer, "keys", None)
    return None if keys is None or keys.numel() == 0 else (layer.keys, layer.values)


@pytest.mark.parametrize("card_id", CARD_IDS)
def test_kv_cache_matches_the_cache_transformers_builds(card_id):
    raw = shrink(load_card(card_id))
    spec = from_config(raw)
    cost = kv_cache_cost(
        spec,
        seq_len=SHRUNK_SEQ_LEN,
        batch=SHRUNK_BATCH,
        kv_dtype="float32",
        encoder_seq_len=SHRUNK_ENCODER_SEQ_LEN,
    )
    output = run_with_cache(raw)
    past = getattr(output, "past_key_values", None)
    if not spec.is_decoder:
        assert past is None and not cost.applicable and cost.total_bytes == 0
        return
    self_cache = getattr(past, "self_attention_cache", past)
    cross_cache = getattr(past, "cross_attention_cache", None)
    expected_self = {layer.layer_index: layer for layer in cost.layers if layer.kind != "cross"}
    expected_cross = {layer.layer_index: layer for layer in cost.layers if layer.kind == "cross"}
    broadcasts_kv = spec.model_type == "falcon" and raw.get("new_decoder_architecture")

    assert len(self_cache.layers) == spec.num_hidden_layers
    for index, layer in enumerate(self_cache.layers):
        cached = _cached(layer)
        if spec.layer_kinds[index] == "none":
            assert cached is None and index not in expected_self
            continue
        keys, values = cached
        expected = expected_self[index]
        assert keys.shape[0] == values.shape[0] == SHRUNK_BATCH
        tokens = keys.shape[2]
        if expected.kind == "sliding":
            assert tokens == min(SHRUNK_SEQ_LEN, spec.attention.sliding_window - 1)
            assert expected.cached_tokens == min(SHRUNK_SEQ_LEN, spec.attention.sliding_window)
        else:
            assert tokens == expected.cached_tokens
        key_elements = keys.shape[1] * keys.shape[3]
        value_elements = values.shape[1] * values.shape[3]
        if broadcasts_kv:
            group = spec.attention.num_attention_heads // spec.attention.num_key_value_heads
            key_elements, value_elements = key_elements // group, value_elements // group
        if spec.attention_kind == "MLA":
            # transformers caches the latent as two one-head tensors: kv (kv_lora_rank), rope key.
            assert key_elements + value_elements == expected.key_elements_per_token
        else:
            assert key_elements == expected.key_elements_per_token
            assert value_elements == expected.value_elements_per_token

    if spec.is_encoder_decoder:
        assert len(cross_cache.layers) == len(expected_cross) == spec.num_hidden_layers
        for index, layer in enumerate(cross_cache.layers):
            keys, values = _cached(layer)
            expected = expected_cross[index]
            assert keys.shape[2] == expected.cached_tokens == SHRUNK_ENCODER_SEQ_LEN
            assert keys.shape[1] * keys.shape[3] == expected.key_elements_per_token
            assert values.shape[1] * values.shape[3] == expected.value_elements_per_token

    if spec.attention.sliding_window is None and not broadcasts_kv:
        layers = list(self_cache.layers) + (list(cross_cache.layers) if cross_cache else [])
        transformers_bytes = sum(
            tensor.numel() * tensor.element_size()
            for layer in layers
            if _cached(layer) is not None
            for tensor in _cached(layer)
        )
        assert transformers_bytes == cost.total_bytes


@pytest.mark.parametrize("card_id", ["mistralai/Mistral-7B-v0.1", "google/gemma-3-1b-pt"])
def test_static_cache_allocates_the_window_the_cost_model_counts(card_id):
    raw = shrink(load_card(card_id))
    spec = from_config(raw)
    cache = transformers.StaticCache(config=transformers_config(raw), max_cache_len=SHRUNK_SEQ_LEN)
    output = run_with_cache(raw, past_key_values=cache)
    cost = kv_cache_cost(spec, seq_len=SHRUNK_SEQ_LEN, batch=SHRUNK_BATCH, kv_dtype="float32")
    allocated = [layer.keys.shape[2] for layer in output.past_key_values.layers]
    assert allocated == [layer.cached_tokens for layer in cost.layers]
    transformers_bytes = sum(
        layer.keys.numel() * 4 + layer.values.numel() * 4 for layer in output.past_key_values.layers
    )
    assert transformers_bytes == cost.total_bytes
