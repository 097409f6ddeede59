"""`HeadPruning`: gate off attention heads step by step during `fit`."""

from __future__ import annotations

import os
import warnings

import keras
import numpy as np

from keras_mha.errors import PruningError
from keras_mha.pruning import policy
from keras_mha.pruning.batches import Batches, check_batching, resolve_loss
from keras_mha.pruning.gates import get_head_gates, pruned_heads_from_gates, set_head_gates
from keras_mha.pruning.importance import check_method, head_importance
from keras_mha.pruning.labels import LabelCheck
from keras_mha.pruning.selection import layer_states
from keras_mha.pruning.surgery import check_flag, prune_heads


def _check_epoch(name, value, minimum=0):
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or value < minimum
    ):
        raise PruningError(f"`{name}` must be an integer >= {minimum}; received {value!r}.")
    return int(value)


class HeadPruning(keras.callbacks.Callback):
    """Prune attention heads during `fit` by setting their gates to 0.

    At each scheduled epoch, before that epoch trains, the callback scores the
    heads still active (`head_importance`) and gates off the least important
    ones until the schedule's share of `target` is reached. Shapes do not
    change, so nothing is recompiled, and the remaining epochs fine-tune the
    rest of the model around the silenced heads. Afterwards,
    `keras_mha.pruning.prune_heads(model)` (or `remove_at_end=True`) removes the
    gated heads physically.

    Schedule: pruning steps happen at epochs `start_epoch, start_epoch +
    frequency, ...` up to `end_epoch` (0-based, as `fit` counts them; epochs
    before `start_epoch` are warm-up). With `n` steps, step `k` brings the
    total removed to `round(k / n * target_heads)`, as near as whole units
    allow (see `keras_mha.pruning.policy`): the target is reached linearly, at
    the last step. With `scope="global"` every step takes its heads from a plan
    that reaches the final count from where the model is, so mixing 1-head
    (MHA) and 4-head (GQA group) units never strands the schedule short of it.
    When units cannot make up the target exactly, the schedule removes the most
    heads not above it and says so: a warning at the start of `fit`.

    Resuming: the only state is in the model. Heads with gate 0 count as
    pruned, and gates are saved with the weights, so after
    `model.save(...)` / `keras.models.load_model(...)` a new `HeadPruning`
    with the same arguments, used in `fit(..., initial_epoch=e)`, carries on
    with the schedule where it stopped. (Targets count the heads the layers
    have, gated ones included: remove heads physically only after the schedule.)

    Logs: at the end of every epoch, `logs` (and so `model.fit(...).history`)
    get `"pruned_heads"` (heads gated off so far, all layers),
    `"pruning_target_heads"` (heads the target asks for) and
    `"pruning_reachable_heads"` (the most heads whole units allow without
    exceeding it: the schedule's final count), and, per
    attention layer, `"head_gates/<path>"` (its gates, an array); on epochs
    with a pruning step also `"head_importance/<path>"` (the scores used).
    Callbacks before this one in the list do not see these keys (put a
    `TensorBoard` callback, which logs scalars only, before it).

    Warnings: the target cannot be reached exactly (and why, see Logs),
    `end_epoch` is not before `epochs`, or `fit` ended before the last step
    (with the heads pruned by then).

    Raises:
        PruningError: a bad argument (at construction); a target that would
            empty a layer, gates that cannot be removed physically, labels
            outside the model's classes in array `data` (at the start of `fit`,
            before anything changes); NaN or infinite importance scores (at a
            step, before any gate is written).

    Args:
        target: heads to remove: a fraction in (0, 1) of the heads, or a
            number of heads; of all heads (`scope="global"`) or of each layer
            (`scope="per_layer"`).
        data: what heads are scored on (not needed for `"magnitude"`):
            `(x, y)` arrays, a dataset, or an iterable of batches (see
            `keras_mha.pruning.batches.Batches`). Use held-out data.
        method: `"taylor"`, `"ablation"` or `"magnitude"` (see `head_importance`).
        scope: `"global"` (rank heads across layers) or `"per_layer"`.
        gqa_policy: `"group"` (remove a KV head with all its query heads) or
            `"query"` (remove query heads within groups, every group keeping
            the same size); see `keras_mha.pruning.policy`.
        start_epoch: first pruning epoch; earlier epochs are warm-up.
        end_epoch: last pruning epoch (default `start_epoch`: one step).
        frequency: epochs between pruning steps.
        min_heads_per_layer: heads every layer keeps (at least 1).
        loss: loss to score with; default the model's compiled loss.
        batch_size: batch size for array `data`.
        max_batches: score on at most this many batches.
        heatmap_dir: if set, save `head_pruning_epoch_XXX.png` there at each
            step (importance and pruned heads, layers x heads).
        remove_at_end: physically remove the gated heads when `fit` ends
            (the model is then compiled again; see `prune_heads`).
        verbose: 1 prints one line per pruning step.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> from keras_mha.pruning import prune_heads
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> model.compile("sgd", "mse")
        >>> x = np.random.default_rng(0).normal(size=(16, 8, 16)).astype("float32")
        >>> pruning = HeadPruning(target=0.5, data=(x, x), start_epoch=1, end_epoch=3,
        ...                       frequency=2)
        >>> history = model.fit(x, x, epochs=4, callbacks=[pruning], verbose=0)
        >>> history.history["pruned_heads"]
        [0, 1, 1, 2]
        >>> prune_heads(model)  # physically remove them
        {'attention': [...]}
    """

    def __init__(
        self,
        target,
        data=None,
        method="taylor",
        scope="global",
        gqa_policy="group",
        start_epoch=1,
        end_epoch=None,
        frequency=1,
        min_heads_per_layer=1,
        loss=None,
        batch_size=32,
        max_batches=None,
        heatmap_dir=None,
        remove_at_end=False,
        verbose=0,
    ):
        super().__init__()
        policy.check_target(target)
        check_method(method)
        policy.check_scope(scope)
        policy.check_policy(gqa_policy)
        policy.check_min_heads(min_heads_per_layer)
        self.start_epoch = _check_epoch("start_epoch", start_epoch)
        self.end_epoch = (
            self.start_epoch if end_epoch is None else _check_epoch("end_epoch", end_epoch)
        )
        if self.end_epoch < self.start_epoch:
            raise PruningError(
                f"`end_epoch`={end_epoch!r} must be >= `start_epoch`={start_epoch!r}."
            )
        self.frequency = _check_epoch("frequency", frequency, minimum=1)
        self.target = target
        self.method = method
        self.scope = scope
        self.gqa_policy = gqa_policy
        self.min_heads_per_layer = int(min_heads_per_layer)
        self.loss = loss
        self.batches = None
        check_batching(batch_size, max_batches)
        if method != "magnitude":
            if data is None:
                raise PruningError(
                    f"`data` is None but `method`={method!r} scores heads on data; pass "
                    "held-out (x, y) or a dataset, or use method='magnitude'."
                )
            self.batches = Batches(data, batch_size=batch_size, max_batches=max_batches)
        self.heatmap_dir = heatmap_dir
        self.remove_at_end = check_flag("remove_at_end", remove_at_end)
        self.verbose = (
            bool(verbose)
            if isinstance(verbose, (bool, np.bool_))
            else _check_epoch("verbose", verbose)
        )
        self.prune_epochs = list(range(self.start_epoch, self.end_epoch + 1, self.frequency))
        self.steps = []
        self.removed = None
        self.shortfall_reason = None
        self._epoch_importance = None
        self._target_heads = self._reachable_heads = None
        self._last_epoch = None

    # ----------------------------------------------------------- schedule
    def wanted_heads(self, epoch, states):
        """Total heads the schedule wants removed after the step at `epoch`.

        Example:
            >>> HeadPruning(0.5, method="magnitude", start_epoch=1, end_epoch=3).prune_epochs
            [1, 2, 3]
        """
        step = self.prune_epochs.index(epoch) + 1
        share = step / len(self.prune_epochs)
        final = policy.target_heads(self.target, states, self.scope)
        if self.scope == "global":
            return policy.round_half_up(final * share)
        return {path: policy.round_half_up(count * share) for path, count in final.items()}

    # ---------------------------------------------------------- callbacks
    def on_train_begin(self, logs=None):
        # Everything is checked here, before the first epoch changes anything.
        self._last_epoch = None
        states = layer_states(self.model)
        for state in states:
            policy.removal_units(state, np.zeros(state.num_heads), self.gqa_policy)
        policy.check_target_reachable(
            self.target, states, self.scope, self.gqa_policy, self.min_heads_per_layer
        )
        if self.method != "magnitude":
            loss_fn = resolve_loss(self.model, self.loss)
            labels = self.batches.label_array
            if labels is not None:  # Arrays are checked whole now; other data batch by batch.
                LabelCheck(self.model, loss_fn.loss)(self.batches.first_inputs, labels)
        self._target_heads, self._reachable_heads, reason = policy.shortfall(
            self.target, states, self.scope, self.gqa_policy, self.min_heads_per_layer
        )
        if reason is not None:
            self._warn(reason)
        epochs = (self.params or {}).get("epochs")
        if epochs is not None and self.end_epoch >= epochs:
            self._warn(
                f"`end_epoch`={self.end_epoch} is not before `epochs`={epochs}; the schedule "
                "will not reach its target in this fit."
            )

    def _warn(self, reason):
        self.shortfall_reason = reason
        warnings.warn(f"HeadPruning: {reason}", stacklevel=3)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_importance = None
        if epoch in self.prune_epochs:
            self.prune_step(epoch)

    def prune_step(self, epoch):
        """Run the pruning step scheduled at `epoch` now; returns the heads gated off.

        Example:
            >>> from keras_mha.layers import MultiHeadAttention
            >>> inputs = keras.Input((8, 16))
            >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
            >>> pruning = HeadPruning(2, method="magnitude", start_epoch=1)
            >>> pruning.set_model(model); pruning.prune_step(epoch=1)
            {'attention': [..., ...]}
        """
        if epoch not in self.prune_epochs:
            raise PruningError(
                f"`epoch`={epoch!r} is not a pruning epoch of this schedule; expected one of "
                f"{self.prune_epochs}."
            )
        gates = get_head_gates(self.model)
        states = layer_states(self.model)
        wanted = self.wanted_heads(epoch, states)
        already = {state.path: len(state.pruned) for state in states}
        missing = (
            wanted - sum(already.values())
            if self.scope == "global"
            else sum(max(0, wanted[path] - count) for path, count in already.items())
        )
        new = {state.path: [] for state in states}
        importance = None
        if missing > 0:
            importance = head_importance(
                self.model, self.batches, method=self.method, loss=self.loss
            )
            if self.scope == "global":
                final = policy.target_heads(self.target, states, self.scope)
                new = policy.select_step_heads(
                    states, importance, wanted, final, self.gqa_policy, self.min_heads_per_layer
                )
            else:
                new = policy.select_heads(
                    states,
                    importance,
                    wanted,
                    self.scope,
                    self.gqa_policy,
                    self.min_heads_per_layer,
                )
            for path, heads in new.items():
                gates[path][heads] = 0.0
            set_head_gates(self.model, {path: gates[path] for path, heads in new.items() if heads})
        self._epoch_importance = importance
        pruned = pruned_heads_from_gates(gates)
        self.steps.append(
            {"epoch": epoch, "importance": importance, "removed": new, "pruned": pruned}
        )
        if self.heatmap_dir is not None and importance is not None:
            from keras_mha.pruning.heatmap import save_head_heatmap

            os.makedirs(self.heatmap_dir, exist_ok=True)
            save_head_heatmap(
                os.path.join(self.heatmap_dir, f"head_pruning_epoch_{epoch:03d}.png"),
                importance,
                gates,
                title=f"HeadPruning ({self.method}), epoch {epoch}",
            )
        total = sum(map(len, pruned.values()))
        if self.verbose:
            count = sum(state.num_heads for state in states)
            print(
                f"HeadPruning epoch {epoch}: gated off {sum(map(len, new.values()))} heads "
                f"({total}/{count} pruned so far)"
            )
        if epoch == self.prune_epochs[-1]:
            asked, _, reason = policy.shortfall(
                self.target,
                layer_states(self.model),
                self.scope,
                self.gqa_policy,
                self.min_heads_per_layer,
            )
            if total < asked and reason is not None and reason != self.shortfall_reason:
                self._warn(reason)  # Not said at the start (gates changed since).
        return new

    def on_epoch_end(self, epoch, logs=None):
        self._last_epoch = epoch
        if logs is None:
            return
        gates = get_head_gates(self.model)
        logs["pruned_heads"] = int(sum(int(np.sum(values == 0)) for values in gates.values()))
        if self._target_heads is not None:
            logs["pruning_target_heads"] = self._target_heads
            logs["pruning_reachable_heads"] = self._reachable_heads
        for path, values in gates.items():
            logs[f"head_gates/{path}"] = values
        if self._epoch_importance is not None:
            for path, scores in self._epoch_importance.items():
                logs[f"head_importance/{path}"] = scores

    def on_train_end(self, logs=None):
        last_step = self.prune_epochs[-1]
        if self._last_epoch is not None and self._last_epoch < last_step:
            pruned = sum(map(len, self.pruned_heads.values()))
            self._warn(
                f"`fit` ended after epoch {self._last_epoch}, before the last pruning step at "
                f"epoch {last_step}: {pruned} of the {self._target_heads} heads the target asks "
                "for are pruned. Continue with `fit(..., initial_epoch=...)` and the same "
                "HeadPruning arguments."
            )
        if self.remove_at_end:
            self.removed = prune_heads(self.model)

    @property
    def pruned_heads(self):
        """`{path: heads gated off}` in the model now.

        Example:
            >>> from keras_mha.layers import MultiHeadAttention
            >>> inputs = keras.Input((8, 16))
            >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
            >>> pruning = HeadPruning(2, method="magnitude", start_epoch=0)
            >>> pruning.set_model(model); _ = pruning.prune_step(epoch=0)
            >>> pruning.pruned_heads
            {'attention': [..., ...]}
        """
        return pruned_heads_from_gates(get_head_gates(self.model))
