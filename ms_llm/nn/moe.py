"""Mixture of experts: a router picks `top_k` of `num_experts` SwiGLU MLPs for each token (Mixtral, Qwen3-MoE), with
an optional shared expert every token also goes through (Qwen2-MoE, DeepSeek).

Routing (float32 throughout, whatever the compute dtype):

    logits = x · W_router^T                     (N tokens, E experts)
    p = softmax(logits);  w, e = top_k(p)       (N, k): the k largest probabilities and their experts
    w = w / Σ_k w                               when normalize_top_k (Mixtral; Qwen3-MoE's norm_topk_prob)
    y = Σ_k w_k · expert_{e_k}(x)  (+ shared expert)

Losses, added to the LM loss by the training step and logged per layer:

    load balance (Switch/GShard)  E · Σ_e f_e · P_e,  f_e = share of the N·k assignments routed to e, P_e = mean p_e.
                                  1.0 when balanced, E when every token goes to one expert. (Hugging Face's
                                  Mixtral/Qwen3-MoE loss is top_k times this: their f sums to k.)
    z-loss (ST-MoE)               mean over tokens of logsumexp(logits)²: keeps router logits small

Dispatch, and why it looks like this. Graph mode compiles static shapes, so "the tokens of expert e" (a different
number every step) cannot be a tensor of its own. Every assignment (token, choice) instead gets a *slot* in one
fixed-size buffer, computed with integer arithmetic only:

    assignments in choice-major order: all first choices, then all second choices (first choices win under capacity)
    rank  = how many earlier assignments went to the same expert (cumsum of a one-hot (N·k, E) matrix)
    slot  = start of that expert's rows + rank

The buffer is cut into equal blocks of rows, each block belongs to one expert, and one batched matmul computes every
block with its expert's weights. Tokens are gathered into their slots (scatter of token ids, then a gather of
rows), and each token gathers its k results back by slot and sums them weighted by w. Empty rows compute on
token 0 and are never read back, so they cost time but no correctness, and no gradient flows through them.

- dropless (capacity_factor null, the default): blocks of B = ceil(N·k / E) rows (rounded up to 8); expert e gets
  ceil(count_e / B) consecutive blocks, so the buffer needs at most ceil(N·k / B) + E blocks, a static bound
  (≈ 2·N·k rows) that holds for any routing: nothing is ever dropped. Each block gathers its expert's weights
  (MegaBlocks' padded-block layout, done with a gather instead of a block-sparse kernel): compute and memory scale
  with k, not with E.
- capacity (capacity_factor c): one block of C = ceil(c·N·k / E) rows per expert (GShard); an assignment whose
  rank is C or more is dropped (its token keeps only the residual for that choice) and counted.
- dense (dispatch: dense): every expert computes every token and the outputs are summed with the gate matrix;
  E/k times the expert FLOPs. The reference the sorted dispatch is tested against, and the benchmark's baseline.

On Ascend the same slots feed what the fused kernels do in one step (MoeInitRouting / MoeTokenPermute to sort,
GroupedMatmul over variable-sized groups, MoeFinalizeRouting / MoeTokenUnpermute to combine; with expert
parallelism, MoeDistributeDispatch / Combine or AllToAll between them); none of them runs on CPU (GroupedMatmul
is refused there by MindSpore 2.10), so this portable composition is what ms_llm runs everywhere today.
"""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.init import normal, zeros
from ms_llm.nn.layers import Linear
from ms_llm.nn.layers import SiluGate, SwiGLU

# Columns of the per-layer router statistics: expert token counts (E of them), then these. Each forward adds one row
# per layer: its load-balancing loss, z-loss, dropped (token, expert) assignments, assignments (tokens x top_k), 1.
STAT_NAMES = ("lb_loss", "z_loss", "dropped", "assignments", "calls")
BLOCK_ALIGN = 8


def ceil_div(a, b):
    return (a + b - 1) // b


def dropless_block(assignments, num_experts):
    """Rows per block of the dropless buffer: N·k / E rounded up to a multiple of 8."""
    rows = ceil_div(assignments, num_experts)
    return ceil_div(rows, BLOCK_ALIGN) * BLOCK_ALIGN


def capacity(tokens, top_k, num_experts, factor):
    """Slots per expert in capacity mode: ceil(factor · tokens · top_k / num_experts), at most `tokens` (an expert
    cannot get a token twice) and at least 1."""
    c = -(-int(factor * tokens * top_k * 1000) // (num_experts * 1000))  # ceil without float rounding surprises
    return max(1, min(tokens, c))


class Router(nn.Cell):
    """x (N, hidden) → float32 logits (N, E); its weight (E, hidden) is Hugging Face's `gate.weight`."""

    def __init__(self, hidden, num_experts, init_std):
        super().__init__()
        self.weight = normal((num_experts, hidden), init_std, "weight") if init_std > 0 else \
            zeros((num_experts, hidden), "weight")
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        return self.matmul(x.astype(ms.float32), self.weight)


class Experts(nn.Cell):
    """E SwiGLU MLPs as two stacked weights: gate_up (E, 2F, hidden) = [gate; up] per expert, down (E, hidden, F),
    the layout of transformers 5's MixtralExperts."""

    def __init__(self, num_experts, hidden, ffn, init_std, out_std, compute_dtype):
        super().__init__()
        self.gate_up = normal((num_experts, 2 * ffn, hidden), init_std, "gate_up")
        self.down = normal((num_experts, hidden, ffn), out_std, "down")
        self.act = SiluGate(ffn)
        self.dtype = compute_dtype
        # two primitives, so that expert parallelism can shard them apart (ms_llm.parallel.layout)
        self.up_matmul = ops.BatchMatMul(transpose_b=True)
        self.down_matmul = ops.BatchMatMul(transpose_b=True)

    def construct(self, x, gate_up, down):
        """x (G, rows, hidden) with G blocks' weights gate_up (G, 2F, hidden), down (G, hidden, F)."""
        h = self.act(self.up_matmul(x.astype(self.dtype), gate_up.astype(self.dtype)))
        return self.down_matmul(h, down.astype(self.dtype))


class MoE(nn.Cell):
    """(B, T, hidden) → ((B, T, hidden), aux loss (scalar, float32), statistics (E + 5,) float32).

    The statistics are this micro-batch's expert counts, then STAT_NAMES: the training step accumulates them for the
    log (ms_llm.train.loop.router_stats)."""

    def __init__(self, hidden, ffn, num_experts, top_k, init_std, out_std, router_std=None, normalize_top_k=True,
                 aux_loss_coef=0.0, z_loss_coef=0.0, capacity_factor=None, shared_expert_size=0,
                 shared_expert_gate=False, dispatch="sorted", compute_dtype=ms.float32):
        super().__init__()
        self.hidden, self.num_experts, self.top_k = hidden, num_experts, top_k
        self.normalize, self.capacity_factor, self.dense = normalize_top_k, capacity_factor, dispatch == "dense"
        self.aux_coef, self.z_coef = aux_loss_coef, z_loss_coef
        self.router = Router(hidden, num_experts, init_std if router_std is None else router_std)
        self.experts = Experts(num_experts, hidden, ffn, init_std, out_std, compute_dtype)
        self.has_shared = shared_expert_size > 0
        self.shared = SwiGLU(hidden, shared_expert_size, init_std, out_std, 0.0, compute_dtype) if self.has_shared \
            else None
        self.has_shared_gate = shared_expert_gate
        self.shared_gate = Linear(hidden, 1, False, init_std, compute_dtype) if shared_expert_gate else None
        self.dtype = compute_dtype
        self.onehot_on, self.onehot_off = ms.Tensor(1, ms.int32), ms.Tensor(0, ms.int32)

    def construct(self, x):
        b, t, h = x.shape
        n, k, e = b * t, self.top_k, self.num_experts
        flat = x.reshape(n, h)
        logits = self.router(flat)  # float32
        probs = ops.softmax(logits, -1)
        weights, chosen = ops.topk(probs, k)  # (n, k), largest first
        if self.normalize:
            weights = weights / weights.sum(-1, keepdims=True)
        # assignments in choice-major order: the first choice of every token before any second choice
        expert_of = ops.stop_gradient(chosen.astype(ms.int32).transpose(1, 0).reshape(-1))  # (k·n,)
        onehot = ops.one_hot(expert_of, e, self.onehot_on, self.onehot_off)  # (k·n, E) int32
        counts = onehot.sum(0)  # (E,)
        rank = (ops.cumsum(onehot, 0) * onehot).sum(-1) - 1  # earlier assignments to the same expert
        if self.capacity_factor is None:
            kept = ops.ones_like(rank) > 0
        else:
            kept = rank < capacity(n, k, e, self.capacity_factor)
        gate = weights.transpose(1, 0).reshape(-1) * kept.astype(ms.float32)  # (k·n,) float32, 0 where dropped
        if self.dense:
            y = self.dense_experts(flat, expert_of, gate)
        else:
            y = self.sorted_experts(flat, expert_of, rank, kept, counts, gate)
        if self.has_shared:
            shared = self.shared(flat)
            if self.has_shared_gate:
                shared = shared * ops.sigmoid(self.shared_gate(flat).astype(ms.float32)).astype(shared.dtype)
            y = y + shared
        aux, stats = self.router_losses(logits, probs, counts, kept)
        return y.reshape(b, t, h), aux, stats

    def router_losses(self, logits, probs, counts, kept):
        """(coefficient-weighted aux loss, statistics row): Switch load balance and ST-MoE z-loss, in float32."""
        assignments = self.top_k * logits.shape[0]
        f = ops.stop_gradient(counts.astype(ms.float32)) / assignments
        lb = self.num_experts * (f * probs.mean(0)).sum()
        z = ops.square(ops.logsumexp(logits, -1)).mean()
        aux = self.aux_coef * lb + self.z_coef * z
        dropped = assignments - kept.astype(ms.float32).sum()
        one = ops.ones((), ms.float32)
        extra = ops.stack([lb, z, dropped, one * assignments, one])
        stats = ops.stop_gradient(ops.concat([counts.astype(ms.float32), extra]))
        return aux, stats

    def sorted_experts(self, flat, expert_of, rank, kept, counts, gate):
        """Gather each assignment's token into its slot, run the blocks, gather the results back (module docstring)."""
        n, h = flat.shape
        k, e = self.top_k, self.num_experts
        if self.capacity_factor is None:  # dropless: blocks of `block` rows, as many per expert as its tokens need
            block = dropless_block(n * k, e)
            blocks = ceil_div(n * k, block) + e
            per_expert = ops.stop_gradient((counts + block - 1) // block)
            first_block = ops.cumsum(per_expert, 0) - per_expert  # exclusive cumsum
            slot = first_block[expert_of] * block + rank
            # block j belongs to the expert whose blocks cover j; unused blocks at the end take the last expert
            ends = ops.cumsum(per_expert, 0)
            block_ids = ops.arange(blocks, dtype=ms.int32).reshape(-1, 1)
            owner = ops.minimum((block_ids >= ends.reshape(1, -1)).astype(ms.int32).sum(-1), e - 1)
            gate_up, down = ops.gather(self.experts.gate_up, owner, 0), ops.gather(self.experts.down, owner, 0)
        else:  # capacity: one block of C rows per expert; dropped assignments point at an extra row of zeros
            block = capacity(n, k, e, self.capacity_factor)
            blocks = e
            slot = ops.select(kept, expert_of * block + rank, ops.ones_like(rank) * (e * block))
            gate_up, down = self.experts.gate_up, self.experts.down
        slot = ops.stop_gradient(slot)
        rows = blocks * block
        token_of = ops.tile(ops.arange(n, dtype=ms.int32), (k,))
        # token id of every row (empty rows: token 0); a dropped assignment writes to row `rows`, cut off below
        token_of_row = ops.scatter_nd(slot.reshape(-1, 1), token_of, (rows + 1,))[:rows]
        x_rows = ops.gather(flat, ops.stop_gradient(token_of_row), 0).reshape(blocks, block, h)
        out = self.experts(x_rows, gate_up, down).reshape(rows, h)
        out = ops.concat([out, ops.zeros((1, h), out.dtype)])  # row `rows`: what a dropped assignment reads
        picked = ops.gather(out, slot, 0).astype(ms.float32) * gate.reshape(-1, 1)  # (k·n, hidden)
        return picked.reshape(k, n, h).sum(0).astype(self.dtype)

    def dense_experts(self, flat, expert_of, gate):
        """Every expert on every token, summed with the (token, expert) gate matrix (zero outside the top k)."""
        n, h = flat.shape
        k, e = self.top_k, self.num_experts
        weights = ops.one_hot(expert_of, e, ops.ones((), ms.float32), ops.zeros((), ms.float32)) * gate.reshape(-1, 1)
        gates = weights.reshape(k, n, e).sum(0)  # (n, E)
        x_all = ops.broadcast_to(flat.reshape(1, n, h), (e, n, h))
        out = self.experts(x_all, self.experts.gate_up, self.experts.down)  # (E, n, hidden)
        return (out.astype(ms.float32) * gates.transpose(1, 0).reshape(e, n, 1)).sum(0).astype(self.dtype)
