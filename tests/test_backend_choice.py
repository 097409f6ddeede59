"""The Keras backend on a new user's install: `KERAS_BACKEND` unset and Keras's default
(TensorFlow) missing picks the installed backend and says so in one line; a named backend
that is missing, or no backend at all, is one `keras_mha` error line instead of Keras's
traceback. Missing backends are simulated in a fresh interpreter whose import system
refuses them, never by uninstalling."""

import os
import subprocess
import sys

import pytest

from keras_mha import backend_choice, cli
from keras_mha.backend_choice import choose
from keras_mha.errors import MissingDependencyError

pytestmark = pytest.mark.backend_independent


def only(*names):
    return lambda name: name in names


@pytest.mark.parametrize(
    "present, keras_json, picked, says",
    [
        (("jax",), None, "jax", "tensorflow (its default), which is not installed: using jax, "),
        (("jax", "torch"), None, "jax", "installed: jax, torch"),
        (("torch",), "tensorflow", "torch", "tensorflow (~/.keras/keras.json)"),
        (("torch",), "jax", "torch", "Keras would use jax"),
    ],
)
def test_unset_and_missing_picks_the_installed_backend_in_one_line(
    present, keras_json, picked, says
):
    environ = {}
    message = choose(environ, installed=only(*present), configured=keras_json)
    assert environ == {"KERAS_BACKEND": picked}
    assert says in message and "\n" not in message and "KERAS_BACKEND" in message


@pytest.mark.parametrize(
    "environ, present, keras_json",
    [
        ({}, ("tensorflow", "jax"), None),  # Keras's default is there
        ({}, ("jax",), "jax"),  # keras.json names an installed one
        ({"KERAS_BACKEND": "torch"}, ("torch",), "jax"),  # the user chose
        ({}, ("jax",), "numpy"),  # a backend keras-mha does not check is Keras's to judge
        ({"KERAS_BACKEND": "jaxx"}, ("jax",), None),  # an unknown name: Keras's error
    ],
)
def test_a_backend_that_is_there_or_was_chosen_is_left_alone(environ, present, keras_json):
    before = dict(environ)
    assert choose(environ, installed=only(*present), configured=keras_json) is None
    assert environ == before


def test_a_chosen_backend_that_is_missing_names_the_installed_ones_and_the_extra():
    with pytest.raises(MissingDependencyError) as error:
        choose({"KERAS_BACKEND": "tensorflow"}, installed=only("jax", "torch"), configured=None)
    assert str(error.value) == (
        "KERAS_BACKEND=tensorflow but tensorflow is not installed; set KERAS_BACKEND to jax or "
        "torch, or install it: pip install 'keras-mha[tensorflow]'"
    )


def test_no_backend_at_all_names_the_extras():
    with pytest.raises(MissingDependencyError, match=r"^no Keras backend is installed .*\[jax\]"):
        choose({}, installed=only(), configured=None)


# A fresh interpreter in which the named packages are absent: `import` raises
# ModuleNotFoundError and `importlib.util.find_spec` answers None, as for a package never
# installed.
_BLOCKED = """
import sys
sys.modules.update(dict.fromkeys({blocked!r}))
"""


def run_without(blocked, code, tmp_path, **environ):
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    # An empty Keras home: no keras.json from this machine's earlier runs.
    env.update(KERAS_HOME=str(tmp_path), PYTHONWARNINGS="default", **environ)
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED.format(blocked=list(blocked)) + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_without_any_backend_the_layer_import_is_one_keras_mha_line(tmp_path):
    completed = run_without(
        ["tensorflow", "jax", "torch"],
        "from keras_mha import GroupedQueryAttention",
        tmp_path,
    )
    assert completed.returncode == 1
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("keras_mha.errors.MissingDependencyError: no Keras backend is")
    assert "keras/src" not in completed.stderr  # Keras never started importing a backend


def test_without_any_backend_the_cli_says_so_in_one_line_with_its_exit_code(tmp_path):
    (tmp_path / "text.txt").write_text("A short text.")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    completed = run_without(
        ["tensorflow", "jax", "torch"],
        "from keras_mha.cli import main\n"
        f"sys.exit(main(['heads', {str(tmp_path)!r}, '--text', {str(tmp_path / 'text.txt')!r}]))",
        tmp_path,
    )
    assert completed.returncode == MissingDependencyError.exit_code
    assert completed.stderr.startswith("keras-mha: error: no Keras backend is installed")
    assert completed.stderr.count("\n") == 1


def test_without_keras_default_the_installed_backend_is_used_and_named(tmp_path):
    completed = run_without(
        ["tensorflow", "jax"],
        "from keras_mha import GroupedQueryAttention\n"
        "import keras\n"
        "print(keras.backend.backend(), GroupedQueryAttention(2, 1, head_dim=4).num_heads)",
        tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == ["torch", "2"]
    warning = [line for line in completed.stderr.splitlines() if "KERAS_BACKEND" in line]
    assert len(warning) == 1 and "using torch, the one installed" in warning[0]


def test_the_hook_runs_once_and_steps_aside(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    backend_choice.install()
    hooks = [finder for finder in sys.meta_path if isinstance(finder, backend_choice._BeforeKeras)]
    assert len(hooks) == 1 and hooks[0].find_spec("keras.src") is None
    assert hooks[0] in sys.meta_path  # only `keras` itself triggers it
    assert hooks[0].find_spec("keras") is None and hooks[0] not in sys.meta_path


@pytest.mark.parametrize("command", ["heads", "prune", "convert", "bench"])
def test_the_help_of_commands_that_run_a_model_names_keras_backend(capsys, command):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "KERAS_BACKEND" in out
    assert max(map(len, out.splitlines())) <= 80, out
