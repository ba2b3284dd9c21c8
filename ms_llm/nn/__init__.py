from ms_llm.nn.attention import CausalSelfAttention
from ms_llm.nn.linear import Linear
from ms_llm.nn.mlp import GeluMLP, SwiGLU
from ms_llm.nn.norms import LayerNorm, RMSNorm
from ms_llm.nn.transformer import CausalLM, DecoderLayer, decoder_layer

__all__ = ["CausalSelfAttention", "Linear", "GeluMLP", "SwiGLU", "LayerNorm", "RMSNorm", "CausalLM", "DecoderLayer", "decoder_layer"]
