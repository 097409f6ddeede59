"""The model-cards guide's plot command (it replaced examples/kv_cache_memory.py) runs end to
end as a fresh process and writes a readable PNG of six bundled models' KV caches."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# MHA, GQA, sliding-window GQA, MQA, MLA, Gemma 3's 5:1 local/global layers.
MODELS = [
    "bundled:meta-llama/Llama-2-7b-hf",
    "bundled:meta-llama/Meta-Llama-3-8B",
    "bundled:mistralai/Mistral-7B-v0.1",
    "bundled:tiiuae/falcon-7b",
    "bundled:deepseek-ai/DeepSeek-V2-Lite",
    "bundled:google/gemma-3-4b-it",
]


def test_compare_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "kv_cache_memory.png"
    command = [sys.executable, "-m", "keras_mha.cli", "compare", *MODELS, "--seq-len", "128k",
               "--gpu", "L4", "--plot", str(out), "--plot-max-seq-len", "128k",
               "--format", "json"]  # fmt: skip

    completed = subprocess.run(command, capture_output=True, text=True, timeout=120)

    assert completed.returncode == 0, completed.stderr
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert out.stat().st_size > 20_000  # six curves, a GPU line, labels and a legend
    assert completed.stderr == f"saved {out}\n"
    reports = {report["model"]: report for report in json.loads(completed.stdout)["models"]}
    kv = {model: report["kv_cache"]["total_bytes"] for model, report in reports.items()}
    # At 128k tokens MHA (Llama-2) costs 4x GQA (Llama-3: 32 vs 8 KV heads, same layers).
    assert kv["meta-llama/Llama-2-7b-hf"] == 4 * kv["meta-llama/Meta-Llama-3-8B"]
    # Mistral's sliding window caps its cache at 4096 tokens: 32 layers x 8 x 128 x 2 x 2.
    assert kv["mistralai/Mistral-7B-v0.1"] == 4096 * 32 * 8 * 128 * 2 * 2
