"""`keras-mha` subcommands, one module each, exposing `add_parser(subparsers)` and
`run(arguments) -> int`; `keras_mha.cli` only registers them.

Example:
    >>> from keras_mha.commands import compare
    >>> callable(compare.add_parser) and callable(compare.run)
    True
"""
