"""A griffe extension for the docs build: read a docstring's `Example:` as Google style's
`Examples:` section.

keras-mha's docstrings follow Keras's, whose example section is titled `Example:`; griffe
knows only `Examples:` and would render `>>>` lines as Markdown quotes instead of code.
mkdocs.yml loads this file under the Python handler's `extensions`.

Example:
    >>> EXAMPLE_TITLE.sub(r"\\1Examples:", "Args:\\n    x: y\\n\\nExample:\\n    >>> 1")
    'Args:\\n    x: y\\n\\nExamples:\\n    >>> 1'
"""

import re

import griffe

EXAMPLE_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Rename each docstring's `Example:` title to `Examples:` before griffe parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE_TITLE.sub(r"\1Examples:", obj.docstring.value)
