"""`python -m benchmarks [layers|model|inspect] [ARGS...]`: the same as `keras-mha bench ...`
(one-line errors, the CLI's exit codes).

Example:
    python -m benchmarks layers --seq-len 2048 --format markdown
"""

import sys

from keras_mha.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
