"""Tokenizers: char-level (vocabulary from the corpus), byte-level (256 + end-of-document), Hugging Face
`tokenizer.json` (optional `tokenizers` package) and SentencePiece `tokenizer.model` (optional
`sentencepiece` package, the format Llama-2 and MindFormers ship).

Each one serialises to a small dict (`spec()`) stored in the dataset manifest, so sampling, evaluation and
preprocessing workers rebuild exactly the tokenizer the data was made with (`from_spec`). `encode_batch`
is the hot path of preprocessing: one call per chunk of documents.
"""
import base64
import json
import os

import numpy as np

from ms_llm.errors import UserError
from ms_llm.fileio import read_user_text, refuse_if_larger

# The largest tokenizers models ship are tens of MiB (a 256k vocabulary with its merges); a file larger than this
# is not a tokenizer, and parsing it would cost memory in proportion.
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024

HF_HINT = "pip install tokenizers   (or: pip install -e \".[hf]\")"
SP_HINT = "pip install sentencepiece   (or: pip install -e \".[sentencepiece]\")"


class CharTokenizer:
    """One id per distinct character of the corpus, in sorted order; the end-of-document id comes last."""

    kind = "char"

    def __init__(self, chars):
        self.chars = list(chars)
        self.eod_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1
        # sorted code points → ids by binary search: vectorised, ~50x faster than a dict lookup per character
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        self._sorted = np.all(self._codes[1:] > self._codes[:-1]) if len(self.chars) > 1 else True
        self._order = None if self._sorted else np.argsort(self._codes, kind="stable")

    @classmethod
    def train(cls, texts):
        chars = set()
        for t in texts:
            chars.update(t)
        return cls(sorted(chars))

    def encode(self, text):
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        table = self._codes if self._sorted else self._codes[self._order]
        pos = np.searchsorted(table, codes)
        pos_c = np.minimum(pos, max(len(table) - 1, 0))
        bad = (pos >= len(table)) | (table[pos_c] != codes) if len(table) else np.ones(len(codes), bool)
        if bad.any():
            c = chr(int(codes[np.argmax(bad)]))
            raise UserError(f"character {c!r} is not in this char tokenizer's vocabulary (built from the training "
                            f"corpus). Use characters that occur in the corpus, or the byte tokenizer.")
        ids = pos_c if self._sorted else self._order[pos_c]
        return ids.astype(np.int32)

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def encode_with_offsets(self, text):
        """(ids, [(start, end)] character offsets of each token): what chat masks are made from."""
        return self.encode(text), [(i, i + 1) for i in range(len(text))]

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

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def encode_with_offsets(self, text):
        """(ids, character offsets): every byte of a character gets that character's (start, end)."""
        offsets = [(i, i + 1) for i, c in enumerate(text) for _ in c.encode("utf-8", "surrogatepass")]
        return self.encode(text), offsets

    def decode(self, ids):
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def spec(self):
        return {"kind": self.kind, "eod_id": self.eod_id}


class HFTokenizer:
    """A Hugging Face `tokenizer.json`. The end-of-document token is the tokenizer's own: the `eos_token` of a
    `tokenizer_config.json` next to it, else a special token named like an end of text; one is appended to the
    vocabulary only when it has none."""

    kind = "hf"
    EOD_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")

    def __init__(self, path, json_text=None, eod_token=None):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError(f"data.tokenizer = '{path}' needs the optional 'tokenizers' package. Install it: "
                            f"{HF_HINT}") from None
        if json_text is None:
            if not os.path.isfile(path):
                raise UserError(f"data.tokenizer = '{path}': no such tokenizer.json file. Use char, byte, the path "
                                f"of a Hugging Face tokenizer.json, or of a SentencePiece tokenizer.model.")
            json_text = read_user_text(path, "tokenizer", limit=MAX_TOKENIZER_BYTES)
            eod_token = eod_token or eos_from_config(os.path.join(os.path.dirname(path), "tokenizer_config.json"))
        try:
            self.tok = Tokenizer.from_str(json_text)
        except Exception as e:  # the Rust parser's message names the offending JSON position
            raise UserError(f"'{path}' is not a Hugging Face tokenizer.json ({e}). Point data.tokenizer / --tokenizer "
                            f"at the tokenizer.json a model ships with.") from None
        self.path, self.json_text = path, json_text
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.eod_token, self.eod_id = self._find_eod(json_text, eod_token)
        if self.eod_id is None:  # no end-of-text token anywhere: append one
            self.eod_id = self.vocab_size
            self.vocab_size += 1
        self._batch = getattr(self.tok, "encode_batch_fast", None) or self.tok.encode_batch

    def _find_eod(self, json_text, eod_token):
        candidates = ([eod_token] if eod_token else []) + list(self.EOD_NAMES)
        try:
            added = [t for t in json.loads(json_text).get("added_tokens", []) if t.get("special")]
        except ValueError:
            added = []
        candidates += [t["content"] for t in added if any(w in t["content"].lower() for w in ("eos", "end"))]
        for name in candidates:
            i = self.tok.token_to_id(name)
            if i is not None:
                return name, i
        return None, None

    def encode(self, text):
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts):
        return [np.asarray(e.ids, dtype=np.int32) for e in self._batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, text):
        """(ids, [(start, end)] character offsets of each token), as transformers' fast tokenizers report them."""
        e = self.tok.encode(text, add_special_tokens=False)
        return np.asarray(e.ids, dtype=np.int32), list(e.offsets)

    def token_id(self, token):
        """The id of a token of the vocabulary (a special token of a chat template), or None."""
        return self.tok.token_to_id(token)

    def decode_all(self, ids):
        """Every token's text, special tokens included (a chat template's <|im_end|> is the end-of-document id)."""
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids if int(i) != self.eod_id])

    def round_trip_problem(self, text):
        """Why decoding does not give `text` back when the tokenizer.json has no decoder, else None.

        Training only needs the ids, so this is a warning: but samples generated from the model will be
        decoded with this tokenizer, and without a decoder a byte-level BPE prints 'Ġto Ġbe' for 'to be'."""
        if self.tok.decoder is not None or not text:
            return None
        probe = text[:200]
        back = self.decode(self.encode(probe))
        if back == probe:
            return None
        return (f"'{self.path}' has no decoder, so decoding does not give the text back ({probe[:30]!r} decodes "
                f"to {back[:30]!r}). Training is unaffected, but text generated by the trained model will read "
                f"wrong: add the decoder that matches its pre-tokenizer (for byte-level BPE, \"decoder\": "
                f"{{\"type\": \"ByteLevel\"}}; `ms-llm tokenizer train` writes one).")

    def spec(self):
        return {"kind": self.kind, "path": self.path, "eod_id": self.eod_id, "eod_token": self.eod_token,
                "json": self.json_text}


class SentencePieceTokenizer:
    """A SentencePiece `tokenizer.model`; the end-of-document token is its own `</s>` (eos) when it has one."""

    kind = "sentencepiece"

    def __init__(self, path, model_bytes=None):
        try:
            import sentencepiece as spm
        except ImportError:
            raise UserError(f"data.tokenizer = '{path}' (a SentencePiece model) needs the optional 'sentencepiece' "
                            f"package. Install it: {SP_HINT}") from None
        if model_bytes is None:
            if not os.path.isfile(path):
                raise UserError(f"data.tokenizer = '{path}': no such SentencePiece model file.")
            refuse_if_larger(path, MAX_TOKENIZER_BYTES, "tokenizer")
            with open(path, "rb") as f:
                model_bytes = f.read()
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(model_bytes)
        except Exception as e:
            raise UserError(f"'{path}' is not a SentencePiece model ({e}). Point --tokenizer at the tokenizer.model "
                            f"file a Llama / MindFormers checkpoint ships with.") from None
        self.path, self.model_bytes = path, model_bytes
        self.vocab_size = self.sp.get_piece_size()
        eos = self.sp.eos_id()
        if 0 <= eos < self.vocab_size:
            self.eod_id = eos
        else:
            self.eod_id = self.vocab_size
            self.vocab_size += 1

    def encode(self, text):
        return np.asarray(self.sp.encode(text), dtype=np.int32)

    def encode_batch(self, texts):
        # one thread: preprocessing's worker processes are the parallelism (and the ids do not depend on it)
        return [np.asarray(ids, dtype=np.int32) for ids in self.sp.encode(list(texts), num_threads=1)]

    def decode(self, ids):
        return self.sp.decode([int(i) for i in ids if int(i) != self.eod_id and int(i) < self.sp.get_piece_size()])

    def spec(self):
        return {"kind": self.kind, "path": self.path, "eod_id": self.eod_id,
                "model": base64.b64encode(self.model_bytes).decode("ascii")}


def eos_from_config(path):
    """The `eos_token` of a Hugging Face tokenizer_config.json (a string or {"content": ...}), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def is_sentencepiece(path):
    """A SentencePiece model is a protobuf: its name ends in .model, or it is not JSON text."""
    if path.endswith(".model"):
        return True
    if path.endswith(".json"):
        return False
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    return not head.startswith(b"{")


def build_tokenizer(name, texts=None):
    """The tokenizer named by `data.tokenizer`; char needs the corpus `texts` to build its vocabulary."""
    if name == "char":
        return CharTokenizer.train(texts or [])
    if name == "byte":
        return ByteTokenizer()
    if name.endswith((".json", ".model")) or os.path.isfile(name):
        if os.path.isfile(name) and is_sentencepiece(name):
            return SentencePieceTokenizer(name)
        return HFTokenizer(name)
    raise UserError(f"data.tokenizer = '{name}' is not a tokenizer: use 'char', 'byte', the path of a Hugging Face "
                    f"tokenizer.json file, or of a SentencePiece tokenizer.model file.")


def from_spec(spec):
    kind = spec.get("kind")
    if kind == "char":
        return CharTokenizer(spec["vocab"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        return HFTokenizer(spec.get("path", "tokenizer.json"), json_text=spec["json"], eod_token=spec.get("eod_token"))
    if kind == "sentencepiece":
        return SentencePieceTokenizer(spec.get("path", "tokenizer.model"), base64.b64decode(spec["model"]))
    raise UserError(f"dataset manifest names an unknown tokenizer kind {kind!r}. Re-run preprocessing.")


def same_tokenizer(a, b):
    """Two manifest tokenizer specs describe the same tokenizer: same kind, vocabulary/model and end-of-document
    id (where the file lived, and keys added to the spec by later versions, do not matter)."""
    content = {"char": "vocab", "hf": "json", "sentencepiece": "model"}.get(a.get("kind"))
    return (a.get("kind") == b.get("kind") and a.get("eod_id") == b.get("eod_id")
            and (content is None or a.get(content) == b.get(content)))
