"""Dataset statistics gathered while preprocessing (and by `data adopt` / `data info` from the samples):
documents, tokens and samples per split, a histogram of document lengths, and the unigram entropy of the
tokens: the loss, in nats, of a model that ignores context. A trained model's loss should fall well below
it; `diagnose` can read it from the manifest."""
import numpy as np

HIST_BINS = 24  # document lengths in tokens, bins [0,1), [1,2), [2,4), ... [2^22, inf)


def length_bin(lengths):
    """Bin index per length: 0 for 0 tokens, k for [2^(k-1), 2^k)."""
    lengths = np.asarray(lengths, np.int64)
    b = np.zeros(len(lengths), np.int64)
    pos = lengths > 0
    b[pos] = np.floor(np.log2(lengths[pos])).astype(np.int64) + 1
    return np.minimum(b, HIST_BINS - 1)


def bin_label(k):
    if k == 0:
        return "0"
    lo = 1 << (k - 1)
    return f">={lo:,}" if k == HIST_BINS - 1 else f"{lo:,}-{(lo << 1) - 1:,}"


def entropy_nats(counts):
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    if total <= 0:
        return None
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


class SplitStats:
    def __init__(self, vocab_size):
        self.documents = 0
        self.tokens = 0
        self.hist = np.zeros(HIST_BINS, np.int64)
        self.counts = np.zeros(vocab_size, np.int64)
        self.max_id = -1

    def add_tokens(self, tokens):
        if len(tokens):
            self.tokens += len(tokens)
            self.max_id = max(self.max_id, int(tokens.max()))
            self.counts += np.bincount(tokens, minlength=len(self.counts))[: len(self.counts)]

    def add_documents(self, lengths):
        self.documents += len(lengths)
        if len(lengths):
            self.hist += np.bincount(length_bin(lengths), minlength=HIST_BINS)

    def to_dict(self):
        return {"documents": int(self.documents), "tokens": int(self.tokens),
                "doc_length_histogram": {bin_label(k): int(c) for k, c in enumerate(self.hist) if c},
                "unigram_entropy_nats": entropy_nats(self.counts)}
