"""The package's version, in a module of its own: the Hub clients send it in their
user agent, and importing it from `keras_mha` itself would close an import cycle
(`keras_mha` exports `plan`, which reads configs through `keras_mha.hub`).

Example:
    >>> from keras_mha.version import __version__
    >>> __version__.count(".")
    2
"""

__version__ = "0.3.0"
