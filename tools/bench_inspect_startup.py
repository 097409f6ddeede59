"""Kept for old links: the inspect start-up benchmark is `keras-mha bench inspect`
(`keras_mha/benchmarks/startup.py`); `python tools/bench_inspect_startup.py ARGS` runs it."""

import sys

from keras_mha.benchmarks.startup import main

if __name__ == "__main__":
    sys.exit(main())
