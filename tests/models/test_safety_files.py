"""Hostile checkpoint files and careless output folders, written as an attacker would.

- The safetensors reader accepts exactly the files the `safetensors` library's own
  `safe_open` accepts (random header bytes, flipped bytes, the issue's list), reads the
  tensors that library reads, and refuses everything else with one `CheckpointError`
  naming the file, never allocating from the header's length.
- An index or a checkpoint folder never makes keras-mha read outside the folder (`..`,
  absolute names, symlinks), except the HF cache's own snapshot -> blobs links.
- An output folder that is, contains or lies inside the source is refused (random
  placements, symlinks); `--overwrite` replaces only what the export writes, and puts
  everything back when a move fails.
"""

import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from keras_mha.cli import main
from keras_mha.data.text import read_text
from keras_mha.errors import CheckpointError, ExportError, PathError
from keras_mha.models import export_files
from keras_mha.models.export import source_files
from keras_mha.models.export_files import check_output_folder, output_folder, parse_size
from keras_mha.models.safetensors_reader import SafetensorsCheckpoint, count_nonfinite

pytestmark = pytest.mark.backend_independent

FUZZ = settings(
    max_examples=int(os.environ.get("KERAS_MHA_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TENSORS = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.array([1, -2], dtype=np.int64),
}


def _header_file(path, header, data=b"", length=None):
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(encoded) if length is None else length
    path.write_bytes(struct.pack("<Q", size) + encoded + data)
    return path


def _library_accepts(path) -> bool:
    try:
        with safe_open(str(path), framework="np"):
            return True
    except (SafetensorError, OSError):
        return False


def _refused_naming(path, folder=None):
    with pytest.raises(CheckpointError) as error:
        SafetensorsCheckpoint(folder or path.parent)
    message = str(error.value)
    assert str(path) in message and "\n" not in message, message
    return message


def _tree(folder):
    """Every file under `folder` with its bytes (links as their targets)."""
    return {
        os.path.relpath(os.path.join(root, name), folder): (
            os.readlink(os.path.join(root, name))
            if os.path.islink(os.path.join(root, name))
            else open(os.path.join(root, name), "rb").read()
        )
        for root, _, names in os.walk(folder)
        for name in names
    }


# -- the safetensors reader ---------------------------------------------------------------------

ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
ISSUE_FILES = {
    "length 2^64-1": (b"{}", b"", 2**64 - 1),
    "length 2^40": (b"{}", b"", 2**40),
    "nested 100k deep": (b"[" * 100_000 + b"]" * 100_000, b"", None),
    "dtype given as a list": ({"a": {**ENTRY, "dtype": ["F32"]}}, b"\0" * 8, None),
    "data_offsets of 2^62": ({"a": {**ENTRY, "data_offsets": [2**62, 2**62 + 8]}}, b"\0" * 8, None),
    "data_offsets of 2^64": ({"a": {**ENTRY, "data_offsets": [0, 2**64]}}, b"\0" * 8, None),
    "overlapping offsets": (
        {"a": ENTRY, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
        b"\0" * 8,
        None,
    ),
    "a gap": ({"a": {**ENTRY, "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None),
    "shape and offsets disagree": ({"a": {**ENTRY, "shape": [3]}}, b"\0" * 8, None),
    "truncated data": ({"a": ENTRY}, b"\0" * 4, None),
    "negative shape": ({"a": {**ENTRY, "shape": [-2]}}, b"\0" * 8, None),
    "metadata not strings": ({"__metadata__": {"x": 1}, "a": ENTRY}, b"\0" * 8, None),
}


@pytest.mark.parametrize("case", ISSUE_FILES)
def test_malformed_files_are_one_checkpoint_error_naming_the_file(tmp_path, case):
    header, data, length = ISSUE_FILES[case]
    path = _header_file(tmp_path / "model.safetensors", header, data, length)
    _refused_naming(path)


def test_files_too_short_or_not_files_are_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    for content in (b"", b"abc"):
        path.write_bytes(content)
        assert "not a safetensors file" in _refused_naming(path)
    path.unlink()
    os.mkfifo(path)  # reading a FIFO would block forever
    assert "not a regular file" in _refused_naming(path)


def _mutations(valid: bytes):
    flips = st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)).map(
        lambda change: valid[: change[0]] + bytes([change[1]]) + valid[change[0] + 1 :]
    )
    cuts = st.integers(0, len(valid) - 1).map(lambda n: valid[:n])
    entries = st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "F8_E8M0", "X"]),
            "shape": st.lists(st.integers(-1, 4), max_size=3),
            "data_offsets": st.lists(st.integers(-1, 40), min_size=2, max_size=2),
        }
    )
    headers = st.dictionaries(st.sampled_from(["a", "b", "__metadata__"]), entries, max_size=3)
    built = st.tuples(headers, st.binary(max_size=48)).map(
        lambda made: (
            struct.pack("<Q", len(json.dumps(made[0]))) + json.dumps(made[0]).encode() + made[1]
        )
    )
    return st.one_of(flips, cuts, built, st.binary(max_size=64))


VALID = None


def _valid_bytes(tmp_path_factory):
    global VALID
    if VALID is None:
        path = tmp_path_factory.mktemp("valid") / "model.safetensors"
        save_file(TENSORS, path)
        VALID = path.read_bytes()
    return VALID


@FUZZ
@given(data=st.data())
def test_the_reader_accepts_exactly_what_safetensors_accepts(tmp_path_factory, data):
    content = data.draw(_mutations(_valid_bytes(tmp_path_factory)))
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "model.safetensors"
    path.write_bytes(content)
    if not _library_accepts(path):
        _refused_naming(path)
        return
    checkpoint = SafetensorsCheckpoint(folder)
    with safe_open(str(path), framework="np") as reference:
        assert checkpoint.keys() == sorted(reference.keys())
        for key in checkpoint.keys():
            try:
                ours = checkpoint.read(key)
            except CheckpointError as error:  # a dtype NumPy cannot hold, named
                assert key in str(error) and "dtype" in str(error)
                continue
            theirs = reference.get_tensor(key)
            assert ours.shape == theirs.shape
            assert ours.tobytes() == np.ascontiguousarray(theirs).tobytes(), key


# -- index and shards: nothing is read outside the folder ----------------------------------------


@pytest.fixture
def indexed(tmp_path):
    """A folder with one good shard and a file with other tensors outside it."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    save_file(TENSORS, folder / "inside.safetensors")
    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"stolen": np.ones(3, np.float32)}, outside / "x.safetensors")
    return folder, outside / "x.safetensors"


def _write_index(folder, weight_map):
    path = folder / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.mark.parametrize(
    "shard, message",
    [
        ("../outside/x.safetensors", "through '..'"),
        ("ABSOLUTE", "absolute"),
        ("link.safetensors", "outside the checkpoint folder"),
        ("sub/../../outside/x.safetensors", "through '..'"),
        (".", "not a regular file"),
        (7, "expected the file name of a shard"),
        (["x"], "expected the file name of a shard"),
        ("missing.safetensors", "are missing"),
    ],
)
def test_index_shards_outside_the_folder_are_refused(indexed, shard, message):
    folder, outside = indexed
    os.symlink(outside, folder / "link.safetensors")
    shard = str(outside) if shard == "ABSOLUTE" else shard
    index = _write_index(folder, {"a": "inside.safetensors", "stolen": shard})
    with pytest.raises(CheckpointError, match=message) as error:
        SafetensorsCheckpoint(folder)
    assert str(folder) in str(error.value) or str(index) in str(error.value)


@FUZZ
@given(
    values=st.lists(
        st.one_of(
            st.sampled_from(
                ["inside.safetensors", "../outside/x.safetensors", "link.safetensors", "", "."]
            ),
            st.integers(),
            st.none(),
            st.lists(st.text(max_size=3), max_size=2),
            st.text(max_size=12),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_random_index_maps_load_only_inside_shards(tmp_path_factory, values):
    folder = tmp_path_factory.mktemp("index") / "checkpoint"
    folder.mkdir()
    save_file(TENSORS, folder / "inside.safetensors")
    save_file({"stolen": np.ones(3, np.float32)}, folder.parent / "x.safetensors")
    os.symlink(folder.parent / "x.safetensors", folder / "link.safetensors")
    keys = ["a", "b", "stolen", "c"][: len(values)]
    _write_index(folder, dict(zip(keys, values, strict=True)))
    try:
        checkpoint = SafetensorsCheckpoint(folder)
    except CheckpointError as error:
        assert "\n" not in str(error)
        return
    # Only a map of the inside shard's own tensors loads.
    assert set(values) == {"inside.safetensors"} and "stolen" not in checkpoint.keys()


def test_malformed_indexes_are_named(tmp_path):
    folder = tmp_path
    save_file(TENSORS, folder / "inside.safetensors")
    index = folder / "model.safetensors.index.json"
    for content, message in [
        ("[" * 100_000, "nested too deeply"),
        ("[1, 2]", "found \\[1, 2\\]"),
        ('{"metadata": {}}', "without 'weight_map'"),
        ('{"weight_map": [1]}', "'weight_map': \\[1\\]"),
        ('{"weight_map": {"zz": "inside.safetensors"}}', "places tensor 'zz' in this shard"),
    ]:
        index.write_text(content)
        with pytest.raises(CheckpointError, match=message) as error:
            SafetensorsCheckpoint(folder)
        assert "\n" not in str(error.value)


def test_the_hf_cache_layout_links_into_blobs(tmp_path):
    """`snapshots/<commit>/model.safetensors -> ../../blobs/<hash>` is the HF cache's own."""
    repository = tmp_path / "models--org--name"
    (repository / "blobs").mkdir(parents=True)
    save_file(TENSORS, repository / "blobs" / "0123abcd")
    snapshot = repository / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/0123abcd", snapshot / "model.safetensors")
    np.testing.assert_array_equal(SafetensorsCheckpoint(snapshot).get("a"), TENSORS["a"])
    # The same link in an ordinary folder leads outside it.
    plain = tmp_path / "plain" / "x"
    plain.mkdir(parents=True)
    os.symlink(repository / "blobs" / "0123abcd", plain / "model.safetensors")
    _refused_naming(plain / "model.safetensors", plain)


@FUZZ
@given(
    values=st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0])),
        max_size=40,
    ),
    dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16", "int32"]),
)
def test_nonfinite_count_matches_numpy(values, dtype):
    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    with np.errstate(all="ignore"):
        array = (
            np.array(values, dtype="float64").astype(numpy_dtype)
            if dtype != "int32"
            else (np.arange(len(values), dtype="int32"))
        )
    expected = int((~np.isfinite(array.astype("float64"))).sum())
    assert count_nonfinite(array.reshape(-1, 1)) == expected


# -- output folders: never the source, never a file the export did not write ---------------------


def _source(tmp_path):
    source = tmp_path / "project" / "model"
    (source / "1_Pooling").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "1_Pooling" / "config.json").write_text("{}")
    (tmp_path / "project" / "notes.txt").write_text("mine")
    (tmp_path / "project" / "config.json").write_text("{}")
    return source


PLACEMENTS = ["source", "inside", "parent", "sibling", "link to source", "link inside", "dotted"]


@FUZZ
@given(placement=st.sampled_from(PLACEMENTS), depth=st.integers(1, 3), trailing=st.booleans())
def test_output_folder_relative_to_the_source(tmp_path_factory, placement, depth, trailing):
    root = tmp_path_factory.mktemp("placements")
    source = _source(root)
    before = _tree(root / "project")
    deeper = os.path.join(*[f"d{i}" for i in range(depth)])
    out = {
        "source": source,
        "inside": source / deeper,
        "parent": source.parents[depth - 1] if depth <= 2 else source.parent,
        "sibling": source.parent / f"other{depth}",
        "link to source": root / "link",
        "link inside": root / "link" / deeper,
        "dotted": source / deeper / ".." / "..",
    }[placement]
    os.symlink(source, root / "link")
    real, folder = os.path.realpath(out), os.path.realpath(source)
    expected = os.path.commonpath([real, folder]) in (real, folder)
    shown = str(out) + ("/" if trailing else "")
    try:
        check_output_folder(shown, overwrite=True, source=source)
        refused = None
    except PathError as error:
        refused = str(error)
    if expected:
        assert refused is not None and "source checkpoint folder" in refused, (out, refused)
    else:
        assert refused is None or "source checkpoint folder" not in refused
    assert _tree(root / "project") == before


def test_overwrite_replaces_only_the_exported_files(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    for name, text in {
        "config.json": "old",
        "model-00001-of-00002.safetensors": "old",
        "model-00002-of-00002.safetensors": "old",
        "model.safetensors.index.json": "old",
        "tokenizer.json": "old",
        "notes.txt": "mine",
        "model.safetensors.backup": "mine",
        "sub/keep.txt": "mine",
    }.items():
        (out / name).write_text(text)
    with output_folder(out, overwrite=True) as staging:
        for name in ("config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json"):
            (staging / name).parent.mkdir(exist_ok=True)
            (staging / name).write_text("new")
    assert _tree(out) == {
        "config.json": b"new",
        "model.safetensors": b"new",
        "tokenizer.json": b"new",
        os.path.join("1_Pooling", "config.json"): b"new",
        "notes.txt": b"mine",
        "model.safetensors.backup": b"mine",
        os.path.join("sub", "keep.txt"): b"mine",
    }
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging or replaced files left


def test_a_failed_move_puts_every_file_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "notes.txt"):
        (out / name).write_text(f"old {name}")
    before = _tree(out)
    rename, calls = os.rename, []

    def failing_rename(source, target):
        calls.append(target)
        if len(calls) == 4:  # after the old files went aside and one new file moved in
            raise OSError(28, "No space left on device")
        return rename(source, target)

    monkeypatch.setattr(export_files.os, "rename", failing_rename)
    with pytest.raises(PathError, match="No space left on device"):
        with output_folder(out, overwrite=True) as staging:
            for name in ("config.json", "model.safetensors", "tokenizer.json"):
                (staging / name).write_text("new")
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_folder_where_the_export_writes_a_file_is_refused_before_any_move(tmp_path):
    out = tmp_path / "out"
    (out / "tokenizer.json").mkdir(parents=True)
    (out / "config.json").write_text("old")
    before = _tree(out)
    with pytest.raises(PathError, match="holds a folder 'tokenizer.json'"):
        with output_folder(out, overwrite=True) as staging:
            (staging / "config.json").write_text("new")
            (staging / "tokenizer.json").write_text("new")
    assert _tree(out) == before and sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize(
    "value, message",
    [
        (None, "out_dir=None is not a folder to write"),
        ("", "is not a folder to write"),
        ("   ", "is not a folder to write"),
        (3, "out_dir=3 is not a folder to write"),
        (b"bytes", "is not a folder to write"),
        ("a\0b", "cannot be used as a folder \\(embedded null byte\\)"),
        ("x" * 5000, "truncated\\) cannot be used as a folder \\(File name too long\\)"),
    ],
)
def test_an_output_that_is_not_a_path_is_refused(value, message):
    with pytest.raises(PathError, match=message) as error:
        check_output_folder(value, argument="out_dir")
    assert len(str(error.value)) < 300


@pytest.mark.parametrize("size", ["inf", "nan", "-inf", "1e400GB", float("inf"), "infGB"])
def test_shard_sizes_that_are_not_finite_are_refused(size):
    with pytest.raises(ExportError, match="max_shard_size"):
        parse_size(size)


def test_copied_files_stay_inside_the_source(tmp_path):
    source = tmp_path / "source"
    (source / "1_Pooling").mkdir(parents=True)
    (source / "tokenizer.json").write_text("{}")
    (source / "1_Pooling" / "config.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    assert sorted(source_files(source)) == ["1_Pooling/config.json", "tokenizer.json"]
    os.symlink(secret, source / "vocab.txt")
    with pytest.raises(CheckpointError, match="vocab.txt' resolves to .*secret.txt'"):
        source_files(source)
    (source / "vocab.txt").unlink()
    os.symlink(secret, source / "1_Pooling" / "extra.json")
    with pytest.raises(CheckpointError, match="extra.json' resolves to"):
        source_files(source)
    (source / "1_Pooling" / "extra.json").unlink()
    os.symlink(tmp_path, source / "1_Pooling" / "folder")
    with pytest.raises(CheckpointError, match="is a link to a folder"):
        source_files(source)


def test_a_huge_max_tokens_reads_the_whole_text(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("héllo " * 1000)
    assert read_text(text, max_characters=10**18) == "héllo " * 1000
    assert read_text(text, max_characters=7) == "héllo h"


# -- keras-mha prune: refused before anything is loaded ------------------------------------------


@pytest.mark.parametrize(
    "arguments, code, message",
    [
        (["--out", "{project}", "--overwrite"], 14, "contains the source checkpoint folder"),
        (["--out", "{source}", "--overwrite"], 14, "is the source checkpoint folder"),
        (["--out", "{source}/1_Pooling", "--overwrite"], 14, "lies inside the source"),
        (["--out", "{link}/new"], 14, "lies inside the source"),
        (["--out", "{project}/o", "--heatmap", "{source}/h.png"], 14, "--heatmap: .*lies inside"),
        (["--out", "{project}/o", "--max-shard-size", "inf"], 2, "--max-shard-size 'inf'"),
        (["--out", "{project}/o", "--max-shard-size", "nan"], 2, "--max-shard-size 'nan'"),
        (["--out", "{project}/o", "--tokenizer-link"], 10, "tokenizer.json' resolves to"),
    ],
)
def test_prune_refuses_before_loading_and_touches_nothing(
    tmp_path, capsys, arguments, code, message
):
    import re

    source = _source(tmp_path)
    os.symlink(source, tmp_path / "link")
    if "--tokenizer-link" in arguments:
        arguments = [a for a in arguments if a != "--tokenizer-link"]
        os.symlink(tmp_path / "project" / "notes.txt", source / "tokenizer.json")
    before = _tree(tmp_path / "project")
    values = {"project": tmp_path / "project", "source": source, "link": tmp_path / "link"}
    command = ["prune", str(source), "--target", "1", "--method", "magnitude"]
    command += [argument.format(**values) for argument in arguments]
    capsys.readouterr()
    assert main(command) == code
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and re.search(message, error[0]), error
    assert _tree(tmp_path / "project") == before
