"""`from_pretrained`: a Hub checkpoint (local folder or Hub id) as a keras-mha Keras model.

The config goes through `keras_mha.planning` (`load_config` -> `from_config` -> `ModelSpec`),
the family's block traits and tensor names come from its module in `keras_mha.families`
(`Family.blocks`, `Family.weights`), and each attention layer from
`keras_mha.models.build_attention`. Loading is checked before anything is read: every
expected tensor must be present, none unexplained, and every shape (read from the
safetensors headers) must be the one the config implies; only then are tensors read,
one at a time, each into a single aligned array, largest first. The model is built without memory
(`keras_mha.models.deferred`) and each variable is created from its array, which on
the CPU becomes the variable's buffer (no copy where the layouts agree, one
transposing copy where they differ): peak memory stays close to the model's own size.

Example:
    >>> from keras_mha.models import from_pretrained
    >>> model = from_pretrained("path/to/checkpoint")  # doctest: +SKIP
    >>> model = from_pretrained("Qwen/Qwen2.5-0.5B", dtype="bfloat16")  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from pathlib import Path

from keras_mha.errors import CheckpointError, ConfigError, UnsupportedModelError, UsageError
from keras_mha.models.local_files import file_in_folder
from keras_mha.models.safetensors_reader import (
    INDEX_FILE_NAME,
    SINGLE_FILE_NAME,
    SafetensorsCheckpoint,
    count_nonfinite,
    read_weight_map,
)
from keras_mha.models.supported import activation_name, built_family
from keras_mha.models.weight_names import (
    TRANSFORMS,
    bound_rules,
    model_weight_names,
)
from keras_mha.planning.config_values import shown

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


# -- building the model from a spec ------------------------------------------------------------


def build_model(spec, *, dtype="float32", initializer="default", name=None, quantize=None):
    """An untrained `DecoderModel` / `EncoderModel` shaped like `spec`.

    Args:
        spec: a `ModelSpec` (`keras_mha.planning.spec.from_config(config)`).
        dtype: the model's dtype (variables and computation).
        initializer: "default" (random, for training from scratch) or "zeros" (cheap,
            for weights about to be loaded).
        name: the Keras model name; default the family.
        quantize: None, or `"int8"`, `"int4"`, `"float8"`: the layers `model.quantize(mode)`
            would quantize (`keras_mha.models.quantize.QUANTIZED_LAYERS`) are built in that
            mode directly, with the policy Keras's `quantize` would give them
            (`sublayer_policies.quantized_policy`), so no float copy of them is ever made.

    Raises:
        UnsupportedModelError: a family or feature keras_mha.models does not build.

    Example:
        >>> from keras_mha.hub import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config(load_config("bundled:Qwen/Qwen2.5-0.5B").config)
        >>> build_model(spec).count_params()  # doctest: +SKIP
        494032768
    """
    from keras_mha.models.blocks import DecoderBlock, EncoderBlock
    from keras_mha.models.decoder import DecoderModel
    from keras_mha.models.encoder import EncoderModel
    from keras_mha.models.rebuild import build_attention

    traits = built_family(spec).blocks
    activation = activation_name(spec, traits)
    epsilon = (
        spec.norms.norm_eps if spec.norms.norm_eps is not None else traits.default_norm_epsilon
    )
    zeros = initializer == "zeros"
    kernel = "zeros" if zeros else "glorot_uniform"
    common = {"dtype": dtype}
    attention_dtype, sublayer_dtypes = _quantized_sublayers(quantize, dtype)
    blocks = []
    for index in range(spec.num_hidden_layers):
        try:
            attention = build_attention(
                spec,
                index,
                name="attention",
                kernel_initializer=kernel,
                build=False,
                dtype=attention_dtype,
            )
        except NotImplementedError as error:
            raise UnsupportedModelError(f"model_type={spec.model_type!r}: {error}") from None
        if traits.kind == "decoder":
            block = DecoderBlock(
                spec.hidden_size,
                spec.mlp.intermediate_size,
                attention,
                activation=activation,
                norm_epsilon=epsilon,
                norm_scale_offset=traits.norm_scale_offset,
                sandwich_norms=traits.sandwich_norms,
                mlp_bias=spec.mlp.mlp_bias,
                kernel_initializer=kernel,
                norm_type=spec.norms.norm_type,
                norm_bias=spec.norms.norm_bias,
                mlp_kind=spec.mlp.mlp_kind,
                parallel_residual=spec.norms.parallel_residual,
                sublayer_dtypes=sublayer_dtypes,
                name=f"block_{index}",
                **common,
            )
        else:
            block = EncoderBlock(
                spec.hidden_size,
                spec.mlp.intermediate_size,
                attention,
                activation=activation,
                norm_epsilon=epsilon,
                kernel_initializer=kernel,
                sublayer_dtypes=sublayer_dtypes,
                name=f"block_{index}",
                **common,
            )
        blocks.append(block)
    identity = {
        "family": spec.family,
        "hub_config": spec.raw,
        "name": name or spec.family,
        "embeddings_initializer": "zeros" if zeros else "uniform",
    }
    if traits.kind == "decoder":
        return DecoderModel(
            spec.vocab_size,
            spec.hidden_size,
            blocks,
            tie_word_embeddings=spec.tie_word_embeddings,
            norm_epsilon=epsilon,
            norm_scale_offset=traits.norm_scale_offset,
            embedding_scale=traits.embedding_scale,
            final_logit_soft_cap=spec.attention.final_logit_softcapping,
            kernel_initializer=kernel,
            norm_type=spec.norms.norm_type,
            norm_bias=spec.norms.norm_bias,
            max_position_embeddings=spec.positions.learned_position_rows
            if spec.positions.position_embedding == "learned"
            else None,
            **identity,
            **common,
        )
    return EncoderModel(
        spec.vocab_size,
        spec.hidden_size,
        blocks,
        max_position_embeddings=spec.positions.learned_position_rows,
        type_vocab_size=max(spec.positions.token_type_vocab_size, 1),
        norm_epsilon=epsilon,
        position_padding_idx=spec.positions.position_padding_idx,
        **identity,
        **common,
    )


def _quantized_sublayers(mode, dtype):
    """(the attention's dtype, the blocks' `sublayer_dtypes`) for a model built in `mode`."""
    if mode is None:
        return dtype, None
    from keras_mha.models.quantize import QUANTIZED_LAYERS, check_mode
    from keras_mha.models.sublayer_policies import quantized_policy

    policy = quantized_policy(check_mode(mode), dtype)
    return policy, {name: policy for name in QUANTIZED_LAYERS if name != "attention"}


# -- finding the files ---------------------------------------------------------------------------


def _local_directory(source: str, revision) -> Path | None:
    path = Path(source).expanduser()
    if not path.exists():
        return None
    if not path.is_dir():
        raise CheckpointError(
            f"{path}: not a directory; from_pretrained needs a folder with config.json and "
            f"{SINGLE_FILE_NAME} (or {INDEX_FILE_NAME} and its shards)",
            path=str(path),
        )
    if revision is not None:
        warnings.warn(f"revision={revision!r} is ignored for the local folder {path}", stacklevel=3)
    if not (path / "config.json").is_file():
        present = sorted(p.name for p in path.iterdir())[:8]
        hint = " (a tokenizer-only folder?)" if any("tokenizer" in n for n in present) else ""
        raise CheckpointError(
            f"{path}: no config.json{hint}; it holds {present}; from_pretrained needs "
            f"config.json and {SINGLE_FILE_NAME} (or {INDEX_FILE_NAME} and its shards)",
            path=str(path),
        )
    file_in_folder(path, "config.json")  # a symlink leading out of the folder is refused
    return path


def _hub_checkpoint(source: str, revision, token, hub=None) -> tuple[dict, Path]:
    """(config, folder of the safetensors files) of a Hub id, through the HF cache.

    `hub` holds `endpoint`, `offline` and `timeout` for `load_config` / `hub_file`."""
    from keras_mha.hub.config import load_config
    from keras_mha.hub.settings import offline_requested

    hub = dict(hub or {})
    loaded = load_config(source, revision=revision, token=token, **hub)
    if loaded.source != "hub":
        offline = hub.get("offline")
        if offline or (offline is None and offline_requested()):
            why = "offline mode is on (--offline, HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)"
        else:
            reason = (loaded.note or "the Hub could not be reached").split("; answered from")[0]
            why = f"{reason}"
        raise CheckpointError(
            f"{source}: {why} and its weights are not in the HF cache; download them once "
            f"online (`hf download {source}`, or run this again with the network) or pass a "
            "local folder holding config.json and safetensors",
            model_id=source,
        )
    from keras_mha.hub.files import hub_file

    # The commit the config came from: its files are fetched at that exact commit (and a
    # cached one is never fetched again); hub_file checks every name the server sends.
    commit = loaded.commit or revision

    def download(filename):
        return hub_file(source, filename, revision=commit, token=token, **hub)

    index = download(INDEX_FILE_NAME)
    if index is not None:
        for shard in sorted(set(read_weight_map(index).values())):
            if Path(shard).name != shard or download(shard) is None:
                raise CheckpointError(
                    f"{source}: shard {shard!r} named in {INDEX_FILE_NAME} could not be fetched",
                    model_id=source,
                )
        return loaded.config, index.parent
    single = download(SINGLE_FILE_NAME)
    if single is None:
        raise CheckpointError(
            f"{source}: the repository has neither {SINGLE_FILE_NAME} nor {INDEX_FILE_NAME} "
            f"(keras_mha.models reads safetensors only)",
            model_id=source,
        )
    return loaded.config, single.parent


# -- dtype ---------------------------------------------------------------------------------


def _has_accelerator() -> bool:
    from keras_mha import backends

    return backends.current().has_accelerator()


def choose_dtype(config: dict, dtype: str | None) -> str:
    """The dtype asked for, else the checkpoint's where the device computes it well.

    The config's `torch_dtype` (or `dtype`, transformers >= 4.56) is used when it is
    float32, or when a GPU/TPU is present; half precision on a CPU falls back to
    float32 (CPU kernels for bfloat16/float16 are slow or missing on some backends).

    Example:
        >>> choose_dtype({"torch_dtype": "float32"}, None)
        'float32'
        >>> choose_dtype({}, "bfloat16")
        'bfloat16'
    """
    if dtype is not None:
        dtype = str(dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise UsageError(
                f"dtype={shown(dtype)}; expected one of {list(SUPPORTED_DTYPES)} or None",
                key="dtype",
                value=dtype,
            )
        return dtype
    declared = config.get("torch_dtype") or config.get("dtype")
    if isinstance(config.get("text_config"), dict):
        declared = declared or config["text_config"].get("torch_dtype")
    declared = _TORCH_DTYPES.get(str(declared).replace("torch.", ""))
    if declared is None or declared == "float32":
        return "float32"
    return declared if _has_accelerator() else "float32"


# -- loading -----------------------------------------------------------------------------------


def _check_and_bind(model, names, checkpoint: SafetensorsCheckpoint, where: str):
    """The bound rules, after checking names and shapes against the checkpoint headers."""
    from keras_mha.models.quantized_loading import load_target

    keys = checkpoint.keys()
    prefix = names.find_prefix(keys)
    if prefix is None:
        anchor = names.anchor.format(prefix="")
        raise CheckpointError(
            f"{where}: no {anchor!r} (under any of the stems {list(names.prefixes)}); is this a "
            f"{model.family} checkpoint? first tensors: {keys[:4]}",
            path=where,
        )
    model.hub_prefix = prefix
    bound = bound_rules(model, names, prefix, len(model.blocks), lookup=load_target)
    expected = {rule.hub_name: rule for rule in bound}
    tied_head = getattr(model, "lm_head", "absent") is None
    unexpected = [
        key
        for key in keys
        if key not in expected
        and not names.is_ignored(key)
        and not names.is_buffer(key)
        # A tied head saved anyway (some exporters do) duplicates the embeddings.
        and not (tied_head and key == "lm_head.weight")
        # Gemma 3 multimodal checkpoints: the vision tower is not part of the text model.
        and not (
            prefix == "model.language_model."
            and not key.startswith(prefix)
            and key != "lm_head.weight"
        )
    ]
    missing = [name for name in expected if name not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{where}: tensor {missing[0]!r} is missing ({len(missing)} missing in all) but the "
            f"config (model_type={model.family!r}) needs it",
            path=where,
            key=missing[0],
        )
    if unexpected:
        raise CheckpointError(
            f"{where}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all) "
            f"has no place in a {model.family} model built from this config",
            path=where,
            key=unexpected[0],
        )
    for rule in bound:
        variable_shapes = [tuple(load_target(model, path).shape) for path in rule.variables]
        want = tuple(TRANSFORMS[rule.transform].hub_shape(variable_shapes))
        have = checkpoint.shape_of(rule.hub_name)
        if have != want:
            raise CheckpointError(
                f"{checkpoint.file_of(rule.hub_name)}: tensor {rule.hub_name!r} has shape "
                f"{have}, but config.json implies {want}",
                path=str(checkpoint.file_of(rule.hub_name)),
                key=rule.hub_name,
                value=have,
            )
    return bound


def load_weights(model, checkpoint_dir, *, config=None) -> dict[str, str]:
    """Fill `model` from a safetensors checkpoint; checked first, then one tensor at a time.

    Each tensor is read from the file into one aligned array, converted to the model's
    layout (a transposing copy where the layouts differ) and handed to its variable. A
    model built inside `keras_mha.models.deferred.deferred_variables()` (as
    `from_pretrained` does) has no memory yet: each variable is then created from its
    array, which on the CPU becomes the variable's buffer without a copy; variables the
    checkpoint has no tensor for (head gates) get their own initializer's value. A model
    built eagerly has its variables assigned.

    Layers built quantized (`build_model(quantize=...)`, or quantized by the caller in
    `"int8"`, `"int4"`, `"float8"`) get each float tensor quantized as it is read, with
    Keras's own quantizers (`keras_mha.models.quantized_loading`): the only float copy
    held is the tensor being read.

    Returns:
        `{variable path: hub tensor name}` for every variable filled.

    Raises:
        CheckpointError: no safetensors, a missing or unexpected tensor, a shape that
            disagrees with the config, or fp8 weights and scales that do not pair up; the
            model is left untouched then.
        UnsupportedModelError: a quantized format other than fp8 blocks.
        UsageError: a layer quantized in a mode loading does not fill (GPTQ, AWQ).
    """
    import keras

    from keras_mha.models.deferred import initialize_rest
    from keras_mha.models.quantized_checkpoints import open_checkpoint
    from keras_mha.models.quantized_loading import fill_target, load_target

    dtype = keras.backend.standardize_dtype(model.variable_dtype)
    checkpoint = open_checkpoint(checkpoint_dir, config or {}, str(checkpoint_dir), dtype)
    names = model_weight_names(model)
    bound = _check_and_bind(model, names, checkpoint, checkpoint.describe())
    # Largest first: a tensor whose layout differs is copied once while being converted,
    # and that transient copy of the embeddings or LM head then coincides with little of
    # the model, while the last tensors' copies are small (peak: the model plus about
    # one layer's tensor, instead of plus the LM head).
    bound.sort(key=lambda rule: -checkpoint.nbytes_of(rule.hub_name))
    sources = {}
    for rule in bound:
        targets = [load_target(model, path) for path in rule.variables]
        tensor = checkpoint.read(rule.hub_name)
        _warn_if_nonfinite(checkpoint, rule.hub_name, tensor)
        values = TRANSFORMS[rule.transform].to_keras(tensor, [tuple(t.shape) for t in targets])
        del tensor
        # A fused tensor's parts are views of one buffer: each variable gets its own copy.
        shared = len(values) > 1
        for target, path in zip(targets, rule.variables, strict=True):
            fill_target(target, values.pop(0), shared=shared)
            sources[path] = rule.hub_name
        _return_freed_memory()
    initialize_rest(model.variables)
    return sources


def _warn_if_nonfinite(checkpoint: SafetensorsCheckpoint, key: str, tensor) -> None:
    """A warning naming a tensor that holds NaN or infinite values (one pass over its bits)."""
    count = count_nonfinite(tensor)
    if count:
        warnings.warn(
            f"{checkpoint.file_of(key)}: tensor {key!r} holds {count} NaN or infinite "
            f"value(s) of {tensor.size}; outputs that depend on it will be NaN or inf",
            UserWarning,
            stacklevel=4,
        )


def _return_freed_memory():
    """Give freed heap pages back to the OS (glibc keeps them otherwise, inflating RSS)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def from_pretrained(
    source,
    *,
    dtype=None,
    quantize=None,
    revision=None,
    token=None,
    endpoint=None,
    offline=None,
    timeout=None,
):
    """A Keras model of keras-mha layers from a Hub checkpoint.

    Args:
        source: a local folder (`config.json` + `model.safetensors`, or
            `model.safetensors.index.json` and its shards) or a Hub model id, fetched
            through the HF cache (`HF_TOKEN`, `HF_ENDPOINT`, `HF_HUB_OFFLINE` apply).
        dtype: "float32", "bfloat16" or "float16"; default the checkpoint's own where the
            device computes it well (see `choose_dtype`), else float32.
        quantize: None, or `"int8"`, `"int4"`, `"float8"`: the blocks' attention and MLP
            layers are built in that mode and each checkpoint tensor is quantized as it is
            read, as `model.quantize` would quantize it (`keras_mha.models.quantized_loading`;
            docs/guides/quantization.md): no float copy of the model is made. An fp8
            block-scaled checkpoint (`quantization_config.quant_method="fp8"`) is
            dequantized into `dtype` tensor by tensor, then quantized as a float one.
        revision: Hub branch, tag or commit (Hub ids only).
        token: Hub token; None uses the stored login / `HF_TOKEN`.
        endpoint: Hub endpoint; None uses `HF_ENDPOINT`.
        offline: read only the HF cache, never the network; None follows `HF_HUB_OFFLINE`.
        timeout: seconds an exchange with the Hub may take; None: the default (these three
            as in `keras_mha.hub.load_config`).

    Returns:
        A `DecoderModel` (causal LMs: logits `(B, T, vocab)`) or `EncoderModel` (BERT and
        sentence-transformers: last hidden state `(B, T, hidden)`).

    Raises:
        CheckpointError: no config.json or safetensors; tensors missing, unexpected or of
            a shape the config does not imply; a malformed safetensors file or index; a
            file that resolves outside the folder (a `..` shard name, a symlink leading
            elsewhere).
        ConfigError: a config value that cannot be read.
        UnsupportedModelError: a family or feature keras_mha.models does not build; a
            quantized checkpoint other than fp8 blocks (GPTQ, AWQ, bitsandbytes,
            compressed-tensors: one line naming the format and what to do), or fp8 with
            static activation scales.
        UsageError: `source`, `dtype` or `quantize` is not one of the values expected.

    Warns:
        UserWarning: a tensor holds NaN or infinite values (named, with their count).

    Example:
        >>> model = from_pretrained("path/to/tiny-llama")  # doctest: +SKIP
        >>> model(np.array([[1, 2, 3]])).shape  # doctest: +SKIP
        (1, 3, 100)
    """
    from keras_mha.hub.config import read_config_file
    from keras_mha.models.deferred import deferred_variables
    from keras_mha.models.quantize import check_mode
    from keras_mha.models.quantized_checkpoints import open_checkpoint
    from keras_mha.planning.spec import from_config

    check_mode(quantize)
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise UsageError(
            f"source={shown(source)}; expected a local folder or a Hub model id", key="source"
        )
    source = str(source).strip()
    directory = _local_directory(source, revision)
    if directory is not None:
        config = read_config_file(directory / "config.json", described_as=str(directory))
    else:
        hub = {"endpoint": endpoint, "offline": offline}
        if timeout is not None:
            hub["timeout"] = timeout
        config, directory = _hub_checkpoint(source, revision, token, hub)
    # Checked from the headers before building: no safetensors, a quantized format other
    # than fp8 blocks, or fp8 weights and scales that do not pair up.
    open_checkpoint(directory, config, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown families are refused below, by name
        try:
            spec = from_config(config, model_id=source)
        except ConfigError:
            raise
    # Built without memory: each variable is created from its checkpoint tensor.
    with deferred_variables() as pending:
        model = build_model(
            spec, dtype=choose_dtype(config, dtype), initializer="zeros", quantize=quantize
        )
    load_weights(model, directory, config=config)
    pending.initialize_rest()  # anything the model's variable list does not reach
    # save_pretrained copies the tokenizer files from here.
    model.source_directory = str(directory)
    return model


__all__ = ["build_model", "choose_dtype", "from_pretrained", "load_weights"]
