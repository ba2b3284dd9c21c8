from ms_llm.nn.attention import CausalSelfAttention
from ms_llm.nn.layers import GeluMLP, LayerNorm, Linear, RMSNorm, SwiGLU
from ms_llm.nn.moe import MoE
from ms_llm.nn.transformer import CausalLM, DecoderLayer, MoEDecoderLayer, decoder_layer

__all__ = ["CausalSelfAttention", "Linear", "GeluMLP", "SwiGLU", "LayerNorm", "RMSNorm", "CausalLM", "DecoderLayer",
           "MoEDecoderLayer", "decoder_layer", "MoE"]
