"""`keras-mha` subcommands, one module each (`inspect`, `cards`, `compare`, `gpus`, `prune`,
`heads`, `bench`), exposing `add_parser(subparsers)` and `run`; `keras_mha.cli` only registers
them (`cli.COMMANDS`). `run(arguments) -> int` takes the parsed arguments, except
`bench.run(argv)`, whose arguments belong to the benchmark it runs. Shared pieces:
`options` (flags shared by the commands: the planner's, the Hub's, text batching),
`arguments` (one-line argparse errors), `output` (stdout and one-line errors), `terminal`
(the table's width and colour on a terminal).

Example:
    >>> from keras_mha.commands import compare
    >>> callable(compare.add_parser) and callable(compare.run)
    True
"""
