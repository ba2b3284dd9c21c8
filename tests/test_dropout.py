"""Dropout masks are a function of (seed, step, micro-batch, sample, site): reruns, resumes and cached graphs are
exact with dropout on (ms_llm/nn/dropout.py). Resume at accumulation 2, kill -9, the 2-rank launch and cache reuse
run with dropout 0.1 in their own tests (conftest.ACCUM2, test_compile_cache); two cold compiles of a run with dropout
at accumulation 2 log the same losses, every step: test_compile_cache's dropout option, compiled cold in two caches
(test_an_option_after_the_plain_run_trains_like_its_cold_compile[dropout])."""
import os

import numpy as np
import pytest

from conftest import ACCUM2, ROOT, tiny_train_args


def mask(shape, key, site=0, p=0.25):
    import mindspore as ms
    from ms_llm.nn.dropout import keep_mask

    return keep_mask(shape, ms.Tensor(np.array(key, np.int32)), site, p).asnumpy()


def test_masks_keep_one_minus_p_and_change_with_seed_step_sample_and_site(pynative):
    base = mask((8, 64, 32), [1337, 5, 0, 0, 1])
    assert abs(base.mean() - 0.75) < 0.01
    assert np.array_equal(base, mask((8, 64, 32), [1337, 5, 0, 0, 1]))  # a function of its key, nothing else
    for other in ([7, 5, 0, 0, 1], [1337, 6, 0, 0, 1], [1337, 5, 1, 0, 1], [1337, 5, 0, 1, 2]):
        agree = (mask((8, 64, 32), other) == base).mean()
        assert 0.55 < agree < 0.70, (other, agree)  # independent masks agree on p² + (1-p)² = 62.5% of elements
    assert 0.55 < (mask((8, 64, 32), [1337, 5, 0, 0, 1], site=1) == base).mean() < 0.70
    rows = mask((8, 64, 32), [1337, 5, 0, 0, 1]).reshape(8, -1)
    assert len({r.tobytes() for r in rows}) == 8  # every sample its own mask


def test_a_sample_gets_the_same_mask_whatever_the_split_of_its_step(pynative):
    """The global batch of 8, as one micro-batch of 8, two of 4, or 2 ranks × two micro-batches of 2: each sample's
    mask is the same (the sample's position in the step is (micro · B + row) · dp + rank)."""
    whole = mask((8, 16), [3, 9, 0, 0, 1])
    halves = np.concatenate([mask((4, 16), [3, 9, m, 0, 1]) for m in range(2)])
    assert np.array_equal(whole, halves)
    order = [(m * 2 + j) * 2 + r for r in range(2) for m in range(2) for j in range(2)]
    ranks = np.concatenate([mask((2, 16), [3, 9, m, r, 2]) for r in range(2) for m in range(2)])
    assert np.array_equal(whole[order], ranks)


@pytest.mark.slow
def test_the_step_keys_every_micro_batch_and_every_step(dataset):
    """Inside the compiled step the key moves: the two micro-batches of a step, given the same samples, draw other
    masks (other losses), and so does the next step; without dropout the same samples give the same loss."""
    from ms_llm.config import load_config
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    args = tiny_train_args(dataset, "unused", *ACCUM2, "--set", "context.compile_cache=false")
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]

    def accumulated(extra, step_first=True):
        cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"), sets + extra)
        s = open_session(cfg, echo=lambda *a: None)
        b = s.next_batches()[0]
        step_1 = float(StepRunner(s, use_compile_cache=False).step([b, b]).loss.asnumpy()) if step_first else None
        first = float(s.step_fn.accumulate(b).asnumpy())  # micro-batch 0 of the next step
        second = float(s.step_fn.accumulate(b).asnumpy())  # micro-batch 1 of it (no update in between)
        return step_1, first, second

    step_1, first, second = accumulated([])
    assert first != second and step_1 not in (first, second)
    # without dropout, the accumulating graph alone (the update's graph is not compiled: no step is taken first)
    _, plain_first, plain_second = accumulated(["model.dropout=0.0"], step_first=False)
    assert plain_first == plain_second


KEYS = [[1337, 5, 0, 0, 1], [0, 0, 0, 0, 1], [2**31 - 2, 2**31 - 1, 7, 3, 8], [42, 123456, 1, 1, 2]]


@pytest.mark.parametrize("shape", [(8, 64, 32), (3,), (5, 1), (2, 4, 7, 7), (1, 33)])
def test_the_fused_mask_kernel_is_the_composed_hash_bit_for_bit(pynative, shape):
    """The CPU kernel (DropoutKeep) draws the very masks of keep_mask's composition, on every site, rate and key:
    a run with the fused kernels and one without drop the same elements."""
    import mindspore as ms
    from ms_llm.nn import cpu_kernels

    if cpu_kernels.library() is None:
        pytest.fail(f"the fused CPU kernels did not build: {cpu_kernels.build_error()}")
    kernel = cpu_kernels.op("dropout_keep")
    x = ms.Tensor(np.zeros(shape, np.float16))  # its shape alone is read
    for key in KEYS:
        for site, p in ((0, 0.25), (3, 0.1), (17, 0.9)):
            threshold = int(round(p * (1 << 24)))
            fused = kernel(x, ms.Tensor(np.array(key, np.int32)), ms.Tensor(np.array([site, threshold], np.int32)))
            assert fused.dtype == ms.bool_
            assert np.array_equal(fused.asnumpy(), mask(shape, key, site, p)), (key, site, p)


def test_a_site_with_the_kernel_drops_and_scales_as_the_composition_forward_and_backward(pynative):
    import mindspore as ms
    from mindspore import nn
    from ms_llm.nn.backend import Backend
    from ms_llm.nn.dropout import KEY_NAME, StatelessDropout, bind_dropout

    class Two(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a, self.b = StatelessDropout(0.3), StatelessDropout(0.3)

        def construct(self, x):
            return self.b(self.a(x) * 2.0)

    x = ms.Tensor(np.random.default_rng(0).standard_normal((4, 6, 10)).astype(np.float32))
    results = []
    for cpu_kernels in (True, False):
        model = Two()
        bind_dropout(model, Backend("CPU", cpu_kernels=cpu_kernels))
        assert (model.a.fused_mask is not None) == cpu_kernels and model.b.site == 1
        getattr(model, KEY_NAME).set_data(ms.Tensor(np.array([9, 4, 1, 0, 1], np.int32)))
        model.set_train(True)
        y, dx = ms.value_and_grad(model)(x)
        results.append((y.asnumpy(), dx.asnumpy()))
    (y_fused, dx_fused), (y_plain, dx_plain) = results
    assert np.array_equal(y_fused, y_plain) and np.array_equal(dx_fused, dx_plain)
    assert 0.3 < (y_plain == 0).mean() < 0.7  # two sites of 0.3: about half dropped


def test_sites_added_after_the_build_take_the_models_backend():
    """LoRA's adapter dropout, added to a model built without dropout, draws its masks with the fused kernel of the
    backend the model was built for (and the composition on one without)."""
    from ms_llm.config import load_config
    from ms_llm.nn.backend import Backend
    from ms_llm.nn.dropout import StatelessDropout
    from ms_llm.nn.lora import apply_lora
    from model_zoo import build_model

    cfg = load_config(None, ["model.preset=tiny-gpt2", "model.num_layers=1", "model.vocab_size=40"])
    for fused in (True, False):
        model = build_model(cfg.model, cfg.precision.compute_dtype, Backend("CPU", cpu_kernels=fused))
        apply_lora(model, 4, 8, 0.1)
        sites = [c for _, c in model.cells_and_names() if isinstance(c, StatelessDropout)]
        assert len(sites) == 4 and [c.site for c in sites] == [0, 1, 2, 3]
        assert all((c.fused_mask is not None) == fused for c in sites)
