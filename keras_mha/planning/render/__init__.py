"""Renderers of a `Plan` (`keras_mha.planning.plan`): the `inspect` report as a table or
markdown, read from `Plan.to_dict()` (which is the JSON). They compute nothing.

- `report.py`: `render_table` / `render_markdown`.
- `memory_report.py`: the planner's section of the report (`--gpu` / `--memory`).
- `formatting.py`: counts, bytes, durations and rates as the reports print them.
- `text.py`: aligned columns and lines wrapped to the terminal's width.

Example:
    >>> from keras_mha.planning.render.formatting import format_bytes
    >>> format_bytes(1073741824)
    '1.00 GiB'
"""
