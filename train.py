"""Training entry point for msrun / ModelArts: `msrun --worker_num=8 ... train.py --config configs/X.yaml`.

Takes the same arguments as `ms-llm train`.
"""
import sys

from ms_llm.cli import main

if __name__ == "__main__":
    sys.exit(main(["train"] + sys.argv[1:]))
