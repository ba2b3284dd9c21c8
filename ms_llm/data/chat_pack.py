"""Conversations → fixed-width fine-tuning samples: token ids, loss mask and segment ids.

A sample is `width` = seq_length + 1 tokens (the model reads the first seq_length, predicts the last
seq_length), like pretraining samples, but samples do not overlap and a conversation is never split across two:
  * packed (default): conversations are laid one after another, in input order, as long as the next fits; then the
    sample is padded and a new one begins. Segment ids number the conversations of a sample 1, 2, ...; padding is
    0. The model turns them into a block-diagonal causal mask and positions that restart at each conversation
    (ms_llm.nn.attention.DocumentMask), so packing changes no conversation's logits.
  * `pack=False` (`--no-pack`): one conversation per sample, padded.
Padding has loss mask 0. The fill rate (real tokens / sample tokens) says what the padding costs.

A conversation longer than a sample is cut to `width` tokens (counted), or refused (`refuse_long`, by the caller).
"""
import numpy as np

COLUMNS = ("input_ids", "loss_mask", "segment_ids")


class ConversationPacker:
    def __init__(self, width, pad_id, pack=True):
        self.width, self.pad_id, self.pack = width, pad_id, pack
        self.ids, self.mask, self.seg = [], [], []
        self.fill, self.docs = 0, 0
        self.samples = self.tokens = self.loss_tokens = self.conversations = 0

    def add(self, ids, mask):
        """Add one conversation (at most `width` tokens); returns the samples it completed, (n, 3, width) int32."""
        assert len(ids) <= self.width
        out = []
        if self.fill and (not self.pack or self.fill + len(ids) > self.width):
            out.append(self._flush())
        self.docs += 1
        self.ids.append(ids)
        self.mask.append(mask)
        self.seg.append(np.full(len(ids), self.docs, np.int32))
        self.fill += len(ids)
        self.conversations += 1
        self.tokens += len(ids)
        self.loss_tokens += int(mask.sum())
        return np.stack(out) if out else np.zeros((0, len(COLUMNS), self.width), np.int32)

    def close(self):
        return np.stack([self._flush()]) if self.fill else np.zeros((0, len(COLUMNS), self.width), np.int32)

    def _flush(self):
        pad = self.width - self.fill
        sample = np.stack([
            np.concatenate(self.ids + [np.full(pad, self.pad_id, np.int32)]),
            np.concatenate(self.mask + [np.zeros(pad, np.uint8)]).astype(np.int32),
            np.concatenate(self.seg + [np.zeros(pad, np.int32)]),
        ])
        self.ids, self.mask, self.seg, self.fill, self.docs = [], [], [], 0, 0
        self.samples += 1
        return sample

    def stats(self):
        """What `data info` shows of a split: conversations, samples, tokens, loss tokens, fill rate."""
        room = self.samples * self.width
        return {"conversations": self.conversations, "samples": self.samples, "tokens": self.tokens,
                "loss_tokens": self.loss_tokens, "fill_rate": round(self.tokens / room, 4) if room else None,
                "loss_fraction": round(self.loss_tokens / self.tokens, 4) if self.tokens else None}


def info_lines(manifest):
    """`ms-llm data info` lines for a fine-tuning dataset: packing, fill rate, the share of tokens in the loss."""
    ft = manifest.get("finetune")
    if not ft:
        return []
    tpl = manifest.get("chat_template") or {}
    packing = ("packed: several conversations per sample, kept apart by the model" if manifest.get("packed")
               else "one conversation per sample")
    lines = [f"{manifest.get('format', 'chat')} data, {packing}; chat template from {tpl.get('source')} (assistant "
             f"spans by {tpl.get('spans')})"]
    for name in ("train", "val"):
        s = ft.get(name) or {}
        if not s.get("samples"):
            continue
        lines.append(f"  {name:5}: {s['conversations']:,} conversations in {s['samples']:,} samples, fill rate "
                     f"{100 * s['fill_rate']:.1f}% (padding {100 * (1 - s['fill_rate']):.1f}%), {s['loss_tokens']:,} "
                     f"of {s['tokens']:,} tokens in the loss ({100 * s['loss_fraction']:.1f}%)")
    if ft.get("truncated"):
        lines.append(f"  {ft['truncated']:,} conversation(s) were longer than a sample and cut to it"
                     + (f"; {ft['dropped']:,} of them kept no response token and were dropped" if ft.get("dropped")
                        else ""))
    return lines


def sample_lines(dataset_dir, manifest, index, split="train"):
    """`ms-llm data info D --show-sample N`: sample N of a fine-tuning split as text, the tokens in the loss between
    ⟦ and ⟧, each conversation opened by ⟨k⟩ (its segment id), padding summarised."""
    import os

    from mindspore.mindrecord import FileReader

    from ms_llm.data.tokenizers import from_spec
    from ms_llm.errors import UserError

    n = manifest["splits"][split]["samples"]
    if not 0 <= index < n:
        raise UserError(f"--show-sample {index}: the {split} split of '{dataset_dir}' has samples 0 to {n - 1}.")
    if "loss_mask" not in (manifest.get("columns") or ()):
        raise UserError(f"--show-sample: '{dataset_dir}' is not a chat/instruction dataset (no loss mask to show).")
    shards = manifest["splits"][split]["shards"]
    for shard in shards:
        if index < shard["samples"]:
            break
        index -= shard["samples"]
    reader = FileReader(os.path.join(dataset_dir, shard["file"]))
    try:
        row = next(r for i, r in enumerate(reader.get_next()) if i == index)
    finally:
        reader.close()
    tok = from_spec(manifest["tokenizer"])
    decode = getattr(tok, "decode_all", tok.decode)
    ids, mask, seg = (np.asarray(row[c]) for c in COLUMNS)
    real = seg != 0
    parts, k = [], 0
    while k < len(ids) and real[k]:
        j = k
        while j < len(ids) and seg[j] == seg[k] and mask[j] == mask[k]:
            j += 1
        opening = f"⟨{seg[k]}⟩" if k == 0 or seg[k - 1] != seg[k] else ""
        text = decode(ids[k:j])
        parts.append(opening + (f"⟦{text}⟧" if mask[k] else text))
        k = j
    return [f"sample {index} of {split} ({shard['file']}): {int(seg.max())} conversation(s), {int(real.sum())} "
            f"tokens + {int((~real).sum())} padding; {int(mask.sum())} tokens in the loss, between ⟦ and ⟧; ⟨k⟩ opens "
            f"conversation k (attention and positions restart there)",
            "".join(parts),
            "loss mask: " + "".join(str(int(x)) for x in mask[real])]
