"""Training entry point for msrun and ModelArts.

    msrun --worker_num=8 --local_worker_num=8 --master_port=8118 --join=True --log_dir=logs \
          train.py --config configs/llama2_7b_8p.yaml

Takes the same arguments as `ms-llm train`, plus ModelArts' --data_url / --train_url
(see ms_llm/train/setup/modelarts.py).
"""
import sys

from ms_llm.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if any(a.startswith(("--data_url", "--train_url")) for a in argv):
        from ms_llm.errors import UserError
        from ms_llm.train.setup.modelarts import translate

        try:
            argv = translate(argv)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    sys.exit(main(["train"] + argv))
