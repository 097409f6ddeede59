"""Calling a model on token data the way the analysis does: keras-mha's whole models get
`{"token_ids", "padding_mask"}`, any other model the token ids alone; eagerly, batch by
batch, with gradients off.

Example:
    >>> to_inputs = model_inputs(model)  # doctest: +SKIP
    >>> run_model(model, data, on_batch=lambda index: None)  # doctest: +SKIP
"""

from __future__ import annotations


def takes_padding_mask(model):
    """Whether `model` takes `{"token_ids", "padding_mask"}` (keras-mha's whole models);
    any other model is called with the token ids alone, one unpadded sequence at a time."""
    from keras_mha.models.decoder import DecoderModel
    from keras_mha.models.encoder import EncoderModel

    return isinstance(model, (DecoderModel, EncoderModel))


def model_inputs(model):
    """`(token_ids, padding_mask) -> what model is called with`."""
    if takes_padding_mask(model):
        return lambda ids, mask: {"token_ids": ids, "padding_mask": mask}
    return lambda ids, mask: ids


def run_model(model, data, on_batch, progress=None):
    """Call `model` eagerly on every batch of `data` (a `TokenData`), gradients off.

    `on_batch(index)` is called before each batch, so that attention callbacks know
    whose tokens they see; `progress` (a `ProgressBar` or None) advances after each.
    """
    from keras_mha.pruning.gate_gradients import no_gradient_tracking

    tokens = data.batch_tokens()
    for index, inputs in enumerate(data.inputs):
        on_batch(index)
        with no_gradient_tracking():
            model(inputs, training=False)
        if progress is not None:
            progress.advance(tokens=tokens[index])
