"""Find and run the code blocks of README.md and docs/**/*.md (`tests/test_docs.py`).

How a page's fenced blocks are read:

- ```` ```python ````: runs, in page order, in one namespace per page (later blocks use
  what earlier ones defined), with a scratch folder of the page as working directory (it
  links the repository's top-level entries, so paths from the repository root work).
- ```` ```console ````: each `$ command` runs and the lines after it, up to the next `$`,
  are its expected output (stdout and stderr together). `...` alone on a line stands for
  any number of lines, and inside a line for any text. A `keras-mha` command without
  pipes or redirections runs in this process (`keras_mha.cli.main`, its arguments
  expanded by bash), anything else with bash. Unless the expected output shows an error,
  the command must succeed.
- ```` ```bash ````: runs with `bash -e` in the page's scratch folder.
- Any other language (`text`, `json`, `toml`, ...) is not code.

An HTML comment on the line before a block changes how it runs:

- `<!-- test: skip REASON -->`: not run (a GPU, the Hub, a long run); REASON says why and
  is the test's skip reason.
- `<!-- test: subprocess -->`: a python block that sets up its own process (environment
  variables read at import, such as `XLA_FLAGS`, and the backend), run once by a fresh
  interpreter.
- `<!-- test: only BACKEND -->`: a block written for one backend (`jax.jit`,
  `tf.function`, `torch.compile`), run in that backend's leg only.
- `<!-- test: once REASON -->`: a block that runs keras but only once, in the leg of the
  backend-independent tests, because a full run costs seconds on each backend (a real
  checkpoint) and other tests cover the backends; REASON says which.

A block needs a Keras backend, and so runs in every leg of the test command, when it runs
keras: a python block that mentions `keras` other than through `import keras_mha`,
`keras_mha.planning`, `.families`, `.hub`, `.errors` or `.plan`; a command that runs `python` or
`keras-mha prune|bench|heads|convert`.
Every other block runs once, in the leg of the backend-independent tests.

`python tests/docs_examples.py --update FILE...` writes each console block's actual output
into the file (for output that changed on purpose; review the diff).

Example:
    >>> [block.language for block in parse_blocks("x.md", "```python\\nprint(1)\\n```\\n")]
    ['python']
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ("python", "console", "bash")
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<language>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```$", re.M | re.S
)
MARKER = re.compile(r"<!-- test: (?P<kind>skip|subprocess|only|once)(?: (?P<reason>.*?))? -->\s*$")
# Python that uses keras-mha without keras: the model cards, the families, the Hub, the
# planner and the error classes (`import keras_mha` itself imports no keras: its layers
# load on first use).
KERAS_FREE_MODULES = re.compile(
    r"\bkeras_mha\.(cards|families|errors|hub|plan|Plan)\b|\bimport keras_mha$|keras-mha", re.M
)
BACKEND_COMMANDS = re.compile(r"\bkeras-mha (prune|bench|heads|convert)\b|(^|[\s;&|(])python3?\b")
SHELL_OPERATORS = re.compile(r"[|;&<>]")


@dataclass
class Block:
    """One fenced code block of a page."""

    path: str
    line: int
    language: str
    code: str
    skip_reason: str | None = None
    subprocess: bool = False
    only_backend: str | None = None
    once_reason: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def needs_backend(self) -> bool:
        if self.subprocess:  # it sets up its own process, the backend included
            return False
        if self.language == "python":
            return "keras" in KERAS_FREE_MODULES.sub("", self.code)
        return bool(BACKEND_COMMANDS.search(self.code))


def parse_blocks(path: str, text: str) -> list[Block]:
    """The runnable blocks of a Markdown page, in order."""
    blocks = []
    for match in FENCE.finditer(text):
        if match["language"] not in RUNNABLE:
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        code = "\n".join(row[len(match["indent"]) :] for row in match["code"].splitlines())
        block = Block(path, line, match["language"], code)
        if marker and marker["kind"] in ("skip", "once") and not marker["reason"]:
            raise ValueError(f"{block.name}: `<!-- test: {marker['kind']} -->` needs a reason")
        if marker and marker["kind"] == "skip":
            block.skip_reason = marker["reason"]
        if marker and marker["kind"] == "once":
            block.once_reason = marker["reason"]
        block.subprocess = bool(marker and marker["kind"] == "subprocess")
        if marker and marker["kind"] == "only":
            block.only_backend = marker["reason"]
        blocks.append(block)
    return blocks


def documentation_pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_blocks() -> list[Block]:
    return [
        block
        for page in documentation_pages()
        for block in parse_blocks(str(page.relative_to(ROOT)), page.read_text(encoding="utf-8"))
    ]


# ----------------------------------------------------------------------------- console blocks
@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # the lines as the page writes them


def console_commands(code: str) -> list[Command]:
    """The `$ command` lines of a console block (a trailing `\\` continues a line), each
    with the output lines shown under it.

    Example:
        >>> console_commands("$ echo a \\\\\\n    b\\na b\\n")[0].text
        'echo a b'
    """
    commands: list[Command] = []
    continuing = False
    for line in code.splitlines():
        if continuing:
            commands[-1].text = commands[-1].text[:-1].rstrip() + " " + line.strip()
            commands[-1].source.append(line)
        elif line.startswith("$ "):
            commands.append(Command(line[2:].strip(), source=[line]))
        elif commands:
            commands[-1].expected.append(line)
        continuing = (
            bool(commands)
            and commands[-1].text.endswith("\\")
            and (line.startswith("$ ") or continuing)
        )
    return commands


def output_matches(expected: list[str], actual: str) -> bool:
    """Whether `actual` is what `expected` shows, `...` standing for any lines (alone on a
    line) or any text (inside a line); trailing spaces do not count, and a run of spaces
    matches any other (a table's columns widen with a figure that varies, such as a time).

    Example:
        >>> output_matches(["a", "...", "z ... end"], "a\\nb\\nc\\nz 1 2 end\\n")
        True
        >>> output_matches(["x   1  +2.0%"], "x   1 +12.0%\\n")
        False
        >>> output_matches(["x   1  +2.0%"], "x   1   +2.0%\\n")
        True
    """
    pattern = ""
    for line in expected:
        if line.strip() == "...":
            pattern += r"(?:.*\n)*?"
        else:
            parts = [_spaced(part) for part in line.rstrip().split("...")]
            pattern += ".*".join(parts) + r"\n"
    actual_lines = "".join(line.rstrip() + "\n" for line in actual.splitlines())
    return re.fullmatch(pattern, actual_lines) is not None


def _spaced(text: str) -> str:
    """`text` as a regex in which each run of spaces matches one or more spaces."""
    return " +".join(re.escape(word) for word in re.split(" +", text))


def shell_environment() -> dict[str, str]:
    """This interpreter's scripts first on PATH, as in an activated virtual environment."""
    environment = dict(os.environ)
    environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environment["PATH"]])
    paths = [str(ROOT), os.environ.get("PYTHONPATH")]
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return environment


def run_command(command: str, cwd: Path) -> tuple[int, str]:
    """Run one console command; returns its exit status and its stdout + stderr."""
    words = shlex.split(command)
    if words and words[0] == "keras-mha" and not SHELL_OPERATORS.search(command):
        expanded = subprocess.run(
            ["bash", "-c", 'printf "%s\\0" ' + command[len("keras-mha") :]],
            cwd=cwd, env=shell_environment(), capture_output=True, text=True, check=True,
        )  # fmt: skip
        return run_in_process(expanded.stdout.split("\0")[:-1], cwd)
    result = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=shell_environment(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return result.returncode, result.stdout


def run_in_process(argv: list[str], cwd: Path) -> tuple[int, str]:
    from keras_mha.cli import main

    output = io.StringIO()
    with working_directory(cwd), contextlib.redirect_stdout(output):
        with contextlib.redirect_stderr(output):
            status = main(argv)
    return status, output.getvalue()


@contextlib.contextmanager
def working_directory(path: Path):
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def scratch_folder() -> Path:
    """A new temporary folder that links the repository's top-level entries, so that a page
    written "from the repository root" reads `examples/...` and `cards/...` as there, while
    the files it writes land in the scratch folder."""
    folder = Path(tempfile.mkdtemp(prefix="keras-mha-docs-"))
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (folder / entry.name).symlink_to(entry)
    return folder


# ----------------------------------------------------------------------------- pages
class PageRun:
    """The state a page's blocks share: a namespace, a scratch folder, what already ran."""

    def __init__(self, path: str):
        self.path = path
        self.folder = scratch_folder()
        self.namespace: dict = {"__name__": "__main__"}
        self.done: dict[int, BaseException | None] = {}

    def run(self, block: Block) -> None:
        if block.line in self.done:
            if self.done[block.line] is not None:
                raise self.done[block.line]
            return
        try:
            RUNNERS[block.language](self, block)
        except BaseException as error:
            self.done[block.line] = error
            raise
        self.done[block.line] = None


def run_python(page: PageRun, block: Block) -> None:
    if block.subprocess:
        result = subprocess.run(
            [sys.executable, "-c", block.code], cwd=page.folder, env=shell_environment(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, f"{block.name} failed:\n{result.stdout[-3000:]}"
        return
    with working_directory(page.folder):
        exec(compile(block.code, block.name, "exec"), page.namespace)


def run_console(page: PageRun, block: Block) -> None:
    for command in console_commands(block.code):
        status, output = run_command(command.text, page.folder)
        shows_error = any("error:" in line for line in command.expected)
        failed = f"{block.name}: `{command.text}` exited {status}:\n{output}"
        assert shows_error or status == 0, failed
        assert output_matches(command.expected, output), (
            f"{block.name}: `{command.text}` printed\n{output}\nwhere the page shows\n"
            + "\n".join(command.expected)
        )


def run_bash(page: PageRun, block: Block) -> None:
    result = subprocess.run(
        ["bash", "-e", "-c", block.code], cwd=page.folder, env=shell_environment(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, f"{block.name} failed:\n{result.stdout[-3000:]}"


RUNNERS = {"python": run_python, "console": run_console, "bash": run_bash}


# ----------------------------------------------------------------------------- --update
def update_outputs(path: Path) -> int:
    """Write each console block's actual output into the page; returns the blocks changed.
    Blocks that show `...` are left alone (they elide output on purpose)."""
    text = path.read_text(encoding="utf-8")
    changed = 0
    for block in reversed(parse_blocks(str(path), text)):
        if block.language != "console" or block.skip_reason or "..." in block.code:
            continue
        folder = scratch_folder()
        lines = []
        for command in console_commands(block.code):
            lines += command.source
            lines += [line.rstrip() for line in run_command(command.text, folder)[1].splitlines()]
        new_code = "\n".join(lines) + "\n"
        if new_code != block.code.rstrip("\n") + "\n":
            start = text.index("\n", _offset(text, block.line)) + 1
            text = text[:start] + new_code + text[start + len(block.code.rstrip("\n")) + 1 :]
            changed += 1
    path.write_text(text, encoding="utf-8")
    return changed


def _offset(text: str, line: int) -> int:
    return sum(len(row) + 1 for row in text.split("\n")[: line - 1])


if __name__ == "__main__":
    if sys.argv[1:2] != ["--update"] or len(sys.argv) < 3:
        sys.exit("usage: python tests/docs_examples.py --update FILE.md...")
    for name in sys.argv[2:]:
        print(f"{name}: {update_outputs(Path(name))} console block(s) updated")
