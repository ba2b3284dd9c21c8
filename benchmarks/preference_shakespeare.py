"""Preference optimisation end to end on the bundled text, offline: the demo of docs/preference.md.

    python benchmarks/preference_shakespeare.py --workdir /tmp/pref_demo [--steps 60] [--pairs 400]

1. The SFT model: the random Qwen2.5-shaped model and ChatML tokenizer of benchmarks/finetune_shakespeare.py,
   converted with `ms-llm convert --from-hf` and fine-tuned on its chat data (full fine-tuning, as that demo does).
2. Pairs made from data/tinyshakespeare.txt: a speech as the prompt, the reply that follows it in the play as
   `chosen`, the same reply with its words shuffled as `rejected`. Training pairs come from the first 80% of the
   speeches, held-out pairs from the last 20% (no speech in both).
3. `ms-llm preprocess --format preference`, then DPO (full fine-tuning) and SimPO with LoRA from the SFT model, and
   `ms-llm diagnose` on each run; the LoRA run is exported with `ms-llm convert --merge-lora`.
4. The held-out pairs as an lm-eval multiple-choice task (context: the rendered prompt; choices: the chosen and the
   rejected reply as the assistant's turn), evaluated with `ms-llm eval` on the random base, the SFT model and
   each exported model: `acc` is the share of pairs whose chosen reply gets the higher log-probability, `acc_norm`
   the same per byte.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune_shakespeare as ft  # noqa: E402


TRAIN_PART, HELD_OUT_PART = (0.0, 0.8), (0.8, 1.0)  # shares of the speeches: disjoint, so held out is unseen
TASK = "shakespeare_preference_heldout"


def pairs(n, seed, part):
    """n pairs: the prompt a speech, chosen the reply the play gives it, rejected the same reply with its words in a
    random order (the same tokens, mostly: what separates the two is word order, which the model has to learn)."""
    rng = random.Random(seed)
    out = []
    for r in ft.conversations(n, 1, 80, seed=seed, part=part):
        words = r["messages"][1]["content"].split()
        shuffled = words[:]
        while shuffled == words and len(set(words)) > 1:
            rng.shuffle(shuffled)
        out.append({"prompt": r["messages"][0]["content"], "chosen": " ".join(words), "rejected": " ".join(shuffled)})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def write_heldout_task(folder, rows, tokenizer):
    """An lm-eval task of the held-out pairs, rendered with the tokenizer's chat template as preprocessing renders
    them: the context is the prompt with the assistant's header, each choice the rest of the conversation."""
    from ms_llm.data.templates import ChatTemplate, find_template
    from ms_llm.eval.demo_task import multiple_choice_yaml

    template = ChatTemplate.from_spec(find_template(tokenizer))
    docs = []
    for r in rows:
        user = [{"role": "user", "content": r["prompt"]}]
        context = template.render(user, add_generation_prompt=True)
        choices = [template.render(user + [{"role": "assistant", "content": r[k]}])[len(context):]
                   for k in ("chosen", "rejected")]
        docs.append({"context": context, "choices": choices, "label": 0})
    os.makedirs(folder, exist_ok=True)
    data = write_jsonl(os.path.join(folder, TASK + ".jsonl"), docs)
    with open(os.path.join(folder, TASK + ".yaml"), "w", encoding="utf-8") as f:
        f.write(multiple_choice_yaml(TASK, data, "benchmarks/preference_shakespeare.py"))
    return folder


def heldout_preference(ms_llm, task_dir, out, model_args):
    """`ms-llm eval` on the held-out task for one model: {acc, acc_norm, the mean log-prob of the chosen replies,
    the mean margin log p(chosen) - log p(rejected)} (the last two from the per-pair answers, --log-samples)."""
    run(ms_llm + ["eval"] + model_args + ["--tasks", TASK, "--include-path", task_dir, "--output", out,
                                          "--log-samples"])
    with open(out, encoding="utf-8") as f:
        res = json.load(f)
    lls = [[c[0] for c in s["filtered_resps"]] for s in res["samples"][TASK]]
    return {"acc": res["results"][TASK]["acc,none"], "acc_norm": res["results"][TASK]["acc_norm,none"],
            "chosen": sum(c for c, _ in lls) / len(lls), "margin": sum(c - r for c, r in lls) / len(lls)}


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
    ap.add_argument("--heldout-pairs", type=int, default=200)
    args = ap.parse_args()
    w = args.workdir
    os.makedirs(w, exist_ok=True)
    ms_llm = [sys.executable, "-m", "ms_llm.cli"]
    tok = ft.write_tokenizer(os.path.join(w, "tokenizer"))
    ft.write_random_qwen2(os.path.join(w, "hf_qwen2"))
    if not os.path.exists(os.path.join(w, "base", "config.yaml")):
        run(ms_llm + ["convert", "--from-hf", os.path.join(w, "hf_qwen2"), "--output", os.path.join(w, "base")])
    config = ["--config", os.path.join(w, "base", "config.yaml"), "--set", "train.global_batch_size=8",
              "--set", "train.micro_batch_size=8", "--set", "train.eval_interval=20", "--set", "train.eval_steps=4",
              "--set", "train.warmup_steps=5", "--set", "train.weight_decay=0.0", "--set", "monitor.report=false",
              "--set", "monitor.summary=false"]

    # 1. the SFT model: finetune_shakespeare.py's full fine-tuning on its chat data
    sft = os.path.join(w, "runs", "sft")
    sft_ckpt = os.path.join(sft, "checkpoints", "rank_0", "step_00000060.ckpt")
    if not os.path.exists(sft_ckpt):
        chat = ft.write_chat_jsonl(os.path.join(w, "chat.jsonl"), 600)
        run(ms_llm + ["preprocess", "--format", "chat", "--input", chat, "--tokenizer", tok, "--seq-length", "256",
                      "--output-dir", os.path.join(w, "chat_data"), "--overwrite"])
        run(ms_llm + ["train"] + config + ["--set", f"data.dataset_dir={w}/chat_data", "--set", "model.seq_length=256",
                                           "--set", f"checkpoint.load_weights={w}/base/model.ckpt",
                                           "--set", "train.max_steps=60", "--set", "train.log_interval=10",
                                           "--set", "train.lr=3e-3", "--run-dir", sft])

    # 2. preference pairs, and the held-out ones as an lm-eval task
    train_pairs = write_jsonl(os.path.join(w, "pairs.jsonl"), pairs(args.pairs, 7, TRAIN_PART))
    task_dir = write_heldout_task(os.path.join(w, "tasks"), pairs(args.heldout_pairs, 8, HELD_OUT_PART), tok)
    run(ms_llm + ["preprocess", "--format", "preference", "--input", train_pairs, "--tokenizer", tok,
                  "--seq-length", "383", "--output-dir", os.path.join(w, "data"), "--overwrite"])
    run(ms_llm + ["data", "info", os.path.join(w, "data")])

    # 3. DPO and SimPO with LoRA from the SFT model
    common = config + ["--set", f"data.dataset_dir={w}/data", "--set", f"checkpoint.load_weights={sft_ckpt}",
                       "--set", "model.seq_length=383", "--set", f"train.max_steps={args.steps}",
                       "--set", "train.log_interval=5", "--set", "train.loss_chunk_tokens=0"]
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
    lora_ckpt = os.path.join(w, "runs", "simpo_lora", "checkpoints", "rank_0", f"step_{args.steps:08d}.ckpt")
    if not os.path.exists(os.path.join(w, "simpo_merged", "config.yaml")):
        run(ms_llm + ["convert", "--merge-lora", lora_ckpt, "--output", os.path.join(w, "simpo_merged")])

    # 4. held-out preference: the share of unseen pairs whose chosen reply each model finds more likely
    models = {"random base": ["--checkpoint", os.path.join(w, "base", "model.ckpt"), "--tokenizer", tok],
              "SFT model": ["--run-dir", sft],
              "DPO (exported run checkpoint)": ["--run-dir", os.path.join(w, "runs", "dpo")],
              "SimPO + LoRA (merged export)": ["--checkpoint", os.path.join(w, "simpo_merged", "model.ckpt"),
                                               "--tokenizer", tok]}
    scores = {name: heldout_preference(ms_llm, task_dir, os.path.join(w, "eval", name.split()[0] + ".json"), a)
              for name, a in models.items()}
    print(f"\nheld-out pairs ({args.heldout_pairs}): acc, the share whose chosen reply has the higher log-probability "
          f"(acc_norm: per byte); the mean log-prob of the chosen replies; the mean margin log p(chosen) - log p("
          f"rejected)")
    print("| model | acc | acc_norm | log p(chosen) | margin |\n|---|---|---|---|---|")
    for name, r in scores.items():
        print(f"| {name} | {r['acc']:.3f} | {r['acc_norm']:.3f} | {r['chosen']:.1f} | {r['margin']:.1f} |")

if __name__ == "__main__":
    main()
