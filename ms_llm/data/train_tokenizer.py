"""`ms-llm tokenizer train`: a byte-level BPE `tokenizer.json` (the GPT-2 scheme) trained on your corpus with
the `tokenizers` library, for users without a published tokenizer.

Byte-level means every string is encodable (no unknown token) and the ByteLevel decoder gives the text back
exactly; `<|endoftext|>` is the end-of-document token. Documents are streamed from the same inputs as
`ms-llm preprocess` (files, folders, globs of .txt / .jsonl / .jsonl.gz), so memory holds the trainer's word
counts, not the corpus.
"""
import os
import sys

from ms_llm.data.tokenizers import HF_HINT
from ms_llm.errors import UserError

EOD = "<|endoftext|>"


def iter_documents(files, text_field, skip_bad=False):
    """Each document's text in order (a text file longer than a segment arrives in segments, which is all the
    same to BPE training: it counts words)."""
    from ms_llm.data.encode import Encoder
    from ms_llm.data.sources import Source

    enc = Encoder(None, text_field, 0.0, chars_only=True)
    for i, path in enumerate(files):
        for chunk in Source(path).chunks(i):
            bad = []
            texts, _ = enc.texts(chunk, bad)
            if bad and not skip_bad:
                line, offset, reason = bad[0]
                where = f"line {line}" if line else f"byte offset {offset:,}"
                raise UserError(f"data source '{path}' {where} {reason}. Fix it, or pass --skip-bad.")
            yield from texts


def train_tokenizer(inputs, vocab_size, output, text_field="text", min_frequency=2, overwrite=False, skip_bad=False,
                    log=print):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise UserError(f"`ms-llm tokenizer train` needs the optional 'tokenizers' package. Install it: "
                        f"{HF_HINT}") from None
    from ms_llm.data.sources import expand_inputs

    if vocab_size < 257:
        raise UserError(f"--vocab-size = {vocab_size} is too small: a byte-level BPE needs the 256 bytes plus "
                        f"{EOD}; use at least 257 (typical: 32000 to 128000).")
    if os.path.exists(output) and not overwrite:
        raise UserError(f"'{output}' already exists. Choose another --output, or pass --overwrite.")
    files = expand_inputs(inputs)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())  # its own bar; nothing in a log file
    total = sum(os.path.getsize(f) for f in files)
    log(f"training a byte-level BPE tokenizer (vocab {vocab_size:,}) on {len(files)} file(s), {total / 1e6:,.1f} MB")
    tok.train_from_iterator(iter_documents(files, text_field, skip_bad), trainer)
    out_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".tmp-{os.path.basename(output)}")
    tok.save(tmp)
    os.replace(tmp, output)
    log(f"wrote '{output}': {tok.get_vocab_size():,} tokens ({EOD} = {tok.token_to_id(EOD)})"
        + (f"; the corpus supported only {tok.get_vocab_size():,} of the {vocab_size:,} requested"
           if tok.get_vocab_size() < vocab_size else ""))
    return output
