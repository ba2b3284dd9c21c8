"""The tokenizer as lm-eval's Hugging Face model uses it, over ms_llm's tokenizers (ms_llm.data.tokenizers).

lm-eval's `hf` model encodes with the tokenizer's special tokens (a tokenizer.json's post-processor: Llama's <s>)
unless the text already starts with them, decodes without them, and scores an empty context after the BOS token
(else the end-of-text token). `EvalTokenizer` does the same, so a Hugging Face folder gets the ids it gets there;
a run's char or byte tokenizer has no special tokens and its end-of-document id serves for both.
"""
import json
import os

from ms_llm.errors import UserError


def read_tokenizer_config(folder):
    """tokenizer_config.json of a Hugging Face folder as a dict ({} when absent or unreadable)."""
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _token_text(value):
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


class EvalTokenizer:
    """encode / decode / end-of-text and prefix ids of one ms_llm tokenizer; `config`: the tokenizer_config.json
    of a Hugging Face folder (its bos_token and clean_up_tokenization_spaces), or {}."""

    def __init__(self, tokenizer, config=None, source=""):
        config = config or {}
        self.tokenizer, self.source = tokenizer, source
        self.kind = tokenizer.kind
        self.eot_id = int(tokenizer.eod_id)
        bos = _token_text(config.get("bos_token"))
        bos_id = tokenizer.token_id(bos) if bos and hasattr(tokenizer, "token_id") else None
        if self.kind == "sentencepiece" and bos:  # a Llama-2 folder's tokenizer.model
            piece = tokenizer.sp.piece_to_id(bos)
            bos_id = None if piece == tokenizer.sp.unk_id() else piece
        self.prefix_id = self.eot_id if bos_id is None else int(bos_id)
        # SentencePiece encodes no special tokens itself: transformers' Llama tokenizer adds <s> when its
        # tokenizer_config.json says add_bos_token (a tokenizer.json's post-processor does it on its own)
        self.add_bos = self.kind == "sentencepiece" and bos_id is not None and bool(config.get("add_bos_token"))
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.prefix_text = self.decode_all([self.prefix_id])

    def encode(self, text, add_special_tokens=None):
        """Token ids of `text`. add_special_tokens None: the tokenizer's own special tokens, unless the text starts
        with the prefix token's text (lm-eval's rule); True / False: as asked."""
        if add_special_tokens is None:
            add_special_tokens = not (self.prefix_text and text.startswith(self.prefix_text))
        try:
            if self.kind == "hf":
                return list(self.tokenizer.tok.encode(text, add_special_tokens=add_special_tokens).ids)
            ids = [int(i) for i in self.tokenizer.encode(text)]
            return [self.prefix_id] + ids if self.add_bos and add_special_tokens else ids
        except UserError as e:
            raise UserError(f"a task's text cannot be tokenized with the model's tokenizer ({self.source}): {e} "
                            f"lm-eval needs a tokenizer that encodes every task's text: evaluate a char-level run "
                            f"on tasks written in its corpus's characters (the bundled shakespeare_cloze), or pass "
                            f"--tokenizer with a byte-level or tokenizer.json tokenizer the model was trained "
                            f"with.") from None

    def decode(self, ids):
        """Text of `ids` without special tokens (lm-eval's tok_decode)."""
        ids = [int(i) for i in ids]
        if self.kind == "hf":
            text = self.tokenizer.tok.decode(ids, skip_special_tokens=True)
            return clean_up_tokenization(text) if self.clean_up_spaces else text
        return self.tokenizer.decode([i for i in ids if i != self.eot_id])

    def decode_all(self, ids):
        """Text of `ids` with special tokens (the end-of-text token as a stop string)."""
        if hasattr(self.tokenizer, "decode_all"):
            return self.tokenizer.decode_all(ids)
        return "" if all(int(i) == self.eot_id for i in ids) else self.tokenizer.decode(ids)


def clean_up_tokenization(text):
    """transformers' clean_up_tokenization: no space before punctuation and English contractions."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text
