"""The pre-norm decoder layer and the decoder-only language model both families are built from."""
import mindspore as ms
from mindspore import nn, ops

from ms_llm.nn.attention import DocumentMask
from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.init import normal
from ms_llm.nn.dropout import bind_dropout, dropout_site


class DecoderLayer(nn.Cell):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    routed = False  # its MLP is not a mixture of experts (MoEDecoderLayer's is)

    def __init__(self, attn_norm, attention, mlp_norm, mlp):
        super().__init__()
        self.attn_norm, self.attention = attn_norm, attention
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def construct(self, x, documents=None, positions=None):
        x = x + self.attention(self.attn_norm(x), documents, positions)
        return x + self.mlp(self.mlp_norm(x))


class ReusedDecoderLayer(DecoderLayer):
    """Compiled once and called for every layer, so compile time does not grow with depth (Ascend)."""

    @ms.lazy_inline
    def __init__(self, attn_norm, attention, mlp_norm, mlp):
        super().__init__(attn_norm, attention, mlp_norm, mlp)


class FrontReusedDecoderLayer(DecoderLayer):
    """Compiled once by the front end, then inlined: the CPU and GPU backends cannot call a subgraph
    (they reject plain lazy_inline), so only the front-end share of the compile time is saved."""

    @ms.lazy_inline(policy="front")
    def __init__(self, attn_norm, attention, mlp_norm, mlp):
        super().__init__(attn_norm, attention, mlp_norm, mlp)


class MoEDecoderLayer(DecoderLayer):
    """A decoder layer whose MLP is a mixture of experts (ms_llm.nn.moe.MoE): it also returns the router's aux loss
    and statistics, which CausalLM.forward_layers collects from every such layer."""

    routed = True

    def construct(self, x, documents=None, positions=None):
        x = x + self.attention(self.attn_norm(x), documents, positions)
        y, aux, stats = self.mlp(self.mlp_norm(x))
        return x + y, aux, stats


class ReusedMoEDecoderLayer(MoEDecoderLayer):
    @ms.lazy_inline
    def __init__(self, attn_norm, attention, mlp_norm, mlp):
        super().__init__(attn_norm, attention, mlp_norm, mlp)


class FrontReusedMoEDecoderLayer(MoEDecoderLayer):
    @ms.lazy_inline(policy="front")
    def __init__(self, attn_norm, attention, mlp_norm, mlp):
        super().__init__(attn_norm, attention, mlp_norm, mlp)


def decoder_layer(attn_norm, attention, mlp_norm, mlp, backend=PORTABLE, moe=False):
    """The repeated decoder layer, with the cell reuse the backend supports; `moe`: its MLP is a mixture of
    experts."""
    if not backend.layer_reuse:
        cls = MoEDecoderLayer if moe else DecoderLayer
    elif backend.ascend:
        cls = ReusedMoEDecoderLayer if moe else ReusedDecoderLayer
    else:
        cls = FrontReusedMoEDecoderLayer if moe else FrontReusedDecoderLayer
    return cls(attn_norm, attention, mlp_norm, mlp)


class LMHead(nn.Cell):
    """(B, T, hidden) → (B, T, vocab) float32 logits against a weight it is handed: the token embedding when
    tied. A Cell of its own so that pipeline parallelism can place it on the last stage."""

    def __init__(self, hidden, vocab_size, compute_dtype):
        super().__init__()
        self.hidden, self.vocab_size, self.dtype = hidden, vocab_size, compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x, weight):
        b, t, _ = x.shape
        logits = self.matmul(x.reshape(b * t, self.hidden), weight.astype(self.dtype))
        return logits.astype(ms.float32).reshape(b, t, self.vocab_size)


class CausalLM(nn.Cell):
    """Token ids (B, T) int32 → logits (B, T, V) float32.

    `positions` is an optional learned position table (GPT-2); `layers` the decoder layers; the LM head
    reuses the token embedding when `tie_embeddings`. With `segments` (B, T) int32, the document each token
    belongs to (packed fine-tuning samples), attention stays within a document and positions restart at each
    (DocumentMask); without, each row is one sequence.
    """

    def __init__(self, vocab_size, hidden, layers, final_norm, init_std=0.02, tie_embeddings=True,
                 positions=None, dropout=0.0, compute_dtype=ms.float32, backend=PORTABLE):
        super().__init__()
        self.embedding = normal((vocab_size, hidden), init_std, "embedding")
        self.positions = positions
        self.has_positions = positions is not None
        self.embed_dropout = dropout_site(dropout)
        self.layers = nn.CellList(layers)
        self.final_norm = final_norm
        self.tie = tie_embeddings
        self.lm_head = None if tie_embeddings else normal((vocab_size, hidden), init_std, "lm_head")
        self.dtype = compute_dtype
        self.vocab_size, self.hidden = vocab_size, hidden
        self.head = LMHead(hidden, vocab_size, compute_dtype)
        self.embedding_gather = ops.Gather()
        self.num_moe_layers = sum(1 for layer in layers if layer.routed)
        self.router_experts = next((layer.mlp.num_experts for layer in layers if layer.routed), 0)
        self.document_mask = DocumentMask()
        bind_dropout(self, backend)  # dropout masks keyed on (seed, step, sample, site): ms_llm/nn/dropout.py

    def hidden_states(self, ids, segments=None):
        """(embedding output, each layer's output, final norm output): the residual stream layer by layer."""
        return self.forward_layers(ids, segments)[0]

    def forward_layers(self, ids, segments=None):
        """(hidden states as `hidden_states` returns them, router aux loss (float32 scalar: the coefficient-weighted
        load-balancing and z-losses, averaged over the MoE layers; 0 without any), the MoE layers' router statistics
        as a tuple of (E + 5,) rows (ms_llm.nn.moe.STAT_NAMES))."""
        t = ids.shape[1]
        x = self.embedding_gather(self.embedding, ids, 0)
        documents, positions = None, None
        if segments is not None:
            documents, positions = self.document_mask(segments)
        if self.has_positions:
            x = x + (self.positions[:t] if positions is None else self.embedding_gather(self.positions, positions, 0))
        x = self.embed_dropout(x.astype(self.dtype))
        states = (x,)
        aux, stats = ops.zeros((), ms.float32), ()
        for layer in self.layers:
            out = layer(x) if segments is None else layer(x, documents, positions)
            if layer.routed:
                x, layer_aux, layer_stats = out
                aux = aux + layer_aux
                stats = stats + (layer_stats,)
            else:
                x = out
            states = states + (x,)
        return states + (self.final_norm(x),), aux / max(1, self.num_moe_layers), stats

    def head_weight(self):
        """The LM head's (vocab, hidden) float32 weight: the token embedding when tied."""
        return self.embedding if self.tie else self.lm_head

    def logits(self, x):
        """(B, T, hidden) final-norm output → (B, T, vocab) float32 logits."""
        return self.head(x, self.head_weight())

    def construct(self, ids, segments=None):
        return self.logits(self.hidden_states(ids, segments)[-1])
