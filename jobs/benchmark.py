"""Benchmarks: python jobs/benchmark.py SUITE [--json PATH] [--quick].

Suites: encoding, collectives, training, reader. Each prints a table of figures measured
against a reference in the same run (alternating) and writes them as JSON.
"""

import sys

from sparkdl.benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
