"""Development tools, run from a source checkout and not installed with the wheel.

- `python -m tools.render_bundled_cards [--check]`: regenerate (or check) the `card.md`
  beside every bundled card.

Example:
    python -m tools.render_bundled_cards --check
"""
