"""spark-submit entry point for the evaluate stage.

Usage: spark-submit jobs/evaluate.py --conf conf/digits.yaml [--set key=value ...]
"""

import sys

from sparkdl.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], stage="evaluate"))
