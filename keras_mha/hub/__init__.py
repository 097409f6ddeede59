"""Hub access: a model's `config.json` and weight files from the Hugging Face Hub, the HF
cache, a local path or a bundled card, used by `keras_mha.planning` and `keras_mha.models`.

- `load_config(source, revision=None, token=None, ...)`: a `LoadedConfig` (`config.py`).
- `files.hub_file(repo_id, filename, ...)`: one file of a Hub repository, in the HF
  cache (weights, tokenizer; not imported here: `inspect` never needs it).
- `list_bundled()`, `bundled_config_path(model_id)`: the curated config snapshots
  shipped with keras-mha (`bundled.py`).

Every network call has a deadline and an offline path; the revision, token, endpoint and
file names are checked before any request (`inputs.py`), and nothing is written outside
the HF cache (`cache.py`, `fetch.py`). `huggingface_hub` is imported only when a Hub id
has to be resolved.

Example:
    >>> from keras_mha.hub import load_config
    >>> load_config("bundled:openai-community/gpt2").config["n_head"]
    12
"""

from keras_mha.hub.bundled import bundled_config_path, list_bundled
from keras_mha.hub.config import LoadedConfig, load_config, read_config_file

__all__ = [
    "LoadedConfig",
    "bundled_config_path",
    "list_bundled",
    "load_config",
    "read_config_file",
]
