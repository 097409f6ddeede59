"""`keras-mha heads MODEL --text FILE`: what each attention head does, on the user's text.

Steps: check every argument and output file (before anything heavy), load the model
(a Hub id or checkpoint folder through `from_pretrained`, or a `.keras` file of any
model with keras-mha attention layers), read `--text` with the checkpoint's tokenizer
(or `--tokenizer`), optionally score the heads (`--importance`, the scorers of
`keras-mha prune`), run `keras_mha.analysis.head_roles` (progress bar on stderr), and
print the tables (`--format table|markdown`) or the JSON of `HeadRoles.to_dict()`;
`--plot` and `--html` write the pictures, each through a temporary file renamed into
place when complete.

Example:
    keras-mha heads ./all-MiniLM-L6-v2 --text notes.txt --plot heads.png --html heads.html
    keras-mha heads ./tiny-llama --text notes.txt --importance taylor --format json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keras_mha.commands.options import (
    BACKEND_EPILOG,
    add_hub_arguments,
    add_text_batching_arguments,
    add_wide_argument,
    fit_text_batching_to_model,
)
from keras_mha.commands.output import write_stdout
from keras_mha.commands.terminal import report_width
from keras_mha.errors import MissingDependencyError, UnsupportedModelError, UsageError

IMPORTANCE_METHODS = ("taylor", "ablation", "magnitude")
DTYPES = ("float32", "bfloat16", "float16")
FORMATS = ("table", "json", "markdown")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `heads` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_parser(parser.add_subparsers())  # doctest: +SKIP
    """
    parser = subparsers.add_parser(
        "heads",
        help="what each attention head does on a text: roles, statistics, pictures",
        description=(
            "Run a model over a text and classify every attention head by what it attends "
            "to (previous/next token, itself, the first token, delimiters, rare tokens, a "
            "small window, everything; syntactic relations with --conllu), with each "
            "head's importance and which roles survive pruning (--importance)."
        ),
        epilog=BACKEND_EPILOG,
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="checkpoint folder, Hub model id, or a .keras file of a model with keras-mha "
        "attention layers",
    )
    parser.add_argument("--text", required=True, metavar="FILE", help="plain UTF-8 text to read")
    parser.add_argument(
        "--conllu", metavar="FILE", help="a CoNLL-U treebank: also find syntactic heads"
    )
    parser.add_argument(
        "--importance",
        metavar="METHOD",
        help=f"also score heads ({', '.join(IMPORTANCE_METHODS)}, as keras-mha prune) and "
        "report which roles survive 25%% / 50%% pruning",
    )
    parser.add_argument("--format", default="table", choices=FORMATS, help="output (default table)")
    parser.add_argument("--plot", metavar="FILE.png", help="save the layers x heads role grid")
    parser.add_argument(
        "--html", metavar="FILE.html", help="save a self-contained page: grid, click a head"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json (or its folder) to read the text with (default: the checkpoint's)",
    )
    add_text_batching_arguments(
        parser,
        text_flag="--text",
        seq_len_help="tokens per decoder window, at most per sentence",
        batch_help="sequences per forward pass",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, help="load and compute in this dtype (default: checkpoint's)"
    )
    add_wide_argument(parser)
    add_hub_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def _check_arguments(arguments):
    """Everything that can be refused without loading the model."""
    import importlib.util

    from keras_mha.data.text import check_text_file
    from keras_mha.models.export_files import check_output_file

    if arguments.importance is not None and arguments.importance not in IMPORTANCE_METHODS:
        raise UsageError(
            f"--importance {arguments.importance!r} is not a head-importance method; expected "
            f"one of {', '.join(IMPORTANCE_METHODS)}",
            key="--importance",
            value=arguments.importance,
        )
    check_text_file(arguments.text, argument="--text")
    if arguments.conllu is not None:
        from keras_mha.analysis.syntax import read_treebank

        # Parsed now (and again, cheaply, by head_roles), so that a file that is not
        # CoNLL-U is refused before the model loads.
        read_treebank(arguments.conllu, argument="--conllu")
    if arguments.plot:
        check_output_file(arguments.plot, suffix=".png", argument="--plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise MissingDependencyError("--plot needs matplotlib: pip install 'keras-mha[plot]'")
    if arguments.html:
        check_output_file(arguments.html, suffix=".html", argument="--html")
    if arguments.tokenizer is not None and not Path(arguments.tokenizer).exists():
        from keras_mha.errors import PathError

        raise PathError(
            f"--tokenizer: {arguments.tokenizer!r} does not exist; expected a tokenizer.json "
            "or the folder holding one",
            path=arguments.tokenizer,
        )


def read_text_argument(path, max_tokens, argument="--text"):
    """The text of `path`, refusing binary files and empty text (one line each)."""
    from keras_mha.analysis.syntax import check_not_binary
    from keras_mha.data.text import characters_to_read, read_text

    text = read_text(path, max_characters=characters_to_read(max_tokens), argument=argument)
    check_not_binary(text, path, argument)
    if not text.strip():
        raise UsageError(
            f"{argument}: {str(path)!r} is empty; expected plain text to run the model on",
            key=argument,
        )
    return text


def load_model(arguments):
    """The model: a `.keras` file, or a checkpoint through `from_pretrained`."""
    source = Path(arguments.model).expanduser()
    if source.suffix == ".keras" and source.is_file():
        import keras

        import keras_mha.layers  # noqa: F401 - registers the layers for deserialisation
        import keras_mha.models  # noqa: F401

        try:
            model = keras.saving.load_model(source)
        except Exception as error:  # Keras raises several types for a bad file
            raise UsageError(
                f"MODEL: {str(source)!r} is not a .keras model Keras can load ({error})",
                key="MODEL",
            ) from None
        return model
    from keras_mha.commands.options import load_checkpoint

    return load_checkpoint(arguments, arguments.model)


def _require_attention(model, arguments):
    from keras_mha.pruning.discovery import find_attention_layers

    if not find_attention_layers(model):
        raise UnsupportedModelError(
            f"MODEL: {arguments.model!r} ({type(model).__name__} {getattr(model, 'name', '')!r}) "
            "has no keras-mha attention layer; expected a model containing "
            "keras_mha.layers.GroupedQueryAttention / MultiHeadAttention / MultiQueryAttention",
            key="MODEL",
        )


def _importance(model, text, tokenizer, arguments, progress):
    """`{path: scores}` by `--importance`, on the same text as `keras-mha prune --data`."""
    from keras_mha.commands import prune
    from keras_mha.models import export as exporting
    from keras_mha.models.decoder import DecoderModel
    from keras_mha.models.encoder import EncoderModel
    from keras_mha.pruning import head_importance

    if arguments.importance == "magnitude":
        return head_importance(model, method="magnitude")
    if not isinstance(model, (DecoderModel, EncoderModel)):
        raise UsageError(
            f"--importance {arguments.importance} scores heads with a loss on the text, which "
            "needs a model from a checkpoint (a causal LM or an encoder); use --importance "
            "magnitude for this model",
            key="--importance",
        )
    kind = exporting.model_kind(model)
    scoring = argparse.Namespace(
        method=arguments.importance,
        batch_size=arguments.batch_size,
        seq_len=arguments.seq_len,
        max_tokens=arguments.max_tokens,
    )
    data = prune.scoring_data(tokenizer, text, kind, scoring, argument="--text")
    reference = None
    if kind == "encoder":
        from keras_mha.commands.prune_report import encoder_embeddings

        reference = encoder_embeddings(model, data, arguments.batch_size)
    return prune.score_heads(model, kind, data, scoring, reference, progress)


def run(arguments) -> int:
    """Run `keras-mha heads`; returns the exit status (errors are raised, main() prints them).

    Example:
        >>> from keras_mha.cli import main
        >>> main(["heads", "./all-MiniLM-L6-v2", "--text", "notes.txt"])  # doctest: +SKIP
        0
    """
    _check_arguments(arguments)
    text = read_text_argument(arguments.text, arguments.max_tokens)
    from keras_mha.analysis.data import is_causal, model_tokenizer
    from keras_mha.analysis.run import head_roles
    from keras_mha.pruning.discovery import find_attention_layers

    model = load_model(arguments)
    fit_text_batching_to_model(model, arguments)
    _require_attention(model, arguments)
    tokenizer = model_tokenizer(model, arguments.tokenizer, argument="--tokenizer")
    progress = None  # on stderr, when it is a terminal, whatever the format
    importance = None
    if arguments.importance is not None:
        importance = _importance(model, text, tokenizer, arguments, progress)
    result = head_roles(
        model,
        text,
        tokenizer=tokenizer,
        batch_size=arguments.batch_size,
        max_tokens=arguments.max_tokens,
        seq_len=arguments.seq_len,
        treebank=arguments.conllu,
        importance=importance,
        importance_method=arguments.importance,
        progress=progress,
        name=arguments.model,
    )
    if arguments.plot:
        _write_plot(result, arguments.plot)
    if arguments.html:
        from keras_mha.analysis.html import attention_examples, render_page
        from keras_mha.models.export_files import write_atomic_file

        causal = is_causal(find_attention_layers(model))
        examples = attention_examples(model, tokenizer, text, causal=causal)
        write_atomic_file(
            arguments.html, render_page(result, examples).encode("utf-8"), argument="--html"
        )
    if arguments.format == "json":
        output = json.dumps(result.to_dict(), indent=2, allow_nan=False)
    elif arguments.format == "markdown":
        output = result.markdown()
    else:
        output = result.table(report_width(wide=arguments.wide))
    write_stdout(output)
    return 0


def _write_plot(result, path):
    import io

    from keras_mha.analysis.plot import save_roles_plot
    from keras_mha.models.export_files import write_atomic_file

    buffer = io.BytesIO()
    save_roles_plot(result, buffer)
    write_atomic_file(path, buffer.getvalue(), argument="--plot")
