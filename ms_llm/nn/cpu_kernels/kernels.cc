// Fused float32 CPU kernels for ms_llm, called through mindspore.ops.Custom(func_type="aot").
//
// Each replaces a chain of MindSpore element-wise/reduction kernels with one pass over memory; on a
// 2-core CPU the per-kernel launch cost of those chains is a large part of a small model's step.
// Compiled at first use with -O3 -march=native -ffast-math, so loops vectorise with the host's widest
// SIMD (AVX-512 where present) and expf maps to glibc's vector implementation.
//
// Signature required by MindSpore: int f(int nparam, void **params, int *ndims, int64_t **shapes,
// const char **dtypes, void *stream, void *extra); params holds the inputs, then the outputs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

constexpr float kGeluK = 2.0f * 0.7978845608028654f;  // 2 * sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u): one expf instead of tanh. u is clamped so that expf
// stays finite under -ffast-math (sigmoid is already 0 or 1 to float precision at |2u| = 40).
inline float sigmoid_2u(float x) {
  float u2 = kGeluK * (x + kGeluC * x * x * x);
  u2 = fminf(fmaxf(u2, -40.0f), 40.0f);
  return 1.0f / (1.0f + expf(-u2));
}

// Mean and 1/sqrt(variance + eps) of one row: two passes (mean first) for float32 accuracy.
inline void row_moments(const float *xr, int64_t cols, float eps, float *mean_out, float *rstd_out) {
  const float inv_c = 1.0f / static_cast<float>(cols);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < cols; c++) sum += xr[c];
  const float mean = sum * inv_c;
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int64_t c = 0; c < cols; c++) sq += (xr[c] - mean) * (xr[c] - mean);
  *mean_out = mean;
  *rstd_out = 1.0f / sqrtf(sq * inv_c + eps);
}

}  // namespace

// y = gelu_tanh(x)
extern "C" int GeluTanhFwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const int64_t n = numel(ndims[0], shapes[0]);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoid_2u(x[i]);
  return 0;
}

// dx = dy * d/dx gelu_tanh(x)
extern "C" int GeluTanhBwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  const int64_t n = numel(ndims[0], shapes[0]);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float v = x[i];
    const float s = sigmoid_2u(v);
    const float du2 = kGeluK * (1.0f + 3.0f * kGeluC * v * v);
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * du2);
  }
  return 0;
}

// y = (x - mean) / sqrt(var + eps) * w + b over the last axis of a 2-D (rows, cols) input.
// Inputs: x, w, b, eps (a 1-element float32 tensor). Output: y.
extern "C" int LayerNormFwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float *b = static_cast<const float *>(params[2]);
  const float eps = *static_cast<const float *>(params[3]);
  float *y = static_cast<float *>(params[4]);
  const int64_t cols = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / cols;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float mean, rstd;
    row_moments(xr, cols, eps, &mean, &rstd);
#pragma omp simd
    for (int64_t c = 0; c < cols; c++) yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
  }
  return 0;
}

// Gradients of LayerNormFwd. Inputs: x, w, eps, dy. Outputs: dx, dw, db.
//   xhat = (x - mean) * rstd,  g = dy * w
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows(dy * xhat),  db = sum_rows(dy)
extern "C" int LayerNormBwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  const float *dy = static_cast<const float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  float *dw = static_cast<float *>(params[5]);
  float *db = static_cast<float *>(params[6]);
  const int64_t cols = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / cols;
  const float inv_c = 1.0f / static_cast<float>(cols);
  std::memset(dw, 0, cols * sizeof(float));
  std::memset(db, 0, cols * sizeof(float));
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    const float *dyr = dy + r * cols;
    float *dxr = dx + r * cols;
    float mean, rstd;
    row_moments(xr, cols, eps, &mean, &rstd);
    float g_mean = 0.0f, gx_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gx_mean)
    for (int64_t c = 0; c < cols; c++) {
      const float xhat = (xr[c] - mean) * rstd;
      const float g = dyr[c] * w[c];
      g_mean += g;
      gx_mean += g * xhat;
      dw[c] += dyr[c] * xhat;
      db[c] += dyr[c];
    }
    g_mean *= inv_c;
    gx_mean *= inv_c;
#pragma omp simd
    for (int64_t c = 0; c < cols; c++) {
      const float xhat = (xr[c] - mean) * rstd;
      dxr[c] = rstd * (dyr[c] * w[c] - g_mean - xhat * gx_mean);
    }
  }
  return 0;
}

// The sum of squares of n floats. Not inlined: SumSquares and SumSquaresAll run the same machine code, so that
// their sums are bit for bit the same.
__attribute__((noinline)) float sum_squares(const float *x, int64_t n) {
  double total = 0.0;
  const int64_t block = 4096;  // float partial sums per block, double across blocks: accurate and vectorised
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = start + block < n ? start + block : n;
    float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
    for (int64_t i = start; i < end; i++) partial += x[i] * x[i];
    total += partial;
  }
  return static_cast<float>(total);
}

// The sum of squares of every element: a 1-element float32 output.
extern "C" int SumSquares(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  static_cast<float *>(params[1])[0] = sum_squares(static_cast<const float *>(params[0]), numel(ndims[0], shapes[0]));
  return 0;
}

// The sum of squares of every element of every input (the gradients of a step): one kernel in place of a
// SumSquares per input and the AddN of their results, and bit for bit their value: each input's sum as SumSquares
// computes it, then added in float32 in input order as MindSpore's AddN adds (the first two, then each next one
// to the running sum). `volatile` keeps -ffast-math from reordering those additions. Output: 1 float32.
extern "C" int SumSquaresAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const int inputs = nparam - 1;
  volatile float total = sum_squares(static_cast<const float *>(params[0]), numel(ndims[0], shapes[0]));
  for (int k = 1; k < inputs; k++) {
    const float next = sum_squares(static_cast<const float *>(params[k]), numel(ndims[k], shapes[k]));
    total = total + next;
  }
  static_cast<float *>(params[inputs])[0] = total;
  return 0;
}

// Every input times one factor: the unscaling and clipping of a step's gradients in one kernel in place of a Mul per
// gradient. One float32 multiply per element, as Mul computes it. Inputs: x_1, ..., x_n, factor (1 float32).
// Outputs: x_1 * factor, ..., x_n * factor.
extern "C" int ScaleAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const int inputs = (nparam - 1) / 2;
  const float factor = *static_cast<const float *>(params[inputs]);
  for (int k = 0; k < inputs; k++) {
    const float *x = static_cast<const float *>(params[k]);
    float *y = static_cast<float *>(params[inputs + 1 + k]);
    const int64_t n = numel(ndims[k], shapes[k]);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * factor;
  }
  return 0;
}

// Causal softmax over the last axis of (..., T, T) float32 attention scores: row i of each T x T block
// attends to columns j <= i; the masked columns get exactly 0 (as softmax(scores + -1e9 mask) gives in
// float32). One pass in place of the mask add, Softmax, and their three score-sized temporaries.
extern "C" int CausalSoftmaxFwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const int64_t t = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / t;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t valid = r % t + 1;  // query position i attends to keys 0..i
    const float *xr = x + r * t;
    float *yr = y + r * t;
    float mx = xr[0];
    for (int64_t c = 1; c < valid; c++) mx = fmaxf(mx, xr[c]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < valid; c++) {
      yr[c] = expf(xr[c] - mx);
      sum += yr[c];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t c = 0; c < valid; c++) yr[c] *= inv;
    for (int64_t c = valid; c < t; c++) yr[c] = 0.0f;
  }
  return 0;
}

// Gradient of CausalSoftmaxFwd. Inputs: y (its output), dy. Output: dx = y * (dy - sum(dy * y)) per row.
extern "C" int CausalSoftmaxBwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *y = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  const int64_t t = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / t;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t valid = r % t + 1;
    const float *yr = y + r * t;
    const float *dyr = dy + r * t;
    float *dxr = dx + r * t;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < valid; c++) dot += yr[c] * dyr[c];
#pragma omp simd
    for (int64_t c = 0; c < valid; c++) dxr[c] = yr[c] * (dyr[c] - dot);
    for (int64_t c = valid; c < t; c++) dxr[c] = 0.0f;
  }
  return 0;
}

// Cross-entropy of a chunk of float32 logits (rows, vocab) and its gradient, in one pass per row:
//   lse = log(sum(exp(x))),  ce = lse - x[target],  dx = coef * (softmax(x) - onehot(target)).
// Inputs: logits, targets (int32, rows), coef (float32, rows: the loss's weight of each row's ce).
// Outputs: ce (float32, rows), dx (float32, rows x vocab). The exp is stored in dx and scaled there, so
// besides the logits only the gradient's own buffer is used.
extern "C" int SoftmaxCrossEntropy(int, void **params, int *ndims, int64_t **shapes, const char **, void *,
                                   void *) {
  const float *x = static_cast<const float *>(params[0]);
  const int32_t *target = static_cast<const int32_t *>(params[1]);
  const float *coef = static_cast<const float *>(params[2]);
  float *ce = static_cast<float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  const int64_t vocab = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / vocab;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * vocab;
    float *dr = dx + r * vocab;
    float mx = xr[0];
#pragma omp simd reduction(max : mx)
    for (int64_t c = 1; c < vocab; c++) mx = fmaxf(mx, xr[c]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < vocab; c++) {
      dr[c] = expf(xr[c] - mx);
      sum += dr[c];
    }
    const int64_t t = target[r];
    ce[r] = logf(sum) + mx - xr[t];
    const float scale = coef[r] / sum;
#pragma omp simd
    for (int64_t c = 0; c < vocab; c++) dr[c] *= scale;
    dr[t] -= coef[r];
  }
  return 0;
}

// Forward only: the cross-entropy of each row (evaluation). Inputs: logits, targets. Output: ce.
extern "C" int SoftmaxCrossEntropyLoss(int, void **params, int *ndims, int64_t **shapes, const char **, void *,
                                       void *) {
  const float *x = static_cast<const float *>(params[0]);
  const int32_t *target = static_cast<const int32_t *>(params[1]);
  float *ce = static_cast<float *>(params[2]);
  const int64_t vocab = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / vocab;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * vocab;
    float mx = xr[0];
#pragma omp simd reduction(max : mx)
    for (int64_t c = 1; c < vocab; c++) mx = fmaxf(mx, xr[c]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < vocab; c++) sum += expf(xr[c] - mx);
    ce[r] = logf(sum) + mx - xr[target[r]];
  }
  return 0;
}

// Attention's head layout without MindSpore's Transpose kernel, which on CPU builds an int64 index table
// twice the size of its input when the graph is compiled and keeps it (docs/performance.md, memory).
//
// HeadsSplit: the fused projection (B, T, H + 2 KV, D) → q (B, H, T, D), k (B, KV, T, D), v (B, KV, T, D).
extern "C" int HeadsSplit(int, void **params, int *, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  float *out[3] = {static_cast<float *>(params[1]), static_cast<float *>(params[2]), static_cast<float *>(params[3])};
  const int64_t b = shapes[0][0], t = shapes[0][1], g = shapes[0][2], d = shapes[0][3];
  const int64_t heads[3] = {shapes[1][1], shapes[2][1], shapes[3][1]};
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t ti = 0; ti < t; ti++) {
      const float *row = x + (bi * t + ti) * g * d;
      for (int part = 0, first = 0; part < 3; first += heads[part], part++)
        for (int64_t h = 0; h < heads[part]; h++)
          std::memcpy(out[part] + ((bi * heads[part] + h) * t + ti) * d, row + (first + h) * d, d * sizeof(float));
    }
  return 0;
}

// Gradient of HeadsSplit: (dq, dk, dv) → (B, T, H + 2 KV, D).
extern "C" int HeadsSplitBwd(int, void **params, int *, int64_t **shapes, const char **, void *, void *) {
  const float *in[3] = {static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
                        static_cast<const float *>(params[2])};
  float *x = static_cast<float *>(params[3]);
  const int64_t b = shapes[3][0], t = shapes[3][1], g = shapes[3][2], d = shapes[3][3];
  const int64_t heads[3] = {shapes[0][1], shapes[1][1], shapes[2][1]};
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t ti = 0; ti < t; ti++) {
      float *row = x + (bi * t + ti) * g * d;
      for (int part = 0, first = 0; part < 3; first += heads[part], part++)
        for (int64_t h = 0; h < heads[part]; h++)
          std::memcpy(row + (first + h) * d, in[part] + ((bi * heads[part] + h) * t + ti) * d, d * sizeof(float));
    }
  return 0;
}

// (B, X, Y, D) → (B, Y, X, D): heads back to positions ((B, H, T, D) → (B, T, H, D)) and, as its own
// gradient, the reverse.
extern "C" int SwapMiddleAxes(int, void **params, int *, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const int64_t b = shapes[0][0], m = shapes[0][1], n = shapes[0][2], d = shapes[0][3];
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++)
        std::memcpy(y + ((bi * n + j) * m + i) * d, x + ((bi * m + i) * n + j) * d, d * sizeof(float));
  return 0;
}

// One decode step's attention against a KV cache, writing the cache in place. MindSpore's ScatterNdUpdate
// copies the whole cache to its output on every call (at batch 8 that copy cost as much as the attention), and
// its BatchMatMul reads the whole cache where only positions 0..pos hold keys.
//
// Inputs: q (B, H, 1, D) float32; the new key and value k, v (B, KV, 1, D); the key and value caches (B, KV, S, D),
// written at position pos[b] of row b; pos (B,) int32; window (1,) int32, 0 for none; scale (1,) float32.
// Output: y (B, H, 1, D): for each query head, softmax((q·scale)·k_t) over t = lo..pos[b] (lo = pos - window + 1
// with a sliding window, else 0), then Σ p_t v_t, the softmax's masked entries being exactly 0 as in
// softmax(scores + -1e9 mask). Query heads h = j·G..j·G+G-1 share key/value head j (grouped-query attention).
extern "C" int DecodeAttention(int, void **params, int *, int64_t **shapes, const char **, void *, void *) {
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  float *key_cache = static_cast<float *>(params[3]);
  float *value_cache = static_cast<float *>(params[4]);
  const int32_t *pos = static_cast<const int32_t *>(params[5]);
  const int32_t window = *static_cast<const int32_t *>(params[6]);
  const float scale = *static_cast<const float *>(params[7]);
  float *y = static_cast<float *>(params[8]);
  const int64_t b = shapes[0][0], h = shapes[0][1], d = shapes[0][3], kv = shapes[1][1], s = shapes[3][2];
  const int64_t groups = h / kv;
  static thread_local std::vector<float> scratch;  // one scaled query head, then one row of probabilities
  scratch.resize(d + s);
  float *qs = scratch.data(), *p = scratch.data() + d;
  for (int64_t bi = 0; bi < b; bi++) {
    const int64_t at = pos[bi];
    if (at < 0 || at >= s) return 1;
    const int64_t lo = window > 0 && at - window + 1 > 0 ? at - window + 1 : 0;
    for (int64_t j = 0; j < kv; j++) {
      float *kc = key_cache + (bi * kv + j) * s * d;
      float *vc = value_cache + (bi * kv + j) * s * d;
      std::memcpy(kc + at * d, k + (bi * kv + j) * d, d * sizeof(float));
      std::memcpy(vc + at * d, v + (bi * kv + j) * d, d * sizeof(float));
      for (int64_t g = 0; g < groups; g++) {
        const int64_t head = bi * h + j * groups + g;
#pragma omp simd
        for (int64_t c = 0; c < d; c++) qs[c] = q[head * d + c] * scale;
        float mx = -INFINITY;
        for (int64_t t = lo; t <= at; t++) {
          const float *kt = kc + t * d;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d; c++) dot += qs[c] * kt[c];
          p[t] = dot;
          mx = fmaxf(mx, dot);
        }
        float sum = 0.0f;
        for (int64_t t = lo; t <= at; t++) {
          p[t] = expf(p[t] - mx);
          sum += p[t];
        }
        const float inv = 1.0f / sum;
        float *yh = y + head * d;
        std::memset(yh, 0, d * sizeof(float));
        for (int64_t t = lo; t <= at; t++) {
          const float w = p[t] * inv;
          const float *vt = vc + t * d;
#pragma omp simd
          for (int64_t c = 0; c < d; c++) yh[c] += w * vt[c];
        }
      }
    }
  }
  return 0;
}

// Rotary positions for one decode step, queries and keys in one kernel (MindSpore's composition is 16 kernels per
// layer: slices, negations, concatenations, multiplies, adds). Inputs: q (B, H, 1, D), k (B, KV, 1, D), the tables
// cos and sin (S, D), pos (B,) int32. Outputs: q and k rotated by row b's position pos[b], the two halves of each
// head rotated (Hugging Face's layout): x * cos + concat(-x[D/2:], x[:D/2]) * sin.
extern "C" int DecodeRope(int, void **params, int *, int64_t **shapes, const char **, void *, void *) {
  const float *in[2] = {static_cast<const float *>(params[0]), static_cast<const float *>(params[1])};
  const float *cos_t = static_cast<const float *>(params[2]);
  const float *sin_t = static_cast<const float *>(params[3]);
  const int32_t *pos = static_cast<const int32_t *>(params[4]);
  float *out[2] = {static_cast<float *>(params[5]), static_cast<float *>(params[6])};
  const int64_t b = shapes[0][0], d = shapes[0][3], half = d / 2, s = shapes[2][0];
  const int64_t heads[2] = {shapes[0][1], shapes[1][1]};
  for (int64_t bi = 0; bi < b; bi++) {
    if (pos[bi] < 0 || pos[bi] >= s) return 1;
    const float *c = cos_t + pos[bi] * d, *sn = sin_t + pos[bi] * d;
    for (int part = 0; part < 2; part++)
      for (int64_t h = 0; h < heads[part]; h++) {
        const float *x = in[part] + (bi * heads[part] + h) * d;
        float *y = out[part] + (bi * heads[part] + h) * d;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
          y[i] = x[i] * c[i] - x[i + half] * sn[i];
          y[i + half] = x[i + half] * c[i + half] + x[i] * sn[i + half];
        }
      }
  }
  return 0;
}

// RMSNorm of the rows of a 2-D (rows, cols) input: x / sqrt(mean(x^2) + eps) * w, one kernel in place of MindSpore's
// six. Inputs: x, w (cols,), eps (1 float32). Output: y.
extern "C" int RmsNormFwd(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  const int64_t cols = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / cols;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < cols; c++) sq += xr[c] * xr[c];
    const float rstd = 1.0f / sqrtf(sq / static_cast<float>(cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; c++) yr[c] = xr[c] * rstd * w[c];
  }
  return 0;
}

namespace {

// The stateless dropout's hash (ms_llm/nn/dropout.py): Mueller's hash32 finaliser on 31-bit values in int64. Every
// value is non-negative, so the composition's floor division by 65536 is a shift.
constexpr int64_t kM31 = (int64_t(1) << 31) - 1;
constexpr int64_t kHashMul = 0x45D9F3B;
constexpr int64_t kKeepBits = int64_t(1) << 24;

inline int64_t mix31(int64_t x) {
  x = ((x ^ (x >> 16)) * kHashMul) & kM31;
  x = ((x ^ (x >> 16)) * kHashMul) & kM31;
  return x ^ (x >> 16);
}

}  // namespace

// The keep mask of one dropout site, equal bit for bit to dropout.keep_mask's composition of some fifty MindSpore
// ops. Inputs: x (its shape alone is read: rows on the first axis), key (5 int32: seed, step, micro-batch, rank,
// data-parallel size), site and threshold (2 int32: the site's number, round(p · 2^24)). Output: keep (bool, x's
// shape).
extern "C" int DropoutKeep(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const int32_t *key = static_cast<const int32_t *>(params[1]);
  const int32_t *site = static_cast<const int32_t *>(params[2]);
  bool *keep = static_cast<bool *>(params[3]);
  const int64_t n = numel(ndims[0], shapes[0]);
  const int64_t rows = ndims[0] > 0 ? shapes[0][0] : 1;
  if (rows == 0) return 0;
  const int64_t width = n / rows;
  const int64_t k0 = key[0], k1 = key[1], k2 = key[2], k3 = key[3], k4 = key[4];
  const int64_t site_key = mix31(mix31((k0 * 1000003 + site[0]) & kM31) ^ k1);
  const int64_t threshold = site[1];
  for (int64_t r = 0; r < rows; r++) {
    const int64_t sample = (k2 * rows + r) * k4 + k3;
    const int64_t row_key = mix31(site_key ^ mix31(sample & kM31));
    bool *kr = keep + r * width;
    for (int64_t e = 0; e < width; e++) kr[e] = (mix31(row_key ^ e) & (kKeepBits - 1)) >= threshold;
  }
  return 0;
}
