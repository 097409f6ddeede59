"""Plain text -> token batches for scoring heads, with the checkpoint's own tokenizer.

The text is tokenised by the `tokenizer.json` that ships beside the checkpoint,
through the `tokenizers` library (no transformers needed), so the tokens are the
ones the model was trained on.

- Decoders (causal LMs) read the text as one stream, cut into windows of
  `seq_len` tokens: inputs are a window, targets the same window shifted by one
  token (next-token prediction). When the tokenizer puts a beginning-of-sequence
  token in front of a text (Llama, Gemma), each window starts with it, as the model
  saw its training sequences start.
- Encoders (BERT, sentence-transformers) read the text as sentences (split at
  blank lines, line ends and sentence punctuation), each encoded with the
  tokenizer's own special tokens (`[CLS] ... [SEP]`), truncated to `seq_len`, and
  padded to the longest one.

`max_tokens` caps the real (non-padding) tokens taken from the start of the text.

Example:
    >>> tokenizer = load_tokenizer("path/to/checkpoint")  # doctest: +SKIP
    >>> data = decoder_windows(tokenizer, read_text("notes.txt"), seq_len=128,
    ...                        max_tokens=4096)  # doctest: +SKIP
    >>> data.inputs.shape, data.targets.shape, data.num_tokens  # doctest: +SKIP
    ((32, 128), (32, 128), 4096)
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_mha.errors import CheckpointError, MissingDependencyError, PathError, UsageError

TOKENIZER_FILE_NAME = "tokenizer.json"
# Reading stops once this many characters per wanted token were read (tokens are
# rarely shorter than a character); bounds memory for a huge --data file.
_CHARACTERS_PER_TOKEN_READ = 16
_READ_CHUNK = 1 << 20  # characters
# What `--data` cannot be: reading a device or socket never ends (or ends in garbage).
_NOT_TEXT_FILES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# An encoder batch is cut to its longest sentence, rounded up to a multiple of this, so
# that padding columns no sentence of the batch needs are not computed, while compiled
# backends (JAX's jit, tf.function) still see only a few distinct batch shapes.
ENCODER_LENGTH_MULTIPLE = 8
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def load_tokenizer(
    directory,
    *,
    argument="SOURCE",
    reads="--data",
    extra="prune",
    instead="use --method magnitude to prune without data",
):
    """The `tokenizers.Tokenizer` of `directory/tokenizer.json`, with padding and truncation off.

    `reads` (the flag or argument whose text the tokenizer reads), `extra` (the keras-mha
    extra that installs `tokenizers` for it) and `instead` (what to do without a
    tokenizer.json) word the errors for the command that asks: `heads` reads `--text`.

    Raises:
        MissingDependencyError: `tokenizers` is not installed.
        CheckpointError: the directory has no readable `tokenizer.json`, or it is a link
            leading out of the directory.

    Example:
        >>> tokenizer = load_tokenizer("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> tokenizer.encode("Hello world").tokens  # doctest: +SKIP
        ['[CLS]', 'hello', 'world', '[SEP]']
    """
    try:
        import tokenizers
    except ImportError as error:
        raise MissingDependencyError(
            f"{reads} needs the `tokenizers` package to read the checkpoint's tokenizer.json: "
            f"pip install 'keras-mha[{extra}]'"
        ) from error
    from keras_mha.models.local_files import file_in_folder

    path = Path(directory) / TOKENIZER_FILE_NAME
    if file_in_folder(directory, TOKENIZER_FILE_NAME) is None:
        raise CheckpointError(
            f"{argument}: {str(directory)!r} has no {TOKENIZER_FILE_NAME}; {reads} is "
            f"tokenised with the checkpoint's own fast tokenizer ({instead})",
            path=str(path),
        )
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises its own Exception subclass
        raise CheckpointError(
            f"{path}: not a tokenizer.json the `tokenizers` library can read ({error})",
            path=str(path),
        ) from error
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def check_text_file(path, *, argument="--data") -> Path:
    """`path` when it can be read as text: a regular file or a pipe (`<(zcat notes.gz)`).

    Raises:
        PathError: missing, a directory, a device (`/dev/zero`), a socket, or a path that
            cannot be looked at (no permission, a name too long); one line naming `argument`.

    Example:
        >>> try:
        ...     check_text_file("/dev/zero")
        ... except OSError as error:
        ...     print(error)
        --data: '/dev/zero' is a character device; expected a plain text file
    """
    path = Path(path)
    shown = repr(str(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise PathError(
            f"{argument}: {shown} does not exist; expected a plain text file", path=str(path)
        ) from None
    except OSError as error:
        raise PathError(
            f"{argument}: cannot look at {shown} ({error.strerror or error})", path=str(path)
        ) from None
    kind = next((name for is_kind, name in _NOT_TEXT_FILES if is_kind(mode)), None)
    if kind is not None:
        raise PathError(
            f"{argument}: {shown} is {kind}; expected a plain text file", path=str(path)
        )
    return path


def read_text(path, *, max_characters=None, argument="--data"):
    """The text of a UTF-8 file (at most `max_characters` characters).

    Raises:
        PathError: missing, a directory or device, unreadable, or not UTF-8 text.

    Example:
        >>> read_text("README.md", max_characters=9)  # doctest: +SKIP
        '# keras-m'
    """
    path = check_text_file(path, argument=argument)
    try:
        with path.open(encoding="utf-8") as handle:
            return _read_at_most(handle, max_characters)
    except FileNotFoundError:
        raise PathError(f"{argument}: {str(path)!r} does not exist", path=str(path)) from None
    except UnicodeDecodeError as error:
        raise PathError(
            f"{argument}: {str(path)!r} is not UTF-8 text (byte {error.start}: {error.reason}); "
            "expected a plain text file",
            path=str(path),
        ) from None
    except OSError as error:
        raise PathError(
            f"{argument}: cannot read {str(path)!r} ({error.strerror or error})", path=str(path)
        ) from None


def _read_at_most(handle, limit):
    """Up to `limit` characters (None: all), a chunk at a time: a text file's `read(n)`
    reserves memory for `n` characters first, so a huge `--max-tokens` would fail."""
    parts, remaining = [], limit
    while remaining is None or remaining > 0:
        chunk = handle.read(_READ_CHUNK if remaining is None else min(remaining, _READ_CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        remaining = None if remaining is None else remaining - len(chunk)
    return "".join(parts)


def characters_to_read(max_tokens):
    """How much of a file to read for `max_tokens` tokens (None: all of it)."""
    return None if max_tokens is None else max_tokens * _CHARACTERS_PER_TOKEN_READ


def prefix_tokens(tokenizer):
    """Special tokens the tokenizer's post-processor puts before a text (e.g. `<s>`).

    Example:
        >>> prefix_tokens(llama_tokenizer)  # doctest: +SKIP
        [128000]
    """
    probe = "Hello world"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


@dataclass(frozen=True)
class DecoderData:
    """Next-token windows: `inputs` and `targets` `(windows, seq_len)` int32."""

    inputs: np.ndarray
    targets: np.ndarray
    num_tokens: int

    @property
    def num_examples(self):
        return len(self.inputs)

    def batches(self, batch_size):
        """`[(x, y, None)]` with `x = {"token_ids", "padding_mask"}`."""
        result = []
        for start in range(0, self.num_examples, batch_size):
            ids = self.inputs[start : start + batch_size]
            x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
            result.append((x, self.targets[start : start + batch_size], None))
        return result

    def batch_tokens(self, batch_size):
        """Real tokens in each of `batches(batch_size)`."""
        return [int(np.size(y)) for _, y, _ in self.batches(batch_size)]


@dataclass(frozen=True)
class EncoderData:
    """Sentences: `token_ids` and boolean `padding_mask`, `(sentences, length)`."""

    token_ids: np.ndarray
    padding_mask: np.ndarray
    num_tokens: int

    @property
    def num_examples(self):
        return len(self.token_ids)

    def inputs(self, start=0, stop=None):
        """Model inputs of sentences `start:stop`, without padding columns none of them uses.

        The batch keeps the columns up to its longest sentence, rounded up to a
        multiple of `ENCODER_LENGTH_MULTIPLE` (at most the data's padded length):
        the columns cut are padding in every row, masked out, so the real tokens'
        outputs do not change, and the model does less work (the model card's
        sentences are 15 tokens on average, padded to 66).

        Example:
            >>> data = EncoderData(np.ones((2, 20), "int32"), np.arange(20) < [[3], [5]], 8)
            >>> data.inputs(0, 2)["token_ids"].shape
            (2, 8)
        """
        mask = self.padding_mask[start:stop]
        longest = int(mask.sum(axis=1).max(initial=0))
        multiple = ENCODER_LENGTH_MULTIPLE
        length = min(max(-(-longest // multiple) * multiple, 1), self.padding_mask.shape[1])
        return {
            "token_ids": self.token_ids[start:stop, :length],
            "padding_mask": mask[:, :length],
        }

    def batch_bounds(self, batch_size):
        """`[(start, stop)]` of the scoring batches: `batch_size` sentences each, except
        that a last batch of one sentence joins the one before.

        The encoder score is an in-batch contrastive loss, which is exactly 0 for a
        batch of one sentence: such a sentence would be scored on for nothing.

        Example:
            >>> EncoderData(np.ones((5, 3), "int32"), np.ones((5, 3), bool), 15).batch_bounds(2)
            [(0, 2), (2, 5)]
        """
        starts = list(range(0, self.num_examples, batch_size))
        if len(starts) > 1 and self.num_examples - starts[-1] == 1:
            starts.pop()
        stops = [*starts[1:], self.num_examples]
        return list(zip(starts, stops, strict=True))

    def batch_tokens(self, batch_size):
        """Real tokens in each batch of `batch_bounds(batch_size)`."""
        return [
            int(self.padding_mask[start:stop].sum())
            for start, stop in self.batch_bounds(batch_size)
        ]


def _paragraphs(text):
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = paragraph.strip()
        if paragraph:
            yield paragraph


def decoder_windows(tokenizer, text, seq_len, max_tokens=None, *, argument="--data"):
    """Cut `text` into next-token windows of `seq_len` tokens.

    Raises:
        UsageError: the text holds fewer tokens than one window needs.

    Example:
        >>> data = decoder_windows(tokenizer, text, seq_len=64)  # doctest: +SKIP
        >>> bool((data.inputs[0, 1:] == data.targets[0, :-1]).all())  # doctest: +SKIP
        True
    """
    prefix = prefix_tokens(tokenizer)
    content_per_window = seq_len - len(prefix)
    if content_per_window < 1:
        raise UsageError(
            f"--seq-len {seq_len}: too short for the tokenizer's prefix tokens {prefix}",
            key="--seq-len",
            value=seq_len,
        )
    stream: list[int] = []
    for paragraph in _paragraphs(text):
        stream.extend(tokenizer.encode(paragraph + "\n\n", add_special_tokens=False).ids)
        if max_tokens is not None and len(stream) >= max_tokens:
            stream = stream[:max_tokens]
            break
    # Window i reads content[i*c : i*c + c] after the prefix and predicts one token
    # further, which the next window reads first: n windows need n*c + 1 tokens.
    count = (len(stream) - 1) // content_per_window
    if count < 1:
        raise UsageError(
            f"{argument}: {len(stream)} tokens is too short to score heads: one window of "
            f"--seq-len {seq_len} needs {content_per_window + 1}; give more text or a smaller "
            "--seq-len"
            + (f" or a larger --max-tokens (now {max_tokens})" if max_tokens is not None else ""),
            key=argument,
            value=len(stream),
        )
    inputs = np.empty((count, seq_len), dtype="int32")
    targets = np.empty((count, seq_len), dtype="int32")
    for index in range(count):
        start = index * content_per_window
        window = prefix + stream[start : start + content_per_window + 1]
        inputs[index] = window[:-1]
        targets[index] = window[1:]
    return DecoderData(inputs, targets, num_tokens=int(count * seq_len))


def split_sentences(text):
    """Sentences of `text`: split at blank lines, line ends and `.`/`!`/`?` + space.

    Example:
        >>> split_sentences("One. Two!\\nThree?\\n\\nFour")
        ['One.', 'Two!', 'Three?', 'Four']
    """
    sentences = []
    for paragraph in _paragraphs(text):
        for line in paragraph.splitlines():
            sentences.extend(s.strip() for s in _SENTENCE_END.split(line.strip()) if s.strip())
    return sentences


def encoder_sentences(
    tokenizer, text, seq_len, max_tokens=None, *, argument="--data", min_sentences=2
):
    """Tokenise the sentences of `text` for an encoder, padded to the longest.

    Raises:
        UsageError: fewer than `min_sentences` sentences (the encoder score compares
            sentences with each other, so it needs 2).

    Example:
        >>> data = encoder_sentences(tokenizer, "One. Two.", seq_len=16)  # doctest: +SKIP
        >>> data.token_ids.shape  # doctest: +SKIP
        (2, 4)
    """
    if seq_len < 3:
        raise UsageError(f"--seq-len {seq_len}: an encoder sentence needs at least 3 tokens")
    pad_id = _pad_id(tokenizer)
    rows: list[list[int]] = []
    total = 0
    for sentence in split_sentences(text):
        ids = tokenizer.encode(sentence, add_special_tokens=True).ids
        if len(ids) > seq_len:
            # Truncate the content, keep the closing special token ([SEP]).
            ids = ids[: seq_len - 1] + ids[-1:]
        if max_tokens is not None and total + len(ids) > max_tokens:
            break
        rows.append(ids)
        total += len(ids)
    if len(rows) < min_sentences:
        raise UsageError(
            f"{argument}: {len(rows)} sentence(s) within --max-tokens is too little to score "
            f"an encoder's heads; expected at least {min_sentences} sentences of text",
            value=len(rows),
        )
    length = max(len(ids) for ids in rows)
    token_ids = np.full((len(rows), length), pad_id, dtype="int32")
    padding_mask = np.zeros((len(rows), length), dtype=bool)
    for index, ids in enumerate(rows):
        token_ids[index, : len(ids)] = ids
        padding_mask[index, : len(ids)] = True
    return EncoderData(token_ids, padding_mask, num_tokens=total)


def _pad_id(tokenizer):
    for token in ("[PAD]", "<pad>", "<|pad|>", "<|endoftext|>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return 0  # Masked out; any valid id does.


def examples_of_text(tokenizer, text, *, kind, seq_len, max_tokens=None, argument="--data"):
    """`text` as model examples: next-token windows for decoders (`decoder_windows`),
    sentences for encoders (`encoder_sentences`), at most `max_tokens` tokens.

    Example:
        >>> data = examples_of_text(tokenizer, "Some text.", kind="decoder", seq_len=128)
        ... # doctest: +SKIP
    """
    if kind == "decoder":
        return decoder_windows(tokenizer, text, seq_len, max_tokens, argument=argument)
    return encoder_sentences(tokenizer, text, seq_len, max_tokens, argument=argument)


def load_examples(directory, path, *, kind, seq_len, max_tokens=None):
    """The text of `path`, tokenised by `directory`'s tokenizer, as model examples
    (`examples_of_text`).

    Example:
        >>> data = load_examples("path/to/llama", "notes.txt", kind="decoder", seq_len=128)
        ... # doctest: +SKIP
    """
    tokenizer = load_tokenizer(directory)
    text = read_text(path, max_characters=characters_to_read(max_tokens))
    return examples_of_text(tokenizer, text, kind=kind, seq_len=seq_len, max_tokens=max_tokens)
