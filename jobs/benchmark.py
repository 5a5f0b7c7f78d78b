"""Benchmarks: python jobs/benchmark.py SUITE [--json PATH] [--quick].

Suites: encoding, collectives, training, reader. Each prints a table of figures measured
against a reference in the same run (alternating) and writes them as JSON.

python jobs/benchmark.py timeline [--out DIR] records a timeline of the scaling model and
draws one step; python jobs/benchmark.py timeline-png TRACE... OUT.png draws a step of
existing traces (see benchmarks/timeline.py).
"""

import os
import sys
from pathlib import Path

# benchmarks/ lives beside sparkdl/ in the source tree and is not installed: put the tree on
# this process's path and on its Spark workers' (PYTHONPATH)
SOURCE_TREE = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, SOURCE_TREE)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_TREE,
                                                         os.environ.get("PYTHONPATH")]))

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
