"""Preference pairs → fixed-width samples, one pair per sample (`ms-llm preprocess --format preference`).

A pair is one prompt and two responses. Its sample holds the prompt + chosen sequence, then the prompt + rejected
sequence, in the three columns of chat data (ms_llm/data/chat_pack.py):

    input_ids    [prompt chosen-response | prompt rejected-response | padding]
    loss_mask    [0 ...   1 ...          | 0 ...   1 ...            | 0 ...  ]   (the responses only)
    segment_ids  [1 ...                  | 2 ...                    | 0 ...  ]   (1 chosen, 2 rejected)

The model reads the segments as two documents (block-diagonal attention, positions restarting at the rejected
sequence: ms_llm.nn.attention.DocumentMask), so each sequence's logits are those it has alone, and a batch of
samples is a batch of whole pairs whatever the shuffling, accumulation or number of ranks: a pair can never be split.
The cost: the prompt is stored and computed twice, and a pair must fit in one sample (seq_length + 1 tokens for both
sequences); a longer pair is refused with its line, or skipped and counted with --skip-bad.
"""
import numpy as np

from ms_llm.data.chat_pack import COLUMNS

CHOSEN, REJECTED = 1, 2  # segment ids


class PairPacker:
    def __init__(self, width, pad_id):
        self.width, self.pad_id = width, pad_id
        self.pairs = self.tokens = self.chosen_tokens = self.rejected_tokens = 0
        self.longest = 0
        self.lengths = []  # (chosen sequence, rejected sequence) tokens of each pair, for the manifest's summary

    def add(self, ids, mask, first):
        """One pair (its two sequences concatenated, the chosen one `first` tokens) → its sample, (1, 3, width)."""
        n = len(ids)
        assert n <= self.width
        pad = self.width - n
        seg = np.concatenate([np.full(first, CHOSEN, np.int32), np.full(n - first, REJECTED, np.int32),
                              np.zeros(pad, np.int32)])
        sample = np.stack([np.concatenate([ids, np.full(pad, self.pad_id, np.int32)]).astype(np.int32),
                           np.concatenate([mask, np.zeros(pad, np.uint8)]).astype(np.int32), seg])
        self.pairs += 1
        self.tokens += n
        self.chosen_tokens += int(mask[:first].sum())
        self.rejected_tokens += int(mask[first:].sum())
        self.longest = max(self.longest, n)
        self.lengths.append((first, n - first))
        return sample[None]

    def close(self):
        return np.zeros((0, len(COLUMNS), self.width), np.int32)

    @property
    def samples(self):
        return self.pairs

    @property
    def conversations(self):  # what the chat pipeline's checks count
        return self.pairs

    def stats(self):
        room = self.pairs * self.width
        lengths = np.asarray(self.lengths, np.float64).reshape(-1, 2)
        return {"pairs": self.pairs, "samples": self.pairs, "tokens": self.tokens,
                "chosen_response_tokens": self.chosen_tokens, "rejected_response_tokens": self.rejected_tokens,
                "mean_chosen_length": round(float(lengths[:, 0].mean()), 2) if self.pairs else None,
                "mean_rejected_length": round(float(lengths[:, 1].mean()), 2) if self.pairs else None,
                "longest_pair": self.longest,
                "fill_rate": round(self.tokens / room, 4) if room else None}


def is_preference(manifest):
    return (manifest or {}).get("format") == "preference"


def info_lines(manifest):
    """`ms-llm data info` lines for a preference dataset."""
    p = manifest.get("preference") or {}
    lines = [f"preference pairs, one per sample (chosen = segment 1, rejected = segment 2); chat template from "
             f"{(manifest.get('chat_template') or {}).get('source')}"]
    for name in ("train", "val"):
        s = p.get(name) or {}
        if not s.get("pairs"):
            continue
        lines.append(f"  {name:5}: {s['pairs']:,} pairs, fill rate {100 * s['fill_rate']:.1f}%, responses "
                     f"{s['chosen_response_tokens']:,} chosen / {s['rejected_response_tokens']:,} rejected tokens, "
                     f"mean sequence {s['mean_chosen_length']:.0f} / {s['mean_rejected_length']:.0f} tokens, "
                     f"longest pair {s['longest_pair']}")
    if p.get("too_long"):
        lines.append(f"  {p['too_long']:,} pair(s) longer than a sample were skipped (--skip-bad)")
    return lines
