"""What a new user meets in the first hour: the flag and extra named when `tokenizers` is
missing for `heads --text`, the `heads` tables and the progress bars within the terminal's
width (`--wide` for one block), and progress drawn whatever the output format."""

import io
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.analysis.data import model_tokenizer
from keras_mha.analysis.result import SHORT_LABELS, HeadRoles
from keras_mha.analysis.roles import LayerRoles
from keras_mha.errors import CheckpointError, MissingDependencyError
from keras_mha.planning.render.text import UNLIMITED
from keras_mha.progress import MIN_BAR_WIDTH, ProgressBar
from tests.cards.test_rebuild_minilm import minilm_directory

pytestmark = pytest.mark.backend_independent


def test_heads_without_tokenizers_names_text_and_the_heads_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` fails
    model = SimpleNamespace(source_directory=minilm_directory())
    with pytest.raises(MissingDependencyError) as error:
        model_tokenizer(model, None, argument="--tokenizer")
    assert str(error.value).startswith("--text needs the `tokenizers` package")
    assert "pip install 'keras-mha[heads]'" in str(error.value)
    with pytest.raises(MissingDependencyError, match=r"^data needs .*\[heads\]"):
        model_tokenizer(model, None, argument="tokenizer")  # head_roles(model, text)


def test_heads_on_a_folder_without_a_tokenizer_names_text_and_the_flag(tmp_path):
    model = SimpleNamespace(source_directory=tmp_path)
    with pytest.raises(CheckpointError, match=r"has no tokenizer\.json; --text is .*--tokenizer"):
        model_tokenizer(model, None, argument="--tokenizer")


def head_roles(layers, heads):
    roles = list(SHORT_LABELS)
    layer_roles = [
        LayerRoles({}, [roles[(layer + head) % len(roles)] for head in range(heads)], 10)
        for layer in range(layers)
    ]
    paths = [f"model/decoder_block_{index}/self_attention" for index in range(layers)]
    importance = {path: np.linspace(0.1, 1.0, heads) for path in paths}
    return HeadRoles(
        paths, layer_roles, model="/some/where/a-model-with-a-long-name", tokens=1000,
        sequences=20, backend="jax", importance=importance, importance_method="magnitude",
    )  # fmt: skip


@pytest.mark.parametrize("heads", [4, 12, 32])
def test_the_heads_tables_fit_80_columns_and_wide_keeps_one_block(heads):
    result = head_roles(6, heads)
    table = result.table()
    assert max(map(len, table.splitlines())) <= 80, table
    grid = table.split("roles (layer x head)\n")[1].split("\n  ")[0]
    headers = [line.split() for line in grid.splitlines() if line.startswith("layer")]
    # Every head once, in order, across the blocks; 12 heads (BERT, MiniLM) in one block.
    assert [int(h) for header in headers for h in header[1:]] == list(range(heads))
    assert len(headers) == (1 if heads <= 12 else -(-heads // 12))
    wide = result.table(UNLIMITED)
    assert sum(line.startswith("layer") for line in wide.splitlines()) == 2  # roles, importance
    assert "layers: 0 = model/decoder_block_0/self_attention, 1 = " in wide


@settings(max_examples=40, deadline=None)
@given(
    columns=st.integers(20, 200),
    label=st.sampled_from(["", "scoring heads", "uptraining (distillation)", "reading"]),
    total=st.integers(1, 10**6),
    tokens=st.one_of(st.none(), st.integers(1, 10**9)),
    done=st.floats(0, 1),
)
def test_a_progress_line_keeps_within_the_terminal(columns, label, total, tokens, done):
    times = iter([0.0, 3725.0])
    bar = ProgressBar(total, "batches", tokens, label, clock=lambda: next(times, 3725.0))
    bar.advance(tokens=int((tokens or 0) * done), items=int(total * done))
    full = bar.line()
    line = bar.line(columns=columns)
    assert len(line) < columns
    if len(full) < columns:
        assert line == full  # nothing changes when it fits
    elif len(line) < len(full) - (bar.width - MIN_BAR_WIDTH):
        assert line == bar._compose(3725.0, MIN_BAR_WIDTH)[: columns - 1]  # the bar shrank first


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_drawn_is_as_wide_as_the_terminal_says():
    stream = Terminal()
    bar = ProgressBar(40, "batches", 20480, "scoring heads", stream=stream, columns=60)
    for _ in range(40):
        bar.advance(512)
    bar.close()
    drawn = stream.getvalue().replace("\r", "\n").splitlines()
    assert drawn and max(map(len, drawn)) < 60 and "40/40 batches" in drawn[-1]


VERDICT = {
    "serving_fits": True, "weights_fit": True, "weights_dtype": "bfloat16",
    "kv_dtype": "bfloat16", "batch": 1, "memory_bytes": 2**30, "gpu": "L4 24GB",
    "devices": {"count": 1},
}  # fmt: skip


@pytest.mark.parametrize(
    "memory, context, says",
    [
        (4_061_577, 131_072, "its whole 131,072-token context at batch 1 on L4 24GB (bfloat16 "
         "weights, bfloat16 KV); the memory would hold 4,061,577 tokens, more than the model "
         "can use"),
        (100_000, 131_072, "up to 100,000 tokens of its 131,072-token context at batch 1"),
        (100_000, None, "up to 100,000 tokens at batch 1"),
        (None, 131_072, "a context unbounded by memory at batch 1"),
    ],
)  # fmt: skip
def test_the_verdict_says_what_the_model_can_use_then_what_memory_holds(memory, context, says):
    from keras_mha.planning.render.memory_report import verdict

    text = verdict({**VERDICT, "max_seq_len": memory, "context_length": context})
    assert text.startswith(f"serving fits: yes, {says}") and "(!)" not in text
