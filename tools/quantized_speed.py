"""Paired CPU speed of float against quantized keras-mha models (docs/guides/quantization.md).

Llama-3.2-1B's bundled card scaled down as `bench model --scale 8` does, random weights
from transformers, loaded once in float and once per mode; `generate` is timed in turn
over rounds whose order alternates, and each round gives quantized / float tokens/s.

Example:
    KERAS_BACKEND=torch python -m tools.quantized_speed int8 int4
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings

ROUNDS, PROMPT, NEW_TOKENS = 4, 32, 9


def main(modes):
    import numpy as np
    import torch
    import transformers

    from benchmarks.models import scaled_config
    from keras_mha.hub import load_config
    from keras_mha.models import from_pretrained, generate

    config = scaled_config(dict(load_config("bundled:meta-llama/Llama-3.2-1B").config), 8)
    config["torch_dtype"] = "float32"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**config)
        )
    ids = np.random.default_rng(0).integers(0, config["vocab_size"], (1, PROMPT)).astype("int32")
    modes = [None, *modes]
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        models = {mode: from_pretrained(folder, quantize=mode) for mode in modes}
    for model in models.values():  # warm-up (compiles where the backend does)
        generate(model, ids, 1)
        generate(model, ids, NEW_TOKENS)
    times = {mode: {"prefill": [], "decode": []} for mode in modes}
    for round_index in range(ROUNDS):
        for mode in modes if round_index % 2 == 0 else modes[::-1]:
            start = time.perf_counter()
            generate(models[mode], ids, 1)
            prefilled = time.perf_counter()
            generate(models[mode], ids, NEW_TOKENS)
            done = time.perf_counter()
            times[mode]["prefill"].append(prefilled - start)
            times[mode]["decode"].append((done - prefilled) - (prefilled - start))
    for mode in modes[1:]:
        for phase in ("prefill", "decode"):
            ratios = [f / q for f, q in zip(times[None][phase], times[mode][phase], strict=True)]
            print(
                f"{mode} {phase}: {statistics.median(ratios):.2f}x float tokens/s "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
