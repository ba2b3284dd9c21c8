"""Tokenizers: char-level (vocabulary from the corpus), byte-level (256 + end-of-document) and Hugging Face
`tokenizer.json` (needs the optional `tokenizers` package).

Each one serialises to a small dict (`spec()`) stored in the dataset manifest, so sampling and evaluation
rebuild exactly the tokenizer the data was made with (`from_spec`).
"""
import os

import numpy as np

from ms_llm.errors import UserError


class CharTokenizer:
    """One id per distinct character of the corpus, in sorted order; the end-of-document id comes last."""

    kind = "char"

    def __init__(self, chars):
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.eod_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1

    @classmethod
    def train(cls, texts):
        chars = set()
        for t in texts:
            chars.update(t)
        return cls(sorted(chars))

    def encode(self, text):
        try:
            return np.fromiter((self.index[c] for c in text), dtype=np.int32, count=len(text))
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in this char tokenizer's vocabulary (built from the "
                            f"training corpus). Use characters that occur in the corpus, or the byte tokenizer.") from None

    def decode(self, ids):
        return "".join(self.chars[i] if i < len(self.chars) else "\n" for i in map(int, ids))

    def spec(self):
        return {"kind": self.kind, "vocab": "".join(self.chars), "eod_id": self.eod_id}


class ByteTokenizer:
    """UTF-8 bytes 0..255, end-of-document = 256."""

    kind = "byte"
    eod_id = 256
    vocab_size = 257

    def encode(self, text):
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids):
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def spec(self):
        return {"kind": self.kind, "eod_id": self.eod_id}


class HFTokenizer:
    """A Hugging Face `tokenizer.json`; the end-of-document token is its eos/`<|endoftext|>`/`</s>` token."""

    kind = "hf"
    EOD_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")

    def __init__(self, path, json_text=None):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError(f"data.tokenizer = '{path}' needs the optional 'tokenizers' package. "
                            f"Install it with: pip install tokenizers") from None
        if json_text is None:
            if not os.path.isfile(path):
                raise UserError(f"data.tokenizer = '{path}': no such tokenizer.json file. Use char, byte, or the "
                                f"path of a Hugging Face tokenizer.json.")
            with open(path, encoding="utf-8") as f:
                json_text = f.read()
        self.path, self.json_text = path, json_text
        self.tok = Tokenizer.from_str(json_text)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        ids = [self.tok.token_to_id(n) for n in self.EOD_NAMES]
        ids = [i for i in ids if i is not None]
        if ids:
            self.eod_id = ids[0]
        else:  # no end-of-text token in the vocabulary: append one
            self.eod_id = self.vocab_size
            self.vocab_size += 1

    def encode(self, text):
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids if int(i) != self.eod_id])

    def spec(self):
        return {"kind": self.kind, "path": self.path, "eod_id": self.eod_id, "json": self.json_text}


def build_tokenizer(name, texts=None):
    """The tokenizer named by `data.tokenizer`; char needs the corpus `texts` to build its vocabulary."""
    if name == "char":
        return CharTokenizer.train(texts or [])
    if name == "byte":
        return ByteTokenizer()
    if name.endswith(".json") or os.path.isfile(name):
        return HFTokenizer(name)
    raise UserError(f"data.tokenizer = '{name}' is not a tokenizer: use 'char', 'byte', or the path of a "
                    f"Hugging Face tokenizer.json file.")


def from_spec(spec):
    kind = spec.get("kind")
    if kind == "char":
        return CharTokenizer(spec["vocab"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        return HFTokenizer(spec.get("path", "tokenizer.json"), json_text=spec["json"])
    raise UserError(f"dataset manifest names an unknown tokenizer kind {kind!r}. Re-run preprocessing.")
