"""Peak memory of `from_pretrained`: does loading hold the checkpoint twice?

1. A subprocess has transformers write a random Llama-shaped checkpoint (~170 MB of
   float32 safetensors) into a temporary folder; that process then exits, so its memory
   is not counted here.
2. This process imports keras and keras-mha, notes its resident memory (RSS), loads the
   checkpoint with `keras_mha.models.from_pretrained` and reads its peak RSS
   (`ru_maxrss`, Linux) afterwards.

The increase of the peak over the baseline, divided by the checkpoint's size, is what
loading costs: the model's own variables are 1x; anything above is transient (one
tensor read and converted at a time). The target is < 1.5x.

Run:

    KERAS_BACKEND=jax python examples/load_memory.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

WRITE_CHECKPOINT = """
import sys, torch, transformers
config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, vocab_size=16000, tie_word_embeddings=False)
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).save_pretrained(sys.argv[1])
"""


def rss_bytes() -> int:
    """Current resident set size, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> dict:
    import keras

    from keras_mha.models import from_pretrained

    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-c", WRITE_CHECKPOINT, folder], check=True)
        size = sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))
        keras.ops.zeros((1,))  # initialise the backend before the baseline
        baseline = rss_bytes()
        model = from_pretrained(folder)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        after = rss_bytes()
    results = {
        "backend": keras.backend.backend(),
        "checkpoint_bytes": size,
        "parameters": model.count_params(),
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "rss_after_load_bytes": after,
        "peak_increase_over_checkpoint": (peak - baseline) / size,
        "held_after_load_over_checkpoint": (after - baseline) / size,
    }
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
