"""Fine-tuning end to end on the bundled text, offline: the figures of docs/finetuning.md.

    python benchmarks/finetune_shakespeare.py --workdir /tmp/ft_demo [--steps 60]

1. A chat JSONL made from data/tinyshakespeare.txt: each conversation is a run of consecutive speeches of a play
   (at most 110 characters each; one or two exchanges), the odd ones as the user's turns, the even ones as the
   assistant's replies, under the template's system message ("Continue the scene."); an instruction JSONL of
   (speech, reply) pairs the same way.
2. A byte-level BPE tokenizer.json trained on the same text with ChatML's special tokens, and a
   tokenizer_config.json holding a ChatML chat template (`<|im_start|>role\\n...<|im_end|>\\n`, the layout Qwen2.5
   uses) with eos_token <|im_end|>.
3. A random Qwen2.5-shaped model from transformers (Qwen2ForCausalLM: q/k/v biases, tied head, 2 layers, hidden
   64), saved with save_pretrained and converted with `ms-llm convert --from-hf`.
4. `ms-llm preprocess --format chat`, then full fine-tuning and LoRA fine-tuning from the converted checkpoint,
   `ms-llm convert --merge-lora` and `--to-hf`; the script prints each command and its figures.

tests/test_finetune_train.py builds its fixtures with the same functions (`write_chat_jsonl`, `write_tokenizer`,
`write_random_qwen2`).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(ROOT, "data", "tinyshakespeare.txt")
SYSTEM = "Continue the scene."
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_CHARS = 300_000  # of the text, for the BPE merges (the whole 1.1 MB gives the same 512 tokens, slower)
# ChatML, the layout of Qwen2.5's template, without its tool-calling branches: a default system message, each
# message between <|im_start|>role\n and <|im_end|>\n, and the assistant header as the generation prompt.
CHATML = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n")
# The same with transformers' {% generation %} markers around the assistant's part.
CHATML_MARKED = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message['role'] == 'assistant' %}\n"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n")


def speeches(path=SHAKESPEARE):
    """[(speaker, text)] of the play text: blocks separated by blank lines, the first line 'NAME:'."""
    with open(path, encoding="utf-8") as f:
        blocks = f.read().split("\n\n")
    out = []
    for b in blocks:
        lines = b.strip().split("\n")
        if len(lines) >= 2 and re.fullmatch(r"[A-Z][A-Za-z ]*:", lines[0]):
            out.append((lines[0][:-1], " ".join(lines[1:])))
    return out


def conversations(n, turns=2, max_chars=240, seed=0, part=(0.0, 1.0)):
    """n chat records: `turns` exchanges of consecutive speeches each, from disjoint places in the fraction `part` of
    the text (no speech in two conversations: overlapping windows would put near-copies in both splits)."""
    rng = random.Random(seed)
    sp = [s for s in speeches() if len(s[1]) <= max_chars]
    sp = sp[int(part[0] * len(sp)):int(part[1] * len(sp))]
    starts = list(range(0, len(sp) - 2 * turns + 1, 2 * turns))
    rng.shuffle(starts)
    if n > len(starts):
        raise ValueError(f"{n} conversations of {turns} exchange(s) need more than the {len(sp)} speeches of the text")
    out = []
    for i in starts[:n]:
        msgs = []
        for k in range(2 * turns):
            who, text = sp[i + k]
            msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": f"{who}: {text}"})
        out.append({"messages": msgs})
    return out


def write_chat_jsonl(path, n=200, seed=1, max_chars=110):
    """n chat records: the first half one exchange (user, assistant), the second half two."""
    recs = (conversations(n // 2, 1, max_chars, seed, (0.0, 0.5))
            + conversations(n - n // 2, 2, max_chars, seed + 1, (0.5, 1.0)))
    with open(path, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec) + "\n")
    return path


def write_instruction_jsonl(path, n=200, seed=0):
    with open(path, "w", encoding="utf-8") as f:
        for rec in conversations(n, 1, seed=seed):
            f.write(json.dumps({"prompt": rec["messages"][0]["content"],
                                "response": rec["messages"][1]["content"]}) + "\n")
    return path


def write_tokenizer(folder, vocab_size=512, markers=False):
    """folder/tokenizer.json (byte-level BPE on the bundled text, ChatML special tokens) + tokenizer_config.json
    with the ChatML template (`markers`: the {% generation %} version)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(folder, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read(TOKENIZER_CHARS)
    tok.train_from_iterator([text[i:i + 10000] for i in range(0, len(text), 10000)], trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "bos_token": None, "model_max_length": 4096, "chat_template": CHATML_MARKED if markers else CHATML}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    return os.path.join(folder, "tokenizer.json")


def write_random_qwen2(folder, vocab_size=512, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seed=0):
    """A random Qwen2.5-shaped model saved by transformers (float32 safetensors + config.json)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      tie_word_embeddings=True, rope_theta=10000.0)
    model = Qwen2ForCausalLM(cfg).float()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/ms_llm_finetune_demo")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--conversations", type=int, default=600)
    args = ap.parse_args()
    w = args.workdir
    os.makedirs(w, exist_ok=True)
    ms_llm = [sys.executable, "-m", "ms_llm.cli"]
    tok = write_tokenizer(os.path.join(w, "tokenizer"))
    jsonl = write_chat_jsonl(os.path.join(w, "chat.jsonl"), args.conversations)
    write_random_qwen2(os.path.join(w, "hf_qwen2"))
    if not os.path.exists(os.path.join(w, "base", "config.yaml")):
        run(ms_llm + ["convert", "--from-hf", os.path.join(w, "hf_qwen2"), "--output", os.path.join(w, "base")])
    run(ms_llm + ["preprocess", "--format", "chat", "--input", jsonl, "--tokenizer", tok, "--seq-length", "256",
                  "--output-dir", os.path.join(w, "data"), "--overwrite"])
    run(ms_llm + ["data", "info", os.path.join(w, "data")])
    common = ["--config", os.path.join(w, "base", "config.yaml"), "--set", f"data.dataset_dir={w}/data",
              "--set", f"checkpoint.load_weights={w}/base/model.ckpt", "--set", "model.seq_length=256",
              "--set", f"train.max_steps={args.steps}", "--set", "train.global_batch_size=8",
              "--set", "train.micro_batch_size=8", "--set", "train.eval_interval=20", "--set", "train.eval_steps=4",
              "--set", "train.log_interval=10", "--set", "train.warmup_steps=5", "--set", "train.weight_decay=0.0",
              "--set", "monitor.report=false", "--set", "monitor.summary=false"]
    run(ms_llm + ["train"] + common + ["--set", "train.lr=3e-3", "--run-dir", os.path.join(w, "runs", "full")])
    run(ms_llm + ["train"] + common + ["--set", "train.lr=1e-2", "--set", "finetune.lora.rank=8",
                                       "--run-dir", os.path.join(w, "runs", "lora")])
    run(ms_llm + ["data", "info", os.path.join(w, "data"), "--show-sample", "0"])
    lora_ckpt = os.path.join(w, "runs", "lora", "checkpoints", "rank_0", f"step_{args.steps:08d}.ckpt")
    run(ms_llm + ["convert", "--merge-lora", lora_ckpt, "--output", os.path.join(w, "merged")])
    run(ms_llm + ["convert", "--to-hf", os.path.join(w, "merged", "model.ckpt"), "--output",
                  os.path.join(w, "merged_hf")])
    print(f"merged export parity: max |logits(transformers, merged) - logits(ms_llm, base + adapters)| = "
          f"{merged_parity(os.path.join(w, 'runs', 'lora'), lora_ckpt, os.path.join(w, 'merged_hf')):.2e}")


def merged_parity(run_dir, ckpt, hf_dir, length=64, seed=0):
    """The largest logit difference between transformers running the merged export and ms_llm running the base with
    the adapters of `ckpt`, on random ids."""
    import mindspore as ms
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from ms_llm.train.setup.run_model import load_run_model

    cfg, model, _ = load_run_model(run_dir, checkpoint=ckpt, overrides=[f"model.seq_length={length}"])
    ids = np.random.default_rng(seed).integers(0, cfg.model.vocab_size, (1, length)).astype(np.int32)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()[0]
    return float(np.abs(model(ms.Tensor(ids)).asnumpy()[0] - theirs).max())


if __name__ == "__main__":
    main()
