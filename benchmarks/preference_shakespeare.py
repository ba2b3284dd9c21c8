"""Preference optimisation end to end on the bundled text, offline: the demo of docs/preference.md.

    python benchmarks/preference_shakespeare.py --workdir /tmp/pref_demo [--steps 60] [--pairs 400]

1. Pairs made from data/tinyshakespeare.txt: a speech as the prompt, the reply that follows it in the play as
   `chosen`, the same reply with its words shuffled as `rejected` (benchmarks/finetune_shakespeare.py's speeches).
2. The ChatML tokenizer and the random Qwen2.5-shaped model of benchmarks/finetune_shakespeare.py, converted with
   `ms-llm convert --from-hf`.
3. `ms-llm preprocess --format preference`, then DPO (full fine-tuning) and SimPO with LoRA from the converted
   checkpoint, and `ms-llm diagnose` on each run; the script prints each command and the last metrics.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune_shakespeare as ft  # noqa: E402


def write_pairs(path, n, seed=7):
    """n pairs: the prompt a speech, chosen the reply the play gives it, rejected the same reply with its words in a
    random order (the same tokens, mostly: what separates the two is word order, which the model has to learn)."""
    rng = random.Random(seed)
    recs = ft.conversations(n, 1, 80, seed=seed)
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            words = r["messages"][1]["content"].split()
            shuffled = words[:]
            while shuffled == words and len(set(words)) > 1:
                rng.shuffle(shuffled)
            f.write(json.dumps({"prompt": r["messages"][0]["content"], "chosen": " ".join(words),
                                "rejected": " ".join(shuffled)}) + "\n")
    return path


def run(cmd, check=True):
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=check)


def last_metrics(run_dir):
    recs = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    train = [r for r in recs if "rewards/margins" in r]
    val = [r for r in recs if "val_rewards/margins" in r]
    keys = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected")
    for r in (train[0], train[-1]):
        print(f"step {r['step']}: " + ", ".join(f"{k} {r[k]:.4f}" for k in keys))
    if val:
        r = val[-1]
        print(f"val at step {r['step']}: " + ", ".join(f"{k} {r['val_' + k]:.4f}" for k in keys[1:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/ms_llm_preference_demo")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--pairs", type=int, default=400)
    args = ap.parse_args()
    w = args.workdir
    os.makedirs(w, exist_ok=True)
    ms_llm = [sys.executable, "-m", "ms_llm.cli"]
    tok = ft.write_tokenizer(os.path.join(w, "tokenizer"))
    pairs = write_pairs(os.path.join(w, "pairs.jsonl"), args.pairs)
    ft.write_random_qwen2(os.path.join(w, "hf_qwen2"))
    if not os.path.exists(os.path.join(w, "base", "config.yaml")):
        run(ms_llm + ["convert", "--from-hf", os.path.join(w, "hf_qwen2"), "--output", os.path.join(w, "base")])
    run(ms_llm + ["preprocess", "--format", "preference", "--input", pairs, "--tokenizer", tok, "--seq-length", "383",
                  "--output-dir", os.path.join(w, "data"), "--overwrite"])
    run(ms_llm + ["data", "info", os.path.join(w, "data")])
    common = ["--config", os.path.join(w, "base", "config.yaml"), "--set", f"data.dataset_dir={w}/data",
              "--set", f"checkpoint.load_weights={w}/base/model.ckpt", "--set", "model.seq_length=383",
              "--set", f"train.max_steps={args.steps}", "--set", "train.global_batch_size=8",
              "--set", "train.micro_batch_size=8", "--set", "train.eval_interval=20", "--set", "train.eval_steps=4",
              "--set", "train.log_interval=5", "--set", "train.warmup_steps=5", "--set", "train.weight_decay=0.0",
              "--set", "train.loss_chunk_tokens=0", "--set", "monitor.report=false", "--set", "monitor.summary=false"]
    runs = {"dpo": ["--set", "finetune.preference.loss=dpo", "--set", "finetune.preference.beta=0.1",
                    "--set", "train.lr=1e-3"],
            "simpo_lora": ["--set", "finetune.preference.loss=simpo", "--set", "finetune.preference.beta=2.0",
                           "--set", "finetune.preference.simpo_gamma=1.0", "--set", "finetune.lora.rank=8",
                           "--set", "train.lr=1e-2"]}
    for name, sets in runs.items():
        rd = os.path.join(w, "runs", name)
        if not os.path.exists(os.path.join(rd, "metrics.jsonl")):
            run(ms_llm + ["train"] + common + sets + ["--run-dir", rd])
        last_metrics(rd)
        run(ms_llm + ["diagnose", rd], check=False)


if __name__ == "__main__":
    main()
