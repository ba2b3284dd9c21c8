"""Prefill once, then one token per step against the fixed-size KV cache of ms_llm.nn.kv_cache.

Shapes stay static: the batch is padded to its fixed size, a prompt to one of a few lengths (`length_buckets`),
and the cache is the model's context long, so a generation compiles one decode graph and one prefill graph per
bucket used. Past the context the window slides as it always did here: each new token is predicted from the last
`context` tokens at positions 0..context-1, which is a prefill of that window per token (a cache cannot shift
positions that are baked into its keys). Within the context the greedy tokens are those of a full forward of
the window at every step (tests/test_generate.py), at one forward of one token per step.
"""
import numpy as np

from ms_llm.nn.kv_cache import DecodeStep, KVCache, Prefill

SMALLEST_BUCKET = 16


def length_buckets(context, smallest=SMALLEST_BUCKET):
    """Padded prompt lengths: powers of two from `smallest` below the context, then the context itself."""
    out, n = [], smallest
    while n < context:
        out.append(n)
        n *= 2
    return out + [context]


def bucket(n, buckets):
    return next(b for b in buckets if b >= n)


def next_token(logits, temperature=0.0, top_k=None, rng=None):
    """The token after `logits` (V,): the argmax when temperature <= 0 (the first of equal maxima), else a draw from
    softmax(logits / temperature) over the top_k largest."""
    logits = np.asarray(logits, np.float64)
    if temperature <= 0:
        return int(np.argmax(logits))
    logits = logits / temperature
    if top_k and top_k < logits.size:
        cutoff = np.partition(logits, -top_k)[-top_k]
        logits[logits < cutoff] = -np.inf
    p = np.exp(logits - logits.max())
    return int(rng.choice(p.size, p=p / p.sum()))


class Generator:
    """Generation on a CausalLM (in eval mode) with `context` positions, `batch_size` rows per call. `fused_decode`:
    False decodes with the composition where the model has the fused CPU kernel (benchmarks compare the two)."""

    def __init__(self, model, context, batch_size=1, buckets=None, fused_decode=True):
        self.context, self.batch_size = context, batch_size
        self.buckets = buckets or length_buckets(context)
        self.cache = KVCache(model, batch_size, context)
        self.prefill = Prefill(model, self.cache)
        self.step = DecodeStep(model, self.cache, fused=fused_decode)
        # compiled only when greedy decoding runs
        self.greedy_step = DecodeStep(model, self.cache, greedy=True, fused=fused_decode)
        for cell in (self.prefill, self.step, self.greedy_step):
            cell.set_train(False)

    def generate(self, prompts, max_new_tokens, choose=None, stop=None):
        """New tokens for each prompt (lists of ids, none empty; at most `batch_size` of them).

        choose(row, logits (V,) float32) → the next token of row `row`; None: greedy, the argmax taken in the graph
        (only a token per row leaves it). stop(row, new tokens so far) → True when that row is finished (the token
        that finished it is kept). Rows run until all stop or `max_new_tokens`."""
        import mindspore as ms

        n = len(prompts)
        if not 0 < n <= self.batch_size or not all(len(p) for p in prompts):
            raise ValueError(f"generate takes 1..{self.batch_size} non-empty prompts, got {[len(p) for p in prompts]}")
        seqs = [list(map(int, p)) for p in prompts] + [[0]] * (self.batch_size - n)  # padding rows: never read
        new = [[] for _ in range(n)]
        done = [max_new_tokens <= 0] * n
        filled = False
        for _ in range(max_new_tokens):
            if not filled or max(len(s) for s in seqs) > self.context:
                picked = self.pick(self.window(seqs, ms).asnumpy(), n, choose)
                filled = True
            else:  # the last token of each row goes in at its position; the cache holds the ones before it
                token = ms.Tensor(np.array([[s[-1]] for s in seqs], np.int32))
                pos = ms.Tensor(np.array([len(s) - 1 for s in seqs], np.int32))
                picked = self.greedy_step(token, pos).asnumpy().tolist() if choose is None else \
                    self.pick(self.step(token, pos).asnumpy(), n, choose)
            for row in range(n):
                if done[row]:
                    continue
                t = int(picked[row])
                new[row].append(t)
                seqs[row].append(t)
                done[row] = stop is not None and stop(row, new[row])
            for row in range(n, self.batch_size):
                seqs[row].append(0)
            if all(done):
                break
        return new

    @staticmethod
    def pick(logits, n, choose):
        """The next token of each of the first n rows, from their logits on the host."""
        if choose is None:
            choose = lambda _, row_logits: next_token(row_logits)  # noqa: E731
        return [choose(row, logits[row]) for row in range(n)]

    def window(self, seqs, ms):
        """A prefill of each row's last `context` tokens into the cache: the logits at each row's last token."""
        rows = [s[-self.context:] for s in seqs]
        width = bucket(max(len(r) for r in rows), self.buckets)
        ids = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        last = np.array([len(r) - 1 for r in rows], np.int32)
        return self.prefill(ms.Tensor(ids), ms.Tensor(last))
