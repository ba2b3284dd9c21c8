"""Generation with the KV cache (ms_llm/nn/kv_cache.py, ms_llm/generate/) against the full-window generation it
replaced: every new token predicted from a forward of the whole (right-padded) window, the last `seq_length` tokens
once the sequence is longer. Greedy tokens must be identical, within the context (the cache) and past it (the
window slides), for rows of different lengths in one batch. Against transformers' generate: test_eval_parity.py."""
import numpy as np
import pytest

from conftest import op_by_op
from ms_llm.config import load_config

SEQ = 24


def random_model(*sets):
    """A tiny model whose weights are redrawn large enough that its logits are spread (no near-ties for argmax)."""
    import mindspore as ms

    from model_zoo import build_model
    from ms_llm.nn.backend import for_device

    cfg = load_config(None, ["model.vocab_size=50", "model.num_layers=2", "model.hidden_size=32", "model.num_heads=4",
                             f"model.seq_length={SEQ}", *sets])
    model = build_model(cfg.model, "float32", for_device(ms.get_context("device_target"), True))
    rng = np.random.default_rng(0)
    for p in model.get_parameters():
        if "norm" not in p.name:
            p.set_data(ms.Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    model.set_train(False)
    return model


def full_window(model, ids, n):
    """The generation this replaced: a forward of the (1, SEQ) window per token, the logits of its last real token."""
    import mindspore as ms

    ids, window = list(ids), np.zeros((1, SEQ), np.int32)
    for _ in range(n):
        ctx = ids[-SEQ:]
        window[:] = 0
        window[0, :len(ctx)] = ctx
        ids.append(int(np.argmax(model(ms.Tensor(window)).asnumpy()[0, len(ctx) - 1])))
    return ids[-n:]


def greedy(model, prompts, n, batch_size):
    """Greedy tokens both ways: the argmax in the decode graph (the default) and on the host from the logits (the
    path sampling takes); they must agree."""
    from ms_llm.generate import Generator, next_token

    generator = Generator(model, SEQ, batch_size)
    in_graph = generator.generate(prompts, n)
    on_host = generator.generate(prompts, n, lambda _, logits: next_token(logits))
    assert in_graph == on_host
    return in_graph


def test_kv_cache_greedy_tokens_are_the_full_window_ones_op_by_op():
    """The cache's arithmetic, op by op (no compile): a GPT-2 (learned positions) within its context."""
    with op_by_op():
        model = random_model()
        assert greedy(model, [[3, 1, 4]], 4, 1)[0] == full_window(model, [3, 1, 4], 4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_kv_cache_greedy_tokens_are_the_full_window_ones(family):
    """Graph mode, as `ms-llm sample` and lm-eval's generate_until run it: a batch of 4 rows (one of them padding)
    of prompts of 3, 10 and 20 tokens, 40 new tokens each: decode steps against the cache until the longest row
    passes the context of 24, then the window slides; and a prompt longer than the context alone. Llama with
    grouped-query attention, q/k norms, q/k/v biases and a sliding window of 6."""
    llama = ["model.arch=llama", "model.num_kv_heads=2", "model.qk_norm=true", "model.qkv_bias=true",
             "model.sliding_window=6"]
    model = random_model(*(llama if family == "llama" else []))
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 50, n).tolist() for n in (3, 10, 20)]
    for prompt, tokens in zip(prompts, greedy(model, prompts, 40, 4)):
        assert tokens == full_window(model, prompt, 40), f"prompt of {len(prompt)} tokens"
    long = rng.integers(0, 50, 30).tolist()
    assert greedy(model, [long], 10, 4)[0] == full_window(model, long, 10), "a prompt longer than the context"
