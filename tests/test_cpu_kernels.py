"""The fused CPU kernels against the plain MindSpore compositions they replace: forward and gradient."""
import numpy as np
import pytest
import mindspore as ms

from ms_llm.nn import cpu_kernels
from ms_llm.nn.backend import Backend
from ms_llm.nn.layers import GeluTanh, LayerNorm
from ms_llm.train.step import scaled, squared_norm, sum_of_squares

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
pytestmark = pytest.mark.skipif(cpu_kernels.library() is None, reason=f"no kernels: {cpu_kernels.build_error()}")

# Tolerances for float32 results against float64 / the composition: the kernels reassociate sums
# (-ffast-math) and use glibc's vector expf; measured errors are ~1e-6 relative, 100x inside these.
RTOL, ATOL = 1e-4, 1e-5


def build(cls, *args):
    """The same Cell twice: once with the fused kernels, once with plain ops."""
    fused = cls(*args, backend=Backend("CPU", cpu_kernels=True))
    plain = cls(*args, backend=Backend("CPU"))
    assert fused.fused and not plain.fused
    return fused, plain


def value_and_grads(cell, x, weights=()):
    def loss(x):
        y = cell(x)
        return (y * ms.Tensor(np.linspace(-1, 1, y.size).reshape(y.shape).astype(np.float32))).sum(), y

    fn = ms.value_and_grad(loss, grad_position=0, weights=weights, has_aux=True)
    (_, y), grads = ms.jit(fn)(x)
    return y.asnumpy(), grads


def gelu_reference(x):
    """float64 GELU (tanh form) and its derivative."""
    x = x.astype(np.float64)
    k = np.sqrt(2 / np.pi)
    t = np.tanh(k * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)


def test_gelu_forward_and_gradient_match_float64_and_composition():
    fused, plain = build(GeluTanh)
    x = (np.random.default_rng(0).standard_normal((384, 512)) * 4).astype(np.float32)
    weights = np.linspace(-1, 1, x.size).reshape(x.shape)
    ref_y, ref_dy = gelu_reference(x)
    for cell in (fused, plain):
        y, (dx, _) = value_and_grads(cell, ms.Tensor(x))
        np.testing.assert_allclose(y, ref_y, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(dx.asnumpy(), ref_dy * weights, rtol=RTOL, atol=ATOL)
    big = ms.Tensor(np.array([-1e4, -60.0, 60.0, 1e4], np.float32))  # the clamp keeps the tails finite
    np.testing.assert_allclose(fused(big).asnumpy(), [0.0, 0.0, 60.0, 1e4], atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_forward_and_gradients_match_composition(bias):
    fused, plain = build(LayerNorm, 96, 1e-5, bias)
    rng = np.random.default_rng(1)
    for cell in (fused, plain):  # non-trivial gain and bias, identical in both
        cell.weight.set_data(ms.Tensor(rng.standard_normal(96).astype(np.float32)))
        if bias:
            cell.bias.set_data(ms.Tensor(rng.standard_normal(96).astype(np.float32)))
        rng = np.random.default_rng(1)
    x = ms.Tensor((rng.standard_normal((4, 30, 96)) * 3 + 1).astype(np.float32))
    yf, (dxf, dwf) = value_and_grads(fused, x, fused.trainable_params())
    yp, (dxp, dwp) = value_and_grads(plain, x, plain.trainable_params())
    assert yf.shape == (4, 30, 96)
    np.testing.assert_allclose(yf, yp, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dxf.asnumpy(), dxp.asnumpy(), rtol=RTOL, atol=ATOL)
    for a, b in zip(dwf, dwp):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=RTOL, atol=1e-4)


def layernorm_reference(x, w, b, eps, dy):
    """float64 LayerNorm and its gradients (dx, dw, db) for the upstream gradient dy, derived by hand."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    xc = x - x.mean(-1, keepdims=True)
    r = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xh = xc * r
    dxh = dy * w
    dx = r * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return xh * w + b, dx, (dy * xh).sum(rows), dy.sum(rows)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composition"])
def test_layernorm_matches_a_float64_reference(fused):
    """Both paths against the formula itself, not only against each other."""
    cell = LayerNorm(96, 1e-5, True, backend=Backend("CPU", cpu_kernels=fused))
    rng = np.random.default_rng(7)
    w, b = rng.standard_normal(96), rng.standard_normal(96)
    cell.weight.set_data(ms.Tensor(w.astype(np.float32)))
    cell.bias.set_data(ms.Tensor(b.astype(np.float32)))
    x = (rng.standard_normal((4, 30, 96)) * 3 + 1).astype(np.float32)
    y, (dx, (dw, db)) = value_and_grads(cell, ms.Tensor(x), cell.trainable_params())
    dy = np.linspace(-1, 1, y.size).reshape(y.shape)  # the upstream gradient value_and_grads applies
    ref_y, ref_dx, ref_dw, ref_db = layernorm_reference(x, w.astype(np.float32), b.astype(np.float32), 1e-5, dy)
    np.testing.assert_allclose(y, ref_y, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx.asnumpy(), ref_dx, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dw.asnumpy(), ref_dw, rtol=RTOL, atol=1e-4)
    np.testing.assert_allclose(db.asnumpy(), ref_db, rtol=RTOL, atol=1e-4)


class SumOfSquares(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = cpu_kernels.op("sum_squares")

    def construct(self, x):
        return sum_of_squares(x, self.op)


def test_sum_of_squares_matches_and_propagates_inf():
    cell = SumOfSquares()
    x = np.random.default_rng(2).standard_normal((1000, 77)).astype(np.float32)
    assert float(cell(ms.Tensor(x)).asnumpy()) == pytest.approx(float((x.astype(np.float64) ** 2).sum()), rel=1e-6)
    x[3, 5] = np.inf
    assert np.isinf(float(cell(ms.Tensor(x)).asnumpy()))
    x[3, 5] = np.nan
    assert np.isnan(float(cell(ms.Tensor(x)).asnumpy()))


class SquaredNorm(ms.nn.Cell):
    """The squared norm of a step's gradients, by one kernel over all of them (fused) or by AddN of one kernel each."""

    def __init__(self, fused):
        super().__init__()
        self.all = cpu_kernels.op("sum_squares_all") if fused else None
        self.one = cpu_kernels.op("sum_squares")

    def construct(self, *grads):
        return squared_norm(grads, self.all, self.one)


def test_one_kernel_over_all_gradients_is_bit_for_bit_the_addn_of_each():
    """The training step's gradient norm (and so its clipping, and the run's numbers) does not move: the same float32
    value to the last bit, over gradients of the sizes a model has (a block of 4096 and more, odd sizes, a scalar)."""
    rng = np.random.default_rng(4)
    grads = [ms.Tensor((rng.standard_normal(shape) * scale).astype(np.float32))
             for shape, scale in (((66, 128), 1e-2), ((128,), 3.0), ((384, 128), 1e-4), ((5000,), 0.5), ((1,), 7.0),
                                  ((513, 3), 1e3))]
    fused, per_gradient = SquaredNorm(True), SquaredNorm(False)
    assert fused(*grads).shape == ()
    assert fused(*grads).asnumpy().tobytes() == per_gradient(*grads).asnumpy().tobytes()
    # where the precision and the order of the additions show: 1e8 and five 1s, added in float32 one after the
    # other, is not their exact sum, and depends on where the 1e8 comes (float32's spacing at 1e8 is 8)
    big, one = ms.Tensor(np.array([1e4], np.float32)), ms.Tensor(np.ones((1,), np.float32))
    for uneven, in_order in (([big] + [one] * 5, 1e8), ([one] * 5 + [big], 100000008.0)):
        got = fused(*uneven).asnumpy()
        assert got.tobytes() == per_gradient(*uneven).asnumpy().tobytes() and float(got) == in_order
    assert np.float32(1e8) + np.float32(1) == np.float32(1e8) and np.float32(1e8) + np.float32(5) == 100000008.0
    inf = grads[2].asnumpy().copy()
    inf[100, 7] = np.inf  # the same shapes as `grads`: the compiled graph is reused
    assert np.isinf(fused(*grads[:2], ms.Tensor(inf), *grads[3:]).asnumpy())


class Scaled(ms.nn.Cell):
    """A step's gradients times its unscale-and-clip factor, by one kernel (fused) or by a Mul each."""

    def __init__(self, fused):
        super().__init__()
        self.op = cpu_kernels.op("scale_all") if fused else None
        self.hyper_map = ms.ops.HyperMap()

    def construct(self, factor, *grads):
        return scaled(grads, factor, self.hyper_map, self.op)


def test_one_kernel_scaling_all_gradients_is_bit_for_bit_a_mul_each():
    rng = np.random.default_rng(5)
    grads = [ms.Tensor((rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6)).astype(np.float32))
             for shape in ((66, 128), (128,), (4099,), (1,), (7, 5, 3))]
    factor = ms.Tensor(np.float32(0.3) / np.float32(65536.0))
    fused, per_gradient = Scaled(True)(factor, *grads), Scaled(False)(factor, *grads)
    assert len(fused) == len(grads)
    for a, b, g in zip(fused, per_gradient, grads):
        assert a.shape == g.shape and a.asnumpy().tobytes() == b.asnumpy().tobytes()
    assert not np.array_equal(fused[0].asnumpy(), grads[0].asnumpy())


def test_non_finite_values_propagate_through_fused_kernels():
    """-ffast-math must not swallow NaN/Inf: the NaN hunter relies on seeing them where they arise."""
    fused_gelu, _ = build(GeluTanh)
    fused_ln, _ = build(LayerNorm, 8)
    x = np.ones((2, 8), np.float32)
    x[0, 3], x[1, 2] = np.nan, np.inf
    y = fused_gelu(ms.Tensor(x)).asnumpy()
    assert np.isnan(y[0, 3]) and np.isposinf(y[1, 2]) and np.isfinite(y[0, 0])
    assert np.isnan(fused_ln(ms.Tensor(x)).asnumpy()).all()  # a non-finite value poisons its whole row


# -- attention: causal softmax, head split/merge, selective recompute by custom bprop ------------------

def attention_grads(attention, x, weights):
    """(output, dx, parameter gradients) of Σ attention(x) · weights."""
    def loss(x):
        return (attention(x) * weights).sum()

    value, (dx, dws) = ms.jit(ms.value_and_grad(loss, 0, attention.trainable_params()))(x)
    return [value.asnumpy(), dx.asnumpy()] + [g.asnumpy() for g in dws]


def test_head_split_and_merge_kernels_are_the_transposes_and_slices():
    """heads_split against numpy's transpose and slices, forward and gradient (the gradient of q, k, v written back
    into the fused (B, T, H + 2KV, D) layout); swap_middle_axes against numpy (its gradient is itself)."""
    h, kv = 4, 2
    qkv = np.random.default_rng(10).standard_normal((2, 5, h + 2 * kv, 3)).astype(np.float32)
    heads = qkv.transpose(0, 2, 1, 3)
    expected = heads[:, :h], heads[:, h:h + kv], heads[:, h + kv:]
    split = cpu_kernels.op("heads_split", h, kv)
    for got, want in zip(split(ms.Tensor(qkv)), expected):
        assert np.array_equal(got.asnumpy(), want)  # a copy: bit for bit
    dq, dk, dv = (np.random.default_rng(11 + i).standard_normal(e.shape).astype(np.float32) for i, e in
                  enumerate(expected))
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)  # one op's gradient: no graph to compile
    try:
        def weighted(x):
            q, k, v = split(x)
            return (q * ms.Tensor(dq)).sum() + (k * ms.Tensor(dk)).sum() + (v * ms.Tensor(dv)).sum()

        grad = ms.grad(weighted)(ms.Tensor(qkv)).asnumpy()
    finally:
        ms.set_context(mode=mode)
    assert np.array_equal(grad, np.concatenate([dq, dk, dv], 1).transpose(0, 2, 1, 3))
    swapped = cpu_kernels.op("swap_middle_axes")(ms.Tensor(heads)).asnumpy()
    assert np.array_equal(swapped, qkv)


@pytest.mark.slow  # compiles four attention layers with their gradients (~3 s idle); the kernels alone are above
@pytest.mark.parametrize("kv_heads,rope", [(4, None), (2, 10000.0)], ids=["mha", "gqa-rope"])
def test_fused_attention_matches_the_composition(kv_heads, rope):
    """The causal-softmax and head split/merge kernels against MindSpore's mask add, Softmax, Transpose and slices:
    forward, input gradient and every weight gradient."""
    from ms_llm.nn.attention import CausalSelfAttention

    rng = np.random.default_rng(4)
    x = ms.Tensor(rng.standard_normal((3, 16, 64)).astype(np.float32))
    weights = ms.Tensor(rng.standard_normal((3, 16, 64)).astype(np.float32))
    results = []
    for backend in (Backend("CPU", cpu_kernels=True), Backend("CPU")):
        ms.set_seed(0)
        attention = CausalSelfAttention(64, 4, kv_heads, 16, rope_theta=rope, backend=backend)
        assert attention.fused_heads == attention.core.fused == backend.cpu_kernels
        results.append(attention_grads(attention, x, weights))
    for fused, plain in zip(*results):
        np.testing.assert_allclose(fused, plain, rtol=RTOL, atol=ATOL)


def test_a_sliding_window_is_masked_with_the_fused_kernels_on():
    """The causal-softmax kernel knows only the triangle: with a sliding window (Mistral) the core keeps the mask
    add, so kernels on and off give the same windowed attention."""
    from ms_llm.nn.attention import CausalSelfAttention

    x = ms.Tensor(np.random.default_rng(9).standard_normal((2, 16, 32)).astype(np.float32))
    outputs = []
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)  # forward only: op by op, no graph to compile
    try:
        for backend in (Backend("CPU", cpu_kernels=True), Backend("CPU")):
            ms.set_seed(0)
            outputs.append(CausalSelfAttention(32, 2, 2, 16, backend=backend, window=4)(x).asnumpy())
    finally:
        ms.set_context(mode=mode)
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=RTOL, atol=ATOL)


def test_causal_softmax_masks_exactly_and_its_gradient_matches():
    op = cpu_kernels.op("causal_softmax")
    scores = np.random.default_rng(6).standard_normal((2, 3, 5, 5)).astype(np.float32) * 4
    p = op(ms.Tensor(scores)).asnumpy()
    masked = scores + np.triu(np.full((5, 5), -np.inf, np.float32), 1)
    ref = np.exp(masked - masked.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(p, ref, rtol=1e-6, atol=1e-7)
    assert (p[..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] == 0).all()  # exactly 0, like the -1e9 mask
    dy = np.random.default_rng(7).standard_normal(p.shape).astype(np.float32)
    dx = cpu_kernels.op("causal_softmax_grad")(ms.Tensor(p), ms.Tensor(dy)).asnumpy()
    np.testing.assert_allclose(dx, p * (dy - (dy * p).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiles two whole decoder layers with their gradients (~3 s idle)
def test_selective_recompute_by_custom_bprop_is_bit_identical():
    """ms_llm's selective recompute on CPU (the attention probabilities and GELU's output rebuilt in the backward by
    the same kernels) changes no bit of the layer's output or gradients."""
    from ms_llm.nn import CausalSelfAttention, DecoderLayer, GeluMLP

    backend = Backend("CPU", cpu_kernels=True)
    rng = np.random.default_rng(8)
    x = ms.Tensor(rng.standard_normal((2, 16, 32)).astype(np.float32))
    weights = ms.Tensor(rng.standard_normal((2, 16, 32)).astype(np.float32))
    results = []
    for select in (False, True):
        ms.set_seed(0)
        layer = DecoderLayer(LayerNorm(32, backend=backend), CausalSelfAttention(32, 2, 2, 16, bias=True, backend=backend),
                             LayerNorm(32, backend=backend), GeluMLP(32, 128, True, 0.02, 0.02, backend=backend))
        if select:
            layer.attention.core.recompute()
            layer.mlp.act.recompute()
            assert layer.attention.core.recompute_probs and layer.mlp.act.recompute_output
        results.append(attention_grads(layer, x, weights))
    assert len(results[0]) == 2 + 12  # output, dx, 12 weights and biases
    for a, b in zip(*results):
        assert np.array_equal(a, b)
