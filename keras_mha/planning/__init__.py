"""Planning: a Hub `config.json` read into a `ModelSpec`, its parameter and KV-cache
costs, the memory planner and the reports.

- `from_config(config)`: the config, validated once, as a `ModelSpec` (`spec.py`).
- `parameter_counts(spec)`, `kv_cache_cost(spec, seq_len, ...)`: the cost model (`costs.py`).
- `planner/`: weights, serving and training memory, the GPU table, what fits.
- `plan.py`: the one pipeline (config -> checkpoint size -> spec -> `Plan`), a typed
  result whose `to_dict()` is `inspect --format json`; `keras_mha.plan` is its entry.
- `render/`: a `Plan` as a table or markdown.

The config itself comes from `keras_mha.hub.load_config` (the Hub, a local path or a
bundled card). Nothing here imports keras, a backend or `huggingface_hub`.

Example:
    >>> from keras_mha.planning import from_config, kv_cache_cost
    >>> from keras_mha.hub import load_config
    >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
    >>> kv_cache_cost(spec, seq_len=8192).total_bytes
    1073741824
"""

from keras_mha.planning.costs import KVCacheCost, ParameterCounts, kv_cache_cost, parameter_counts
from keras_mha.planning.errors import (
    CardError,
    ConfigError,
    ConfigFileNotFoundError,
    GatedRepositoryError,
    HubUnreachableError,
    MalformedConfigError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from keras_mha.planning.spec import ModelSpec, from_config

__all__ = [
    "CardError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "GatedRepositoryError",
    "HubUnreachableError",
    "KVCacheCost",
    "MalformedConfigError",
    "ModelSpec",
    "ParameterCounts",
    "RepositoryNotFoundError",
    "RevisionNotFoundError",
    "from_config",
    "kv_cache_cost",
    "parameter_counts",
]
