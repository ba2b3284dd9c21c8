"""`python tools/preprocess_data.py --input F --output-dir D --seq-length T` = `ms-llm preprocess ...`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ms_llm.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["preprocess"] + sys.argv[1:]))
