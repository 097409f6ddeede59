"""Prune half the heads of a small decoder during `fit`, fine-tune, export to transformers.

The text is real and small: the READMEs (PyPI long descriptions) of the installed
`transformers` and `huggingface_hub` packages, about 45 KB. The script

1. trains a byte-level BPE tokenizer (512 tokens) on it with `tokenizers`;
2. writes a small Llama-style decoder with transformers (4 layers, 8 query heads
   sharing 4 KV heads, head size 16, hidden size 128) as a Hub checkpoint with that
   tokenizer, and loads it with `keras_mha.models.from_pretrained`;
3. trains it on 90% of the text (windows of 64 tokens) for a few epochs: the
   perplexity on the held-out 10% is "before pruning";
4. goes on training with `HeadPruning(target=0.5, scope="per_layer")`: at the first
   epoch of this phase, before it trains, the callback scores the heads (Taylor) on
   held-out windows and gates off half of them, the same number in every layer (the
   held-out perplexity measured right then is "after pruning"), and the following
   epochs fine-tune around the silenced heads ("after fine-tuning");
5. removes the gated heads physically (`prune_heads`), exports with `save_pretrained`
   and checks that `transformers.AutoModelForCausalLM` computes the same held-out
   perplexity from the exported folder.

Progress is printed per epoch. About 1-2 minutes on 2 CPU cores:

    KERAS_BACKEND=torch python examples/prune_finetune_decoder.py
    python examples/prune_finetune_decoder.py --fast   # smoke test: fewer epochs
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

from keras_mha.commands.prune_report import perplexity
from keras_mha.data.text import decoder_windows, load_tokenizer
from keras_mha.models import from_pretrained, save_pretrained
from keras_mha.pruning import HeadPruning, find_attention_layers, prune_heads

SEQ_LEN = 64


def package_readme(name: str) -> str:
    """A package's long description (its README) from its installed METADATA."""
    metadata = importlib.metadata.metadata(name)
    body = metadata.get_payload() if hasattr(metadata, "get_payload") else None
    return body or metadata.get("Description", "")


def write_source(folder: Path, text: str) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        [text], trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"])
    )
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=16,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))


class HeldOutPerplexity(keras.callbacks.Callback):
    """Prints the held-out perplexity at each epoch's end, and once at `probe_epoch`'s start.

    Placed after `HeadPruning` in the callback list, so that at the pruning epoch it
    measures the model just after the heads were gated off, before it trains.
    """

    def __init__(self, data, batch_size, probe_epoch, offset=0):
        super().__init__()
        self.data, self.batch_size = data, batch_size
        self.probe_epoch, self.offset = probe_epoch, offset
        self.after_pruning = None
        self.last = None
        self.started = None

    def _perplexity(self):
        inputs = {"token_ids": self.data.inputs, "padding_mask": np.ones_like(self.data.inputs)}
        loss = self.model.evaluate(inputs, self.data.targets, batch_size=self.batch_size, verbose=0)
        return math.exp(loss)

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()
        if epoch == self.probe_epoch:
            self.after_pruning = self._perplexity()
            print(f"  heads gated off: held-out perplexity {self.after_pruning:.2f}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        self.last = self._perplexity()
        print(
            f"  epoch {epoch + 1 + self.offset}: train loss {logs['loss']:.3f}, held-out "
            f"perplexity {self.last:.2f}, pruned heads {logs.get('pruned_heads', 0):.0f} "
            f"({time.perf_counter() - self.started:.1f} s)",
            flush=True,
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="training before pruning")
    parser.add_argument("--finetune-epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fast", action="store_true", help="2 + 2 epochs on a quarter")
    arguments = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    text = "\n\n".join(package_readme(name) for name in ("transformers", "huggingface_hub"))
    if arguments.fast:
        text = text[: len(text) // 4]
        arguments.epochs, arguments.finetune_epochs = 2, 2
    work = Path(tempfile.mkdtemp(prefix="prune_finetune_"))
    write_source(work / "source", text)
    tokenizer = load_tokenizer(work / "source")
    windows = decoder_windows(tokenizer, text, SEQ_LEN)
    split = int(0.9 * windows.num_examples)
    train = type(windows)(windows.inputs[:split], windows.targets[:split], split * SEQ_LEN)
    held_out = type(windows)(
        windows.inputs[split:], windows.targets[split:], (windows.num_examples - split) * SEQ_LEN
    )
    print(
        f"{keras.backend.backend()}: {len(text):,} characters -> {windows.num_tokens:,} tokens, "
        f"{train.num_examples} training and {held_out.num_examples} held-out windows of {SEQ_LEN}"
    )
    model = from_pretrained(work / "source")
    heads = sum(layer.num_heads for layer in find_attention_layers(model).values())
    print(f"decoder: {model.count_params():,} parameters, {heads} query heads in 4 layers")
    model.compile(
        optimizer=keras.optimizers.AdamW(3e-3, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = {"token_ids": train.inputs, "padding_mask": np.ones_like(train.inputs)}
    held_out_x = {"token_ids": held_out.inputs, "padding_mask": np.ones_like(held_out.inputs)}

    print("training:")
    probe = HeldOutPerplexity(held_out, arguments.batch_size, probe_epoch=-1)
    model.fit(
        x,
        train.targets,
        batch_size=arguments.batch_size,
        epochs=arguments.epochs,
        callbacks=[probe],
        verbose=0,
    )
    before = probe.last

    print("pruning half of the heads, then fine-tuning:")
    pruning = HeadPruning(
        target=0.5,
        scope="per_layer",
        data=(held_out_x, held_out.targets),
        method="taylor",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        start_epoch=0,
        end_epoch=0,
        batch_size=arguments.batch_size,
    )
    probe = HeldOutPerplexity(
        held_out, arguments.batch_size, probe_epoch=0, offset=arguments.epochs
    )
    model.fit(
        x,
        train.targets,
        batch_size=arguments.batch_size,
        epochs=arguments.finetune_epochs,
        callbacks=[pruning, probe],
        verbose=0,
    )
    after_pruning, after_finetuning = probe.after_pruning, probe.last

    parameters = model.count_params()
    prune_heads(model)
    summary = save_pretrained(model, work / "pruned")
    import torch
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(work / "pruned").eval()
    with torch.no_grad():
        logits = reference(torch.tensor(held_out.inputs, dtype=torch.long)).logits.double()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.tensor(held_out.targets.reshape(-1)).long()
    )
    print()
    print("| held-out perplexity | value |")
    print("|---|---|")
    print(f"| before pruning ({heads} heads) | {before:.2f} |")
    print(f"| after gating off 50% of the heads | {after_pruning:.2f} |")
    print(f"| after {arguments.finetune_epochs} epochs of fine-tuning | {after_finetuning:.2f} |")
    print(
        f"\nremoved physically: {parameters:,} -> {model.count_params():,} parameters; "
        f"Keras perplexity of the pruned model {perplexity(model, held_out, 16):.2f}; "
        f"exported to {summary.path} ({summary.num_attention_heads} heads, "
        f"{summary.num_key_value_heads} KV heads per layer), transformers computes "
        f"{math.exp(float(loss)):.2f} from it"
    )


if __name__ == "__main__":
    main()
