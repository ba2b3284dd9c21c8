"""GPT-2: learned positions, LayerNorm, GELU MLP, optional biases, tied embeddings."""
import mindspore as ms

from ms_llm.nn import CausalLM, CausalSelfAttention, decoder_layer, GeluMLP, LayerNorm
from ms_llm.nn.backend import PORTABLE
from ms_llm.nn.init import normal, residual_std


def build_gpt2(m, compute_dtype=ms.float32, backend=PORTABLE):
    out_std = residual_std(m.init_std, m.num_layers)
    layers = [
        decoder_layer(
            LayerNorm(m.hidden_size, m.norm_eps, m.bias, backend),
            CausalSelfAttention(m.hidden_size, m.num_heads, m.num_heads, m.seq_length, m.bias, m.init_std, out_std,
                                m.dropout, rope_theta=None, compute_dtype=compute_dtype, backend=backend),
            LayerNorm(m.hidden_size, m.norm_eps, m.bias, backend),
            GeluMLP(m.hidden_size, m.ffn_hidden_size, m.bias, m.init_std, out_std, m.dropout, compute_dtype, backend),
            backend,
        )
        for _ in range(m.num_layers)
    ]
    final_norm = LayerNorm(m.hidden_size, m.norm_eps, m.bias, backend)
    return CausalLM(m.vocab_size, m.hidden_size, layers, final_norm, m.init_std,
                    m.tie_embeddings, positions=normal((m.seq_length, m.hidden_size), m.init_std, "positions"),
                    dropout=m.dropout, compute_dtype=compute_dtype, backend=backend)
