"""The memory planner: weights, serving and training memory of a `ModelSpec`, the GPU
table, and the largest context and batch that fit a memory size. Pure Python.

- `memory.py`: the byte counts and the fit search (`plan_fit`).
- `gpus.py`: known GPUs and their memory (`find_gpu("H100")`).
- `units.py`: lengths (`8k`), dtypes (`bf16`) and memory sizes (`80GB`) as typed on the
  command line.

Example:
    >>> from keras_mha.cards.planner.gpus import find_gpu
    >>> find_gpu("H100").name
    'H100 80GB SXM'
"""
