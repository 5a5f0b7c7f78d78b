"""Benchmarks: python jobs/benchmark.py SUITE [--json PATH] [--quick].

Each suite (python jobs/benchmark.py --help lists them; docs/benchmarks.md says what each
measures) prints a table of figures measured against a reference in the same run
(alternating) and writes them as JSON.

python jobs/benchmark.py timeline [--out DIR] records a timeline of the scaling model and
draws one step; python jobs/benchmark.py timeline-png TRACE... OUT.png draws a step of
existing traces (see benchmarks/timeline.py).
"""

import sys
from pathlib import Path

# benchmarks/ lives beside sparkdl/ in the source tree and is not installed: this tree's
# sparkdl puts the tree on this process's path and on its Spark workers' (PYTHONPATH)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdl.cli import run_benchmark

if __name__ == "__main__":
    sys.exit(run_benchmark(sys.argv[1:]))
