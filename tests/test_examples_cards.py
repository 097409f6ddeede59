"""The model-card example runs end to end and writes a readable PNG."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kv_cache_memory.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_kv_cache_memory_example_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "kv_cache_memory.png"

    completed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out), "--max-seq-len", "131072"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode == 0, completed.stderr
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert out.stat().st_size > 20_000  # six curves, labels and a legend, not an empty canvas
    table = completed.stdout.splitlines()
    # Header, six models, the "saved" line; 1k..128k is eight columns.
    assert len(table) == 8, completed.stdout
    assert table[0].split()[1:9] == ["1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k"]
    rows = {
        line.split(" (")[0]: [float(value) for value in line.split(")")[-1].split()]
        for line in table[1:7]
    }
    # At 128k tokens: MHA (Llama-2) costs 4x GQA (Llama-3: 32 vs 8 KV heads, same layers and dim).
    assert rows["Llama-2-7B"][-1] == pytest.approx(4 * rows["Llama-3-8B"][-1])
    # Mistral's sliding window caps its cache at 4096 tokens.
    assert rows["Mistral-7B"][-1] == rows["Mistral-7B"][2]
