"""spark-submit entry point for the train stage.

Usage: spark-submit jobs/train.py --conf conf/digits.yaml [--set key=value ...] [--json-out PATH]

The same options as ``sparkdl train`` (see ``--help``).
"""

import sys

from sparkdl.cli import exit_quickly, main

if __name__ == "__main__":
    exit_quickly(main(sys.argv[1:], stage="train"))
