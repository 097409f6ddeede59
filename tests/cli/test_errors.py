"""`keras-mha` never shows a traceback: path problems, internal errors, Ctrl-C, closed or
full stdout, bad flags, hostile strings in a config, pasted Hub URLs, "did you mean"."""

import argparse
import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from keras_mha import cli, errors
from keras_mha.commands import inspect as inspect_command
from tests.configs import tiny_llama
from tests.hub_server import commit_hash, hub_environment

pytestmark = pytest.mark.backend_independent

README = Path(__file__).resolve().parents[2] / "README.md"
LLAMA_3 = "meta-llama/Meta-Llama-3-8B"
TINY_CONFIG = tiny_llama()
REPOS = {
    "org/tiny": {
        "main": {"config.json": json.dumps(TINY_CONFIG).encode()},
        "refs/pr/3": {"config.json": json.dumps({**TINY_CONFIG, "num_hidden_layers": 3}).encode()},
    }
}


def run_cli(capsys, *argv):
    exit_code = cli.main(list(argv))
    captured = capsys.readouterr()
    return exit_code, captured.out, captured.err


def assert_one_error_line(err: str, *mentions: str):
    assert err.startswith("keras-mha: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "\x1b" not in err
    for mention in mentions:
        assert mention in err, f"{mention!r} not in {err!r}"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with hub_environment(tmp_path, monkeypatch, REPOS) as server:
        yield server


# -- paths ------------------------------------------------------------------------------------


def test_a_directory_where_config_json_should_be(capsys, tmp_path):
    (tmp_path / "config.json").mkdir()
    code, out, err = run_cli(capsys, "inspect", str(tmp_path))
    assert code == 14 and out == ""
    assert_one_error_line(err, "is a directory")


def test_dev_zero_is_refused_at_once(capsys):
    code, _, err = run_cli(capsys, "inspect", "/dev/zero")
    assert code == 14
    assert_one_error_line(err, "/dev/zero", "character device")


def test_a_name_too_long(capsys, tmp_path):
    code, _, err = run_cli(capsys, "inspect", str(tmp_path / ("x" * 300) / "config.json"))
    assert code == 14
    assert_one_error_line(err, "too long")
    assert len(err) < 400


def test_no_permission(capsys, tmp_path, monkeypatch):
    # Tests may run as root, which ignores file modes: simulate the refusal.
    from keras_mha.hub import config_json

    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(config_json, "open", refuse, raising=False)
    code, _, err = run_cli(capsys, "inspect", str(tmp_path))
    assert code == 14
    assert_one_error_line(err, "permission denied")


def test_a_home_directory_of_no_user(capsys):
    code, _, err = run_cli(capsys, "inspect", "~no-such-user-here/config.json")
    assert code == 6
    assert_one_error_line(err, "~no-such-user-here/config.json", "no such file")


def test_a_huge_local_file_is_not_read(capsys, tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as handle:
        handle.truncate(50_000_000)  # sparse: 50 MB on paper, nothing on disk
    code, _, err = run_cli(capsys, "inspect", str(path))
    assert code == 7
    assert_one_error_line(err, "50,000,000 bytes")


def test_a_pipe_is_read_with_the_cap(capsys, tmp_path):
    read_end, write_end = os.pipe()
    os.write(write_end, json.dumps(TINY_CONFIG).encode())
    os.close(write_end)
    try:
        code, out, err = run_cli(capsys, "inspect", f"/proc/self/fd/{read_end}", "--format", "json")
    finally:
        os.close(read_end)
    assert code == 0, err
    assert json.loads(out)["attention"]["num_key_value_heads"] == 2


# -- stdout -----------------------------------------------------------------------------------


def run_process(arguments, **options):
    return subprocess.run(
        [sys.executable, "-m", "keras_mha.cli", *arguments],
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        **options,
    )


def test_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        completed = run_process(["inspect", f"bundled:{LLAMA_3}"], stdout=full)
    assert completed.returncode == 14
    assert_one_error_line(completed.stderr, "No space left on device")


def test_a_closed_stdout_is_one_line():
    completed = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m keras_mha.cli inspect bundled:{LLAMA_3} >&-'],
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 14
    assert_one_error_line(completed.stderr, "stdout is closed")


def test_a_reader_that_left_ends_the_run_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `| head -1` does once it has its line
    try:
        completed = run_process(["inspect", f"bundled:{LLAMA_3}"], stdout=write_end)
    finally:
        os.close(write_end)
    assert completed.returncode == cli.EXIT_BROKEN_PIPE == 141
    assert completed.stderr == ""


def test_broken_pipe_in_process(capsys, monkeypatch):
    class GoneReader:
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", GoneReader())
    assert cli.main(["cards"]) == 141
    assert capsys.readouterr().err == ""


# -- unexpected errors, Ctrl-C, --debug ------------------------------------------------------


def test_an_internal_error_is_one_line_with_a_hint(capsys, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("boom\nsecond line with hf_SecretToken0123456789")

    monkeypatch.setattr(inspect_command, "render", explode)
    code, out, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}")
    assert code == errors.INTERNAL_ERROR_EXIT_CODE == 70 and out == ""
    assert_one_error_line(err, "internal error: RuntimeError: boom", "--debug")
    assert "hf_SecretToken0123456789" not in err


def test_debug_prints_the_traceback(capsys, monkeypatch):
    monkeypatch.setattr(inspect_command, "render", lambda *args: None.missing)
    code, _, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}", "--debug")
    assert code == 70
    assert "Traceback (most recent call last)" in err and "None.missing" in err
    assert err.splitlines()[-1].startswith("keras-mha: error: internal error: AttributeError")


def test_ctrl_c_exits_130(capsys, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_command, "render", interrupt)
    code, _, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}")
    assert code == 130 and "Traceback" not in err


def test_every_keras_mha_error_exits_with_its_code(capsys, monkeypatch):
    for error_class in errors.ERROR_CLASSES:

        def fail(*args, error_class=error_class):
            raise error_class(f"{error_class.__name__} happened")

        monkeypatch.setattr(inspect_command, "render", fail)
        code, _, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}")
        assert code == error_class.exit_code
        assert_one_error_line(err, f"{error_class.__name__} happened")


def test_subcommands_registered_by_modules_get_the_same_handling(capsys, monkeypatch):
    # keras_mha/commands/<name>.py modules set `run` on their subparser.
    original = cli.build_parser

    def with_extra_command():
        parser = original()
        subparsers = next(
            action
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)  # noqa: SLF001
        )
        extra = subparsers.add_parser("explode")
        extra.set_defaults(run=lambda arguments: {}["missing"])
        return parser

    monkeypatch.setattr(cli, "build_parser", with_extra_command)
    code, _, err = run_cli(capsys, "explode")
    assert code == 70
    assert_one_error_line(err, "internal error: KeyError")


def test_a_warning_during_a_command_is_one_line_without_source_lines(capsys, monkeypatch):
    import warnings

    def warn_then_fail(*args):
        warnings.warn(
            "heads_to_prune: only 2 of 3\nheads (\x1b[2J) hf_SecretToken0123456789", stacklevel=2
        )
        raise errors.PruningError("no head can go")

    monkeypatch.setattr(inspect_command, "render", warn_then_fail)
    code, _, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}")
    warning, error = err.splitlines()
    assert code == 16 and error.startswith("keras-mha: error: ") and "no head can go" in error
    assert warning.startswith("keras-mha: warning: heads_to_prune: only 2 of 3")
    assert "\x1b[" not in warning and "hf_SecretToken0123456789" not in warning
    assert warnings.showwarning.__module__ == "warnings"  # Python's own display is back


def test_a_bad_benchmark_flag_is_one_line_like_every_other_subcommand(capsys):
    code, out, err = run_cli(capsys, "bench", "layers", "--frobnicate")
    assert code == 2 and out == ""
    assert_one_error_line(err, "bench layers: unrecognized arguments: --frobnicate")
    assert argparse.ArgumentParser.error is not cli.ArgumentParser.error  # restored


def test_an_unknown_keras_backend_is_one_line_with_the_fix(capsys, monkeypatch):
    def import_keras(*args):
        raise ValueError("Unable to import backend : jaxx")  # what `import keras` raises

    monkeypatch.setenv("KERAS_BACKEND", "jaxx")
    monkeypatch.setattr(inspect_command, "render", import_keras)
    code, _, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}")
    assert code == 2
    assert_one_error_line(err, "KERAS_BACKEND='jaxx' is not a Keras backend", "jax, tensorflow")


def test_a_missing_optional_package_is_one_line(capsys, monkeypatch):
    def need_matplotlib(*args):
        import matplotlib_that_is_not_installed  # noqa: F401

    monkeypatch.setattr(inspect_command, "render", need_matplotlib)
    code, _, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}")
    assert code == errors.MissingDependencyError.exit_code == 18
    assert_one_error_line(err, "matplotlib_that_is_not_installed", "pip install")


def test_undecodable_argument_bytes_are_shown_escaped(capsys):
    argument = b"/no/such/\xff\xfe/config.json".decode("utf-8", "surrogateescape")
    code, _, err = run_cli(capsys, "inspect", argument)
    assert code == 6
    assert_one_error_line(err, "\\udcff\\udcfe")


# -- argparse ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, mentions",
    [
        (["inspect", "gpt2", "--batch", "0"], ["--batch", "0", "positive integer"]),
        (["inspect", "gpt2", "--batch", "1e3"], ["--batch", "'1e3'", "integer"]),
        (["inspect", "gpt2", "--timeout", "nan"], ["--timeout", "'nan'", "seconds"]),
        (["inspect", "gpt2", "--timeout", "1e300"], ["--timeout", "seconds"]),
        (["inspect", "gpt2", "--format", "yaml"], ["--format", "'yaml'", "table"]),
        (
            ["inspect", "gpt2", "--frobnicate"],
            ["unrecognized arguments: --frobnicate", "see `keras-mha inspect --help`"],
        ),
        (["--frobnicate"], ["unrecognized arguments: --frobnicate", "see `keras-mha --help`"]),
        (["inspect"], ["MODEL"]),
        (["inspct", "gpt2"], ["'inspct'", "inspect"]),
    ],
)
def test_bad_arguments_are_one_short_line(capsys, argv, mentions):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_error_line(err, *mentions)
    assert "usage:" not in err


def test_help_still_works(capsys):
    code, out, _ = run_cli(capsys, "inspect", "--help")
    assert code == 0 and "--revision" in out


# -- strings from a config --------------------------------------------------------------------

HOSTILE_STRINGS = {
    "model_type": "llama",
    "architectures": [
        "Evil\x1b[2J\x1b]0;owned\x07\u202eForCausalLM<img src=x onerror=alert(1)>|`x`"
    ],
}


def test_hostile_strings_are_escaped_in_every_format(capsys, tmp_path):
    config = {**TINY_CONFIG, **HOSTILE_STRINGS}
    (tmp_path / "config.json").write_text(json.dumps(config))

    _, table, _ = run_cli(capsys, "inspect", str(tmp_path))
    _, markdown, _ = run_cli(capsys, "inspect", str(tmp_path), "--format", "markdown")
    _, as_json, _ = run_cli(capsys, "inspect", str(tmp_path), "--format", "json")

    for text in (table, markdown):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]", text)
    assert "\\x1b[2J" in table and "\\u202e" in table
    # In markdown the escape's own backslash and bracket are escaped: it renders as \x1b[2J.
    assert "\\\\x1b\\[2J" in markdown and "\\\\u202e" in markdown
    assert not re.search(r"(?<!\\)<img", markdown)  # only escaped: no raw HTML
    assert "\\<img" in markdown and "\\|" in markdown
    assert "\\`x\\`" in markdown
    # JSON stays JSON, with the strings exactly as the config holds them.
    assert json.loads(as_json)["architecture"] == HOSTILE_STRINGS["architectures"][0]
    assert "\x1b" not in as_json


# -- pasted Hub URLs and "did you mean" --------------------------------------------------------


@pytest.mark.parametrize(
    "url, revision",
    [
        ("https://huggingface.co/org/tiny", "main"),
        ("https://huggingface.co/org/tiny/tree/main", "main"),
        ("huggingface.co/org/tiny/blob/main/config.json", "main"),
        ("https://hf.co/org/tiny/tree/refs%2Fpr%2F3", "refs/pr/3"),
        (
            "https://huggingface.co/org/tiny/resolve/refs%2Fpr%2F3/config.json?download=true",
            "refs/pr/3",
        ),
    ],
)
def test_a_pasted_hub_url_is_a_model(capsys, hub, url, revision):
    code, out, err = run_cli(capsys, "inspect", url, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["model"] == "org/tiny" and report["revision"] == revision
    assert report["commit"] == commit_hash("org/tiny", revision)
    assert all("/org/tiny/resolve/" in request.path for request in hub.resolve_requests())


@pytest.mark.parametrize(
    "argv, code, mentions",
    [
        (["https://huggingface.co/org/tiny/tree/v1", "--revision", "v2"], 2, ["conflicts"]),
        (["https://huggingface.co/datasets/org/tiny"], 2, ["dataset"]),
        (["https://example.com/org/tiny"], 2, ["not a Hugging Face Hub model URL"]),
        (["https://huggingface.co/org/tiny/blob/main/model.safetensors"], 2, ["config.json"]),
        (["https://huggingface.co/org/tiny/tree/..%2F..%2Fx"], 11, ["'../../x'"]),
    ],
)
def test_urls_that_are_refused(capsys, hub, argv, code, mentions):
    exit_code, _, err = run_cli(capsys, "inspect", *argv)
    assert exit_code == code
    assert_one_error_line(err, *mentions)
    assert hub.requests == []


def test_did_you_mean_a_bundled_model_when_the_hub_has_no_such_repo(capsys, hub):
    code, _, err = run_cli(capsys, "inspect", "meta-llama/Meta-Llama-3-8b-typo")
    assert code == 3
    assert_one_error_line(err, f"did you mean {LLAMA_3} (bundled:{LLAMA_3})")


def test_did_you_mean_a_bundled_model_offline(capsys, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "inspect", "mistralai/Mistral-7B-v0.2")
    assert code == 8
    assert_one_error_line(err, "did you mean mistralai/Mistral-7B-v0.1")
    assert hub.requests == []


def test_an_offline_url_revision_the_bundled_card_lacks_names_the_url(capsys, hub, monkeypatch):
    """The revision came from the URL, so the advice cannot be only "drop --revision"."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "inspect", f"https://huggingface.co/{LLAMA_3}/tree/abc123")
    assert code == 8
    assert_one_error_line(err, "not 'abc123'", "the URL's /tree/...")
    assert hub.requests == []


@pytest.mark.parametrize(
    "data, mention",
    [
        ("/dev/zero", "is a character device"),
        ("TMP", "is a directory"),
        ("TMP/no", "does not exist"),
    ],
)
def test_prune_data_that_is_not_a_text_file_is_named_for_what_it_is(
    capsys, tmp_path, data, mention
):
    data = data.replace("TMP", str(tmp_path))
    out = tmp_path / "out"
    code, _, err = run_cli(
        capsys, "prune", str(tmp_path), "--target", "1", "--out", str(out), "--data", data
    )
    assert code == 14 and not out.exists()
    assert_one_error_line(err, f"--data: {data!r} {mention}", "expected a plain text file")
