"""The planner: what a model needs to be served or trained, on which devices, how fast.
Pure Python.

- `inventory.py`: every weight tensor of a `ModelSpec`, grouped by shape, with its role
  and how tensor parallelism splits it.
- `quantization.py`: weights formats: plain dtypes, and the checkpoint's own
  (`quantization_config`: fp8, GPTQ, AWQ, bitsandbytes, compressed-tensors).
- `placement.py`: tensor- and pipeline-parallel placement of weights and KV cache.
- `serving.py`: serving memory of one device (`ServingModel`, `serving_memory`).
- `memory.py`: weights, training memory and the fit search (`plan_fit`).
- `speed.py`: decode and prefill upper bounds from bandwidth and peak FLOPS.
- `suggestions.py`: what would make serving fit when it does not.
- `gpus.py` and `devices.py`: the accelerator table, and `2xH100`-style device sets.
- `units.py`: lengths (`8k`), dtypes (`bf16`) and memory sizes (`80GB`) as typed.

Formulas and how they were checked: docs/concepts/memory-planner.md.

Example:
    >>> from keras_mha.planning.planner.devices import parse_devices
    >>> parse_devices(gpu="2xH100").name
    '2x H100 80GB SXM'
"""
