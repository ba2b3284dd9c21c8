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

// The sum of squares of every element: a 1-element float32 output.
extern "C" int SumSquares(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const float *x = static_cast<const float *>(params[0]);
  float *out = static_cast<float *>(params[1]);
  const int64_t n = numel(ndims[0], shapes[0]);
  double total = 0.0;
  const int64_t block = 4096;  // float partial sums per block, double across blocks: accurate and vectorised
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = start + block < n ? start + block : n;
    float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
    for (int64_t i = start; i < end; i++) partial += x[i] * x[i];
    total += partial;
  }
  out[0] = static_cast<float>(total);
  return 0;
}
