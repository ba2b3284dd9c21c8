"""What the fine-tuning tests share: a ChatML tokenizer trained on the bundled text and chat / instruction JSONL made
from it (benchmarks/finetune_shakespeare.py builds them the same way for the documented demo), built once per
test process."""
import functools
import json
import os
import sys
import tempfile

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import finetune_shakespeare as demo  # noqa: E402

QUIET = dict(log=lambda *_: None)


@functools.lru_cache(maxsize=None)
def assets():
    """{"tok": tokenizer.json with the ChatML template, "tok_marked": the same with {% generation %} markers,
    "chat": 120 chat records (60 of one exchange, 60 of two), "instruction": 120 instruction records} in one folder."""
    d = tempfile.mkdtemp(prefix="ms_llm_finetune_")
    out = {"dir": d, "tok": demo.write_tokenizer(os.path.join(d, "tok")),
           "tok_marked": demo.write_tokenizer(os.path.join(d, "tok_marked"), markers=True)}
    out["chat"] = demo.write_chat_jsonl(os.path.join(d, "chat.jsonl"), 120, seed=1)
    out["instruction"] = demo.write_instruction_jsonl(os.path.join(d, "instruction.jsonl"), 120, seed=3)
    return out


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)
