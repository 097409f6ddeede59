"""Text read through a checkpoint's own tokenizer into token batches, for scoring heads
(`keras-mha prune --data`), their roles (`heads --text`, `head_roles`) and uptraining
(`convert --data`).

- `text.py`: reading a text file safely, the tokenizer, decoder windows and encoder
  sentences (numpy and `tokenizers`).
- here: the default amounts, which the command line's flags share without importing
  numpy (`DEFAULT_MAX_TOKENS`, `DEFAULT_SEQ_LEN`, `DEFAULT_BATCH_SIZE`).

Example:
    >>> from keras_mha.data.text import split_sentences
    >>> split_sentences("One. Two!")
    ['One.', 'Two!']
"""

#: How much text is read through a checkpoint by default (`prune --data`, `heads --text`,
#: `head_roles`): real tokens taken, tokens per sequence, sequences per batch.
DEFAULT_MAX_TOKENS = 16384
DEFAULT_SEQ_LEN = 128
DEFAULT_BATCH_SIZE = 8

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MAX_TOKENS", "DEFAULT_SEQ_LEN"]
