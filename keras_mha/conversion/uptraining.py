"""Uptraining: a short `fit` that recovers what converting to fewer KV heads lost.

Ainslie et al. (2023) uptrain a converted checkpoint for a few percent of its
pre-training steps. `uptrain` runs Keras `fit` on token batches with one of three
objectives:

- `"next_token"` (decoders): cross-entropy of each next token, as in pre-training;
- `"distill"` with a decoder teacher: the KL divergence from the original model's
  next-token distribution (held frozen) to the converted model's, per token;
- `"distill"` with an encoder teacher: one minus the cosine between the converted
  and the original model's sentence embeddings (mean over real tokens, L2
  normalised, as sentence-transformers pools).

Distillation keeps the original model beside the converted one (its weights once
more) and computes its outputs for every batch: for a decoder, the teacher's logits
(`batch x seq_len x vocab` floats) are held during each step.

The optimizer is AdamW without weight decay, its learning rate warmed up linearly over
the first tenth of the steps and then decayed along a cosine to a tenth, with gradients
clipped to a global norm of 1.

Example:
    >>> from keras_mha.data.text import DecoderData
    >>> data = DecoderData(inputs=windows[:, :-1], targets=windows[:, 1:],
    ...                    num_tokens=windows[:, 1:].size)  # doctest: +SKIP
    >>> train, held_out = held_out_split(data, 0.1)  # doctest: +SKIP
    >>> uptrain(model, train, steps=200, learning_rate=3e-4)  # doctest: +SKIP
"""

from __future__ import annotations

import math

import numpy as np

from keras_mha.errors import UnsupportedModelError, UsageError

OBJECTIVES = ("next_token", "distill")
WARMUP_FRACTION = 0.1
FINAL_LEARNING_RATE_FRACTION = 0.1
GRADIENT_CLIP_NORM = 1.0
MIN_ENCODER_LENGTH = 8


def held_out_split(data, fraction, *, argument="--held-out"):
    """`(train, held_out)`: the last `fraction` of the examples held out, at least one each.

    Decoder windows are held out from the end of the text, so no held-out token was
    trained on (windows do not overlap).

    Raises:
        UsageError: `fraction` outside (0, 1), or too few examples for both parts.

    Example:
        >>> from keras_mha.data.text import DecoderData
        >>> data = DecoderData(np.zeros((10, 4), "int32"), np.zeros((10, 4), "int32"), 40)
        >>> [part.num_examples for part in held_out_split(data, 0.2)]
        [8, 2]
    """
    from keras_mha.data.text import DecoderData, EncoderData

    if not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise UsageError(
            f"{argument} {fraction!r}: expected a fraction of the examples in (0, 1)",
            key=argument,
            value=fraction,
        )
    total = data.num_examples
    held = max(1, int(round(total * fraction)))
    kept = total - held
    if kept < 1:
        unit = ("window" if isinstance(data, DecoderData) else "sentence") + "s" * (total != 1)
        raise UsageError(
            f"{argument} {fraction:g}: the text gives {total} {unit}, too few to hold some out "
            f"and train on the rest; give more text (or a smaller --seq-len)",
            key=argument,
            value=fraction,
        )
    if isinstance(data, DecoderData):
        length = data.inputs.shape[1]
        return (
            DecoderData(data.inputs[:kept], data.targets[:kept], kept * length),
            DecoderData(data.inputs[kept:], data.targets[kept:], held * length),
        )
    if isinstance(data, EncoderData):
        return tuple(
            EncoderData(ids, mask, int(mask.sum()))
            for ids, mask in (
                (data.token_ids[:kept], data.padding_mask[:kept]),
                (data.token_ids[kept:], data.padding_mask[kept:]),
            )
        )
    raise UsageError(
        f"`data` is a {type(data).__name__}; expected DecoderData or EncoderData "
        "(keras_mha.data.text)",
        key="data",
    )


def _batches_class():
    import keras

    class Batches(keras.utils.PyDataset):
        """`steps` batches of `batch_size` examples, reshuffled after each pass over the data."""

        def __init__(self, data, steps, batch_size, seed):
            super().__init__()
            self.data, self.steps = data, steps
            self.batch_size = min(batch_size, data.num_examples)
            passes = math.ceil(steps * self.batch_size / data.num_examples)
            generator = np.random.default_rng(seed)
            self.order = np.concatenate(
                [generator.permutation(data.num_examples) for _ in range(passes)]
            )

        def __len__(self):
            return self.steps

        def __getitem__(self, index):
            rows = np.sort(self.order[index * self.batch_size : (index + 1) * self.batch_size])
            if hasattr(self.data, "targets"):
                ids = self.data.inputs[rows]
                inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
                return inputs, self.data.targets[rows]
            mask = self.data.padding_mask[rows]
            # Cut to the batch's longest sentence rounded up to a power of two: fewer
            # padding columns to compute, and few shapes for jit to compile.
            longest = max(int(mask.sum(axis=1).max()), 1)
            length = min(max(MIN_ENCODER_LENGTH, 2 ** math.ceil(math.log2(longest))), mask.shape[1])
            inputs = {
                "token_ids": self.data.token_ids[rows, :length],
                "padding_mask": mask[:, :length],
            }
            return inputs, np.zeros((len(rows),), "float32")

    return Batches


def _uptraining_model_class():
    import keras
    from keras import ops

    class UptrainingModel(keras.Model):
        """The converted model, whose loss is one of `OBJECTIVES` (the teacher frozen)."""

        def __init__(self, student, teacher=None, kind="decoder", **kwargs):
            super().__init__(**kwargs)
            self.kind = kind
            if kind == "encoder":
                from keras_mha.models.sentence_embedding import sentence_embedding_model

                student, teacher = (
                    sentence_embedding_model(student),
                    sentence_embedding_model(teacher),
                )
            self.student = student
            self.teacher = teacher
            if teacher is not None:
                teacher.trainable = False
            # Every weight is the (built) models'; the pooling wrappers have none.
            for layer in (student, teacher, self):
                if layer is not None:
                    layer.built = True

        def call(self, inputs, training=False):
            return self.student(inputs, training=training)

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            if self.teacher is None:
                loss = keras.losses.sparse_categorical_crossentropy(
                    y, ops.cast(y_pred, "float32"), from_logits=True
                )
            elif self.kind == "encoder":
                target = ops.stop_gradient(self.teacher(x, training=False))
                loss = 1.0 - ops.sum(ops.cast(y_pred, "float32") * target, axis=-1)
            else:
                target = ops.stop_gradient(self.teacher(x, training=False))
                teacher_log = ops.log_softmax(ops.cast(target, "float32"), axis=-1)
                student_log = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
                loss = ops.sum(ops.exp(teacher_log) * (teacher_log - student_log), axis=-1)
            total = ops.mean(loss)
            for extra in self.losses:  # regularizers of the converted model
                total = total + ops.cast(ops.sum(extra), "float32")
            return total

    return UptrainingModel


def _progress_callback_class():
    import keras

    class Progress(keras.callbacks.Callback):
        """Advances a `ProgressBar` per step and keeps each step's loss."""

        def __init__(self, bar, tokens_per_step):
            super().__init__()
            self.bar, self.tokens_per_step, self.losses = bar, tokens_per_step, []
            self._running_mean = 0.0

        def on_train_batch_end(self, batch, logs=None):
            # Keras logs the mean over the steps so far (batches all weigh the same).
            mean = float((logs or {}).get("loss", float("nan")))
            steps = len(self.losses)
            loss = (steps + 1) * mean - steps * self._running_mean
            self._running_mean = mean
            self.losses.append(loss)
            if self.bar is not None:
                self.bar.label = f"uptraining (loss {loss:.4g})"
                self.bar.advance(tokens=self.tokens_per_step)

    return Progress


def uptrain(
    model,
    data,
    *,
    steps,
    learning_rate=1e-4,
    batch_size=8,
    teacher=None,
    seed=0,
    progress=None,
    verbose=0,
):
    """Fine-tune `model` in place for `steps` optimizer steps with Keras `fit`.

    Args:
        model: a `DecoderModel` or `EncoderModel` (e.g. after `convert_attention`).
        data: `DecoderData` (next-token windows) or `EncoderData` (sentences), from
            `keras_mha.data.text`; reshuffled after every pass.
        steps: optimizer steps.
        learning_rate: AdamW's peak learning rate (see the module docstring).
        batch_size: examples per step (at most the number of examples).
        teacher: the original model, to distil from (frozen); None trains a decoder by
            next-token loss. An encoder needs a teacher: it has no language-modelling head.
        seed: of the shuffling.
        progress: a `keras_mha.progress.ProgressBar` advanced per step, or None.
        verbose: passed to `fit` (Keras's own progress bar: 1).

    Returns:
        The loss of every step, as a list of floats.

    Raises:
        UnsupportedModelError: an encoder without `teacher`.
        UsageError: `steps`, `batch_size` or `learning_rate` not positive.

    Example:
        >>> losses = uptrain(model, train, steps=100, learning_rate=3e-4)  # doctest: +SKIP
        >>> losses[-1] < losses[0]  # doctest: +SKIP
        True
    """
    import keras

    from keras_mha.models.export import model_kind

    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UsageError(f"`{name}`={value!r}: expected a positive integer", key=name)
    rate = learning_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise UsageError(
            f"`learning_rate`={rate!r}: expected a positive number", key="learning_rate"
        )
    kind = model_kind(model)
    if kind == "encoder" and teacher is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} {model.name!r} is an encoder: it has no language-modelling "
            "head, so it cannot be trained (or measured) by next-token loss; distil it from the "
            "original model instead (teacher=..., `keras-mha convert --distill`)",
            key="teacher",
        )
    warmup = max(1, int(round(steps * WARMUP_FRACTION)))
    schedule = keras.optimizers.schedules.CosineDecay(
        # The first step (step 0 of the warm-up) already learns.
        initial_learning_rate=float(rate) / (warmup + 1),
        warmup_target=float(rate),
        warmup_steps=warmup,
        decay_steps=max(1, steps - warmup),
        alpha=FINAL_LEARNING_RATE_FRACTION,
    )
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule, weight_decay=0.0, global_clipnorm=GRADIENT_CLIP_NORM
    )
    trainer = _uptraining_model_class()(model, teacher, kind)
    trainer.compile(optimizer=optimizer, loss=None)
    batches = _batches_class()(data, int(steps), int(batch_size), seed)
    tokens_per_step = int(batches.batch_size * data.num_tokens / max(data.num_examples, 1))
    callback = _progress_callback_class()(progress, tokens_per_step)
    # shuffle=False: `batches` is shuffled by `seed` already; fit would reorder it with
    # Python's global `random`, so that two runs would not see the same batches.
    trainer.fit(batches, epochs=1, shuffle=False, verbose=verbose, callbacks=[callback])
    return callback.losses
