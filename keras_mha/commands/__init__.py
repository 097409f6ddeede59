"""Subcommands of the `keras-mha` command line, one module each (`add_parser`, `run`)."""
