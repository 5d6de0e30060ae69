// The product of a few float32 rows with a weight laid out in blocks of eight output features (native.py builds
// it, kernels.py measures it beside torch's products). A block holds, for each input feature in turn, the eight
// features' weights side by side, so each thread reads its blocks as one sequential stream and keeps the rows'
// eight partial sums per block in registers: one pass over the weight, whatever the row count.

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>

namespace {

constexpr int64_t LANES = 8;      // output features per block: one AVX register of float32
constexpr int64_t MAX_CHUNK = 4;  // rows summed together per sweep over a block (a wider pass sweeps it again)
constexpr int64_t GRAIN = 16;     // blocks per thread at least: a small weight is not split finer than this

// The rows' sums for one block: out[r * stride + j] = bias[j] + sum over c of x[r * k + c] * block[c * LANES + j].
template <int R>
void chunk(const float* x, int64_t k, const float* block, const float* bias, float* out, int64_t stride) {
  __m256 sums[R];
  for (int r = 0; r < R; ++r) sums[r] = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  for (int64_t c = 0; c < k; ++c) {
    const __m256 w = _mm256_loadu_ps(block + LANES * c);
    for (int r = 0; r < R; ++r) sums[r] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(x + r * k + c), sums[r]);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * stride, sums[r]);
}

using Chunk = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t);
const Chunk CHUNKS[MAX_CHUNK] = {chunk<1>, chunk<2>, chunk<3>, chunk<4>};

}  // namespace

// x (rows, k) times a blocked weight (blocks, k, LANES) whose first `features` features are the weight's, plus an
// optional bias of `features` values: (rows, features).
torch::Tensor product(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                      int64_t features) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "blocked product: x must be 2-D float32");
  TORCH_CHECK(weight.dim() == 3 && weight.size(2) == LANES && weight.scalar_type() == torch::kFloat &&
                  weight.is_contiguous() && weight.size(1) == x.size(1),
              "blocked product: the weight must be (blocks, x's width, 8) float32, contiguous");
  const int64_t blocks = weight.size(0), k = weight.size(1), rows = x.size(0);
  TORCH_CHECK(features > (blocks - 1) * LANES && features <= blocks * LANES, "blocked product: bad feature count");
  TORCH_CHECK(!bias || !bias->defined() || (bias->is_contiguous() && bias->numel() == features &&
                                            bias->scalar_type() == torch::kFloat),
              "blocked product: the bias must be float32, one per feature");
  const torch::Tensor xs = x.contiguous();
  torch::Tensor out = torch::empty({rows, features}, x.options());
  const float* xp = xs.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias && bias->defined() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, blocks, GRAIN, [&](int64_t first, int64_t last) {
    float partial[MAX_CHUNK * LANES];  // the last block's sums when it holds fewer than LANES features
    float partial_bias[LANES] = {};   // and its bias, padded
    for (int64_t b = first; b < last; ++b) {
      const int64_t width = std::min(LANES, features - b * LANES);
      const float* bias_b = bp ? bp + b * LANES : nullptr;
      if (bp && width < LANES) {
        std::memcpy(partial_bias, bias_b, width * sizeof(float));
        bias_b = partial_bias;
      }
      for (int64_t r = 0; r < rows; r += MAX_CHUNK) {
        const int64_t n = std::min(MAX_CHUNK, rows - r);
        if (width == LANES) {
          CHUNKS[n - 1](xp + r * k, k, wp + b * k * LANES, bias_b, op + r * features + b * LANES, features);
        } else {
          CHUNKS[n - 1](xp + r * k, k, wp + b * k * LANES, bias_b, partial, LANES);
          for (int64_t i = 0; i < n; ++i)
            std::memcpy(op + (r + i) * features + b * LANES, partial + i * LANES, width * sizeof(float));
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("product", &product, pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"),
        pybind11::arg("features"));
}
