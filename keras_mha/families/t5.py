"""T5 / Flan-T5 (google-t5/*, google/flan-t5-*): an encoder-decoder with relative
position biases and RMS norms.

Described by `inspect`; keras-mha layers do not compute T5's relative position bias, so
no layer is rebuilt.

Example:
    >>> FAMILY.traits["position_embedding"], FAMILY.traits["is_encoder_decoder"]
    ('relative', True)
"""

from keras_mha.families._family import Family
from keras_mha.families._presets import COMMON_KEYS, NO_BIASES
from keras_mha.families._rules import derived_head_dim


def t5(reader, fields: dict) -> None:
    """T5: `num_layers` encoder layers, `num_decoder_layers` decoder layers, gated or not."""
    fields.setdefault("head_dim", derived_head_dim(reader, fields))
    encoder_layers = fields["num_encoder_layers"] = fields["num_hidden_layers"]
    fields["num_hidden_layers"] = reader.integer(
        "num_decoder_layers", "layers", default=encoder_layers
    )
    projection = reader.text("feed_forward_proj", "relu")
    activation = projection.removeprefix("gated-")
    reader.require(
        bool(activation) and "-" not in activation,
        "feed_forward_proj",
        projection,
        "must be an activation name or 'gated-' and one (e.g. 'relu', 'gated-gelu')",
    )
    fields.update(
        mlp_kind="gated" if projection.startswith("gated-") else "plain",
        hidden_act=activation,
        relative_attention_num_buckets=reader.integer(
            "relative_attention_num_buckets", "count", low=1, default=None
        ),
        encoder_attention_heads=fields["num_attention_heads"],
        encoder_head_dim=fields["head_dim"],
        encoder_intermediate_size=fields["intermediate_size"],
    )


FAMILY = Family(
    "t5",
    keys={
        **COMMON_KEYS,
        "hidden_size": ("hidden_size", "d_model"),
        "num_attention_heads": ("num_attention_heads", "num_heads"),
        "num_hidden_layers": ("num_hidden_layers", "num_layers"),
        "head_dim": ("head_dim", "d_kv"),
        "intermediate_size": ("d_ff",),
    },
    traits={
        **NO_BIASES,
        "attention_scale": 1.0,  # T5 folds the scale into its initialisation
        "norm_type": "rms",
        "norms_per_layer": 3,
        "final_norms": 2,
        "position_embedding": "relative",
        "is_encoder_decoder": True,
        "encoder_norms_per_layer": 2,
    },
    hooks=(t5,),
    defaults={
        "vocab_size": 32128,
        "d_model": 512,
        "d_kv": 64,
        "d_ff": 2048,
        "num_layers": 6,
        "num_heads": 8,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6,
        "feed_forward_proj": "relu",
        "tie_word_embeddings": True,
    },
    not_built="an encoder-decoder with relative position biases",
)
