"""Benchmarks: python jobs/benchmark.py SUITE [--json PATH] [--quick].

Suites: encoding, collectives, training, reader. Each prints a table of figures measured
against a reference in the same run (alternating) and writes them as JSON.

python jobs/benchmark.py timeline [--out DIR] records a timeline of the scaling model and
draws one step; python jobs/benchmark.py timeline-png TRACE... OUT.png draws a step of
existing traces (see sparkdl/benchmarks/timeline.py).
"""

import sys

from sparkdl.benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
