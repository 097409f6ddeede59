"""The `inspect` report: built from a `ModelSpec` and rendered as a table, JSON or markdown.

- `report.py`: `build_report` (the JSON object) and `render_table` / `render_markdown`.
- `memory_report.py`: the planner's section of the report (`--gpu` / `--memory`).
- `formatting.py`: counts, bytes and lengths as the reports print them.

Example:
    >>> from keras_mha.cards.rendering.formatting import format_bytes
    >>> format_bytes(1073741824)
    '1.00 GiB'
"""
