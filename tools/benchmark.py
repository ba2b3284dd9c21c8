"""`python tools/benchmark.py --config C [--steps N] [--json]` = `ms-llm benchmark ...`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ms_llm.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["benchmark"] + sys.argv[1:]))
