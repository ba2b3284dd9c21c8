"""Named model shapes: config values under a name (`model.preset`), resolved when a config is loaded.

The released models' shapes are those of their Hugging Face config.json; `seq_length` is the context of each
family's main pretraining stage (what a continued-pretraining run would use; set it to taste). Parameter counts,
checked against the published totals in tests/test_families.py, are listed in docs/models.md.
"""

GPT2 = dict(arch="gpt2", bias=True, tie_embeddings=True, vocab_size=50257, seq_length=1024, norm_eps=1e-5)
LLAMA2 = dict(arch="llama", bias=False, tie_embeddings=False, vocab_size=32000, seq_length=4096,
              norm_eps=1e-5, rope_theta=10000.0, multiple_of=256)
# Llama 3.1 / 3.2: 128k vocabulary, RoPE base 500k with the llama3 frequency scaling (factor 8 for 3.1, 32 for 3.2).
LLAMA3 = dict(LLAMA2, vocab_size=128256, seq_length=8192, rope_theta=500000.0)
LLAMA3_SCALING = dict(type="llama3", low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
# Qwen2.5: biases on q/k/v only; Qwen3: no biases, RMSNorm on each head's q and k, head_dim 128 whatever the width.
QWEN = dict(arch="llama", bias=False, seq_length=4096, norm_eps=1e-6, rope_theta=1000000.0)
QWEN2_5 = dict(QWEN, qkv_bias=True)
QWEN3 = dict(QWEN, qk_norm=True, head_dim=128, vocab_size=151936)
# Mistral 7B v0.1: Llama's layer with GQA and a 4096-token sliding window (v0.2 and later have none).
MISTRAL = dict(LLAMA2, num_kv_heads=8, seq_length=8192, sliding_window=4096)

PRESETS = {
    # Small enough for unit tests on a laptop CPU.
    "tiny-gpt2": dict(arch="gpt2", num_layers=2, hidden_size=64, num_heads=4, seq_length=32, bias=True),
    "tiny-llama": dict(arch="llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                       seq_length=32, multiple_of=32, tie_embeddings=False),
    "gpt2-124m": dict(GPT2, num_layers=12, hidden_size=768, num_heads=12),
    "gpt2-350m": dict(GPT2, num_layers=24, hidden_size=1024, num_heads=16),
    "gpt2-774m": dict(GPT2, num_layers=36, hidden_size=1280, num_heads=20),
    "gpt2-1.5b": dict(GPT2, num_layers=48, hidden_size=1600, num_heads=25),
    "llama2-7b": dict(LLAMA2, num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=11008),
    "llama2-13b": dict(LLAMA2, num_layers=40, hidden_size=5120, num_heads=40, ffn_hidden_size=13824),
    "llama2-70b": dict(LLAMA2, num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                       ffn_hidden_size=28672),
    "llama3-8b": dict(LLAMA3, num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336),
    "llama3.1-8b": dict(LLAMA3, num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                        rope_scaling=dict(LLAMA3_SCALING, factor=8.0)),
    "llama3.2-1b": dict(LLAMA3, num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8, ffn_hidden_size=8192,
                        tie_embeddings=True, rope_scaling=dict(LLAMA3_SCALING, factor=32.0)),
    "llama3.2-3b": dict(LLAMA3, num_layers=28, hidden_size=3072, num_heads=24, num_kv_heads=8, ffn_hidden_size=8192,
                        tie_embeddings=True, rope_scaling=dict(LLAMA3_SCALING, factor=32.0)),
    "qwen2.5-0.5b": dict(QWEN2_5, num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, ffn_hidden_size=4864,
                         vocab_size=151936, tie_embeddings=True),
    "qwen2.5-7b": dict(QWEN2_5, num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4, ffn_hidden_size=18944,
                       vocab_size=152064, tie_embeddings=False),
    "qwen3-0.6b": dict(QWEN3, num_layers=28, hidden_size=1024, num_heads=16, num_kv_heads=8, ffn_hidden_size=3072,
                       tie_embeddings=True),
    "qwen3-8b": dict(QWEN3, num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=12288,
                     tie_embeddings=False),
    "mistral-7b": dict(MISTRAL, num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=14336),
}
