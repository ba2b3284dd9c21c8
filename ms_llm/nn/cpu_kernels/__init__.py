"""Fused float32 CPU kernels (kernels.cc) behind `mindspore.ops.Custom(func_type="aot")`.

They are an opt-in fast path for `device_target == "CPU"` only: a model built with a `Backend` whose
`cpu_kernels` is true uses them (config `context.cpu_kernels`, default true). Everything
that uses them keeps the plain MindSpore composition as its fallback, which is also what runs on
Ascend/GPU, when g++ is missing, or when the build fails; `tests/test_cpu_kernels.py` checks both paths
agree (forward and gradient).

The shared library is compiled at first use into ~/.cache/ms_llm/kernels (or $MS_LLM_CACHE), keyed by
the source, the flags, the compiler and the CPU's feature flags, so a cache shared between machines
never runs AVX-512 code on a CPU without it.
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
from ms_llm import env

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.cc")
# -ffast-math only when compiling: linking with it would pull in crtfastmath.o, which switches the
# whole process to flush-denormals-to-zero the moment the library is loaded.
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-fPIC", "-std=c++17"]

_state = {"library": None, "error": None}  # the build, done once per process


def build_error():
    return _state["error"]


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return ""


def library():
    """Path of the compiled library, building it if needed; None (with build_error() set) if it cannot be."""
    if _state["library"] or _state["error"]:
        return _state["library"]
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        _state["error"] = "no C++ compiler (g++) on PATH"
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        with open(SOURCE, "rb") as f:
            src = f.read()
        key = hashlib.sha256(src + " ".join(COMPILE_FLAGS).encode() + version.encode() + _cpu_flags().encode())
        cache = env.cache_root()
        out_dir = os.path.join(cache, "kernels")
        target = os.path.join(out_dir, f"ms_llm_kernels_{key.hexdigest()[:16]}.so")
        if not os.path.isfile(target):
            os.makedirs(out_dir, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
                obj, lib = os.path.join(tmp, "kernels.o"), os.path.join(tmp, "kernels.so")
                for cmd in ([compiler, *COMPILE_FLAGS, "-c", SOURCE, "-o", obj], [compiler, "-shared", obj, "-o", lib]):
                    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                    if res.returncode != 0:
                        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()[:500]}")
                os.replace(lib, target)  # atomic: concurrent ranks never load a half-written file
        allow = os.environ.get("MS_CUSTOM_AOT_WHITE_LIST")
        if allow and out_dir not in allow.split(":"):
            os.environ["MS_CUSTOM_AOT_WHITE_LIST"] = f"{allow}:{out_dir}"
        _state["library"] = target
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _state["error"] = str(e)
    return _state["library"]


def custom(name, out_shape, out_dtype, bprop=None):
    from mindspore import ops

    return ops.Custom(f"{library()}:{name}", out_shape=out_shape, out_dtype=out_dtype, func_type="aot", bprop=bprop)


_ops = {}


def op(name, *args):
    """The Custom primitive for one fused computation (built once per process and argument list)."""
    key = (name,) + args
    if key not in _ops:
        _ops[key] = _BUILDERS[name](*args)
    return _ops[key]


def _gelu_tanh_grad():
    return custom("GeluTanhBwd", lambda x, dy: x, lambda x, dy: x)


def _gelu_tanh():
    bwd = _gelu_tanh_grad()

    def bprop(x, out, dout):
        return (bwd(x, dout),)

    return custom("GeluTanhFwd", lambda x: x, lambda x: x, bprop)


def _layer_norm():
    from mindspore import ops

    bwd = custom("LayerNormBwd", lambda x, w, eps, dy: (x, w, w), lambda x, w, eps, dy: (x, w, w))

    def bprop(x, w, b, eps, out, dout):
        dx, dw, db = bwd(x, w, eps, dout)
        return dx, dw, db, ops.zeros_like(eps)

    return custom("LayerNormFwd", lambda x, w, b, eps: x, lambda x, w, b, eps: x, bprop)


def _sum_squares():
    return custom("SumSquares", lambda x: [1], lambda x: x)


def _sum_squares_all():
    """(x_1, ..., x_n) → [Σ x_1², ..., added in order as AddN adds]: the squared norm of a step's gradients."""
    return custom("SumSquaresAll", lambda *x: [1], lambda *x: x[0])


def _scale_all():
    """(x_1, ..., x_n, factor) → (x_1 * factor, ..., x_n * factor): a step's gradients unscaled and clipped."""
    return custom("ScaleAll", lambda *x: list(x[:-1]), lambda *x: list(x[:-1]))


def _causal_softmax_grad():
    """(softmax output y, its gradient dy) → the gradient of the scores."""
    return custom("CausalSoftmaxBwd", lambda y, dy: y, lambda y, dy: y)


def _causal_softmax():
    bwd = _causal_softmax_grad()

    def bprop(x, out, dout):
        return (bwd(out, dout),)

    return custom("CausalSoftmaxFwd", lambda x: x, lambda x: x, bprop)


def _heads_split(heads, kv_heads):
    """(B, T, heads + 2 kv_heads, D) → q (B, heads, T, D), k and v (B, kv_heads, T, D)."""
    def shapes(x):
        b, t, _, d = x
        return [b, heads, t, d], [b, kv_heads, t, d], [b, kv_heads, t, d]

    bwd = custom("HeadsSplitBwd", lambda q, k, v: [q[0], q[2], heads + 2 * kv_heads, q[3]], lambda q, k, v: q)

    def bprop(x, out, dout):
        return (bwd(*dout),)

    return custom("HeadsSplit", shapes, lambda x: (x, x, x), bprop)


def _swap_middle_axes():
    """(B, X, Y, D) → (B, Y, X, D); its gradient is itself."""
    def shape(x):
        return [x[0], x[2], x[1], x[3]]

    swap = custom("SwapMiddleAxes", shape, lambda x: x)

    def bprop(x, out, dout):
        return (swap(dout),)

    return custom("SwapMiddleAxes", shape, lambda x: x, bprop)


def _softmax_cross_entropy():
    """(logits (rows, vocab), targets, coef) → (ce (rows,), coef-weighted gradient of ce w.r.t. the logits). No
    bprop: the chunked loss (ms_llm.train.losses.chunked) calls it inside its own backward."""
    return custom("SoftmaxCrossEntropy", lambda x, t, c: ([x[0]], x), lambda x, t, c: (x, x))


def _softmax_cross_entropy_loss():
    return custom("SoftmaxCrossEntropyLoss", lambda x, t: [x[0]], lambda x, t: x)


def _decode_attention():
    """(q (B, H, 1, D), k, v (B, KV, 1, D), key cache, value cache (B, KV, S, D), pos (B,) int32, window (1,)
    int32, scale (1,) float32) → y (B, H, 1, D); k and v are written into the caches at pos, in place. No bprop:
    generation only."""
    return custom("DecodeAttention", lambda q, k, v, kc, vc, pos, window, scale: q,
                  lambda q, k, v, kc, vc, pos, window, scale: q)


def _decode_rope():
    """(q (B, H, 1, D), k (B, KV, 1, D), cos, sin (S, D), pos (B,) int32) → q, k rotated to their rows' positions.
    Generation only (no bprop)."""
    return custom("DecodeRope", lambda q, k, c, s, p: (q, k), lambda q, k, c, s, p: (q, k))


def _rms_norm():
    """(x (rows, cols), w (cols,), eps (1,)) → RMSNorm of each row. Forward only: generation uses it."""
    return custom("RmsNormFwd", lambda x, w, eps: x, lambda x, w, eps: x)


def _dropout_keep():
    """(x, key (5,) int32, (site, threshold) int32) → the site's keep mask (bool, x's shape), from x's shape alone:
    ms_llm.nn.dropout's hash in one kernel. Its gradient is zero (a mask)."""
    import mindspore as ms
    from mindspore import ops

    def bprop(x, key, site, out, dout):
        return ops.zeros_like(x), ops.zeros_like(key), ops.zeros_like(site)

    return custom("DropoutKeep", lambda x, key, site: x, lambda x, key, site: ms.bool_, bprop)


_BUILDERS = {"gelu_tanh": _gelu_tanh, "layer_norm": _layer_norm, "sum_squares": _sum_squares,
             "sum_squares_all": _sum_squares_all, "scale_all": _scale_all,
             "causal_softmax": _causal_softmax, "softmax_cross_entropy": _softmax_cross_entropy,
             "softmax_cross_entropy_loss": _softmax_cross_entropy_loss, "heads_split": _heads_split,
             "swap_middle_axes": _swap_middle_axes, "gelu_tanh_grad": _gelu_tanh_grad,
             "causal_softmax_grad": _causal_softmax_grad, "decode_attention": _decode_attention,
             "decode_rope": _decode_rope, "rms_norm": _rms_norm, "dropout_keep": _dropout_keep}
