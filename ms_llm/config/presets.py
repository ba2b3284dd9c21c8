"""Named model shapes: config values under a name (`model.preset`), resolved when a config is loaded."""

GPT2 = dict(arch="gpt2", bias=True, tie_embeddings=True, vocab_size=50257, seq_length=1024, norm_eps=1e-5)
LLAMA2 = dict(arch="llama", bias=False, tie_embeddings=False, vocab_size=32000, seq_length=4096,
              norm_eps=1e-5, rope_theta=10000.0, multiple_of=256)

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
    "llama3-8b": dict(LLAMA2, num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=128256, seq_length=8192, rope_theta=500000.0),
}
