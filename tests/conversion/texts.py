"""Real text that ships with CPython, for the conversion tests."""


def shipped_text(characters):
    """The first `characters` of the Python Language Reference's topics (`pydoc_data`)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))[:characters]
