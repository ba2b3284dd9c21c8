"""Text generation with a KV cache: one module used by `ms-llm sample`, `sample --chat` and lm-eval's
`generate_until` (ms_llm.eval). It works on a built model and token ids only (loading a run is its callers'
business), so it never imports `ms_llm.train`."""
from ms_llm.generate.generator import Generator, length_buckets, next_token  # noqa: F401
