"""The README's two set-up commands are what CI runs, and stay runnable."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup, flags=re.S)


@pytest.mark.backend_independent
def test_readme_has_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in command for command in commands)
    assert "keras-mha inspect" in commands[0]
    for backend in ("tensorflow", "jax", "torch"):
        assert backend in commands[1]


@pytest.mark.backend_independent
def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines
    assert "set -euo pipefail" in ci_lines


@pytest.mark.backend_independent
def test_ci_fails_when_a_backend_fails(tmp_path):
    """The loop stops with a failure as soon as one backend's run fails."""
    command = readme_commands()[1]
    loop = command[command.index("(set -e;") :]
    fake_python = tmp_path / ".venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    # A stand-in interpreter that fails only for the jax leg and logs each call.
    fake_python.write_text(
        '#!/usr/bin/env bash\necho "$KERAS_BACKEND" >> calls.log\n[ "$KERAS_BACKEND" != jax ]\n'
    )
    fake_python.chmod(0o755)
    result = subprocess.run(["bash", "-c", loop], cwd=tmp_path)
    assert result.returncode != 0
    assert (tmp_path / "calls.log").read_text().split() == ["tensorflow", "jax"]


@pytest.mark.backend_independent
def test_ci_accepts_a_leg_that_collects_no_tests(tmp_path):
    """pytest's exit status 5 (no tests collected) is not a failure; every leg still runs."""
    command = readme_commands()[1]
    loop = command[command.index("(set -e;") :]
    fake_python = tmp_path / ".venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(
        '#!/usr/bin/env bash\necho "$KERAS_BACKEND" >> calls.log\n'
        '[ "$KERAS_BACKEND" != jax ] || exit 5\n'
    )
    fake_python.chmod(0o755)
    result = subprocess.run(["bash", "-c", loop], cwd=tmp_path)
    assert result.returncode == 0
    assert (tmp_path / "calls.log").read_text().split() == ["tensorflow", "jax", "torch"]


@pytest.mark.backend_independent
def test_main_job_runs_on_a_bundled_card():
    """The first command's last step, with the installed console script."""
    script = shutil.which("keras-mha") or str(Path(sys.executable).parent / "keras-mha")
    last_step = readme_commands()[0].split("&&")[-1].split()
    result = subprocess.run([script, *last_step[1:]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "8,030,261,248" in result.stdout
