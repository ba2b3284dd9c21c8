"""Llama and its relatives: RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head by default, no biases.
The relatives are options of the same layer (docs/models.md): Llama 3's RoPE scaling (model.rope_scaling),
Qwen2.5's q/k/v biases (model.qkv_bias), Qwen3's per-head q/k RMSNorm and head size (model.qk_norm,
model.head_dim), Mistral's sliding window (model.sliding_window), and mixtures of experts in place of the MLP of
chosen layers (model.moe: Mixtral, Qwen3-MoE; docs/moe.md)."""
import mindspore as ms

from ms_llm.config.validate import expert_ffn, moe_layers
from ms_llm.nn import CausalLM, CausalSelfAttention, decoder_layer, MoE, RMSNorm, SwiGLU
from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.init import residual_std


def build_llama(m, compute_dtype=ms.float32, backend=PORTABLE):
    out_std = residual_std(m.init_std, m.num_layers)
    routed = set(moe_layers(m))
    layers = [
        decoder_layer(
            RMSNorm(m.hidden_size, m.norm_eps, backend),
            CausalSelfAttention(m.hidden_size, m.num_heads, m.num_kv_heads, m.seq_length, False, m.init_std, out_std,
                                m.dropout, rope_theta=m.rope_theta, compute_dtype=compute_dtype, backend=backend,
                                head_dim=m.head_dim, qkv_bias=m.qkv_bias, qk_norm_eps=m.norm_eps if m.qk_norm else None,
                                rope_scaling=m.rope_scaling, window=m.sliding_window),
            RMSNorm(m.hidden_size, m.norm_eps, backend),
            experts(m, out_std, compute_dtype) if i in routed else
            SwiGLU(m.hidden_size, m.ffn_hidden_size, m.init_std, out_std, m.dropout, compute_dtype),
            backend,
            moe=i in routed,
        )
        for i in range(m.num_layers)
    ]
    return CausalLM(m.vocab_size, m.hidden_size, layers, RMSNorm(m.hidden_size, m.norm_eps, backend), m.init_std,
                    m.tie_embeddings, positions=None, dropout=m.dropout, compute_dtype=compute_dtype,
                    backend=backend)


def experts(m, out_std, compute_dtype):
    """The mixture-of-experts block of model.moe."""
    moe = m.moe
    return MoE(m.hidden_size, expert_ffn(m), moe.num_experts, moe.top_k, m.init_std, out_std,
               router_std=moe.router_init_std, normalize_top_k=moe.normalize_top_k, aux_loss_coef=moe.aux_loss_coef,
               z_loss_coef=moe.z_loss_coef, capacity_factor=moe.capacity_factor,
               shared_expert_size=moe.shared_expert_size, shared_expert_gate=moe.shared_expert_gate,
               dispatch=moe.dispatch, compute_dtype=compute_dtype)
