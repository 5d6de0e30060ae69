// The engine's native code (native.py builds it).
//
// `product`: a few float32 rows times a weight laid out in blocks of eight output features (kernels.py measures it
// beside torch's products). A block holds, for each input feature in turn, the eight features' weights side by
// side, so each block is one sequential stream; a thread sweeps a few neighbouring blocks side by side, keeping the
// rows' eight partial sums per block in registers: one pass over the weight for up to eight rows; a wider pass
// sweeps each few blocks for all its rows while they are in cache.
//
// The compact forward's steps between a layer's products (compact_llama.py): the same ATen operators in the same
// order as its Python did them, so the same floats, called from here to spare the interpreter's ~40 calls a layer.

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

namespace {

constexpr int64_t LANES = 8;      // output features per block: one AVX register of float32
constexpr int64_t MAX_CHUNK = 8;  // rows of one sweep over the weight (a wider pass takes the wide path below)
constexpr int64_t GRAIN = 16;     // blocks per thread at least: a small weight is not split finer than this

// The rows' sums for B neighbouring blocks at once: out[r * stride + 8b + j] = bias[8b + j] + sum over c of
// x[r * k + c] * block[b * k * LANES + c * LANES + j]. Each row's broadcast serves the B blocks, and the B blocks are
// B streams read side by side: on SmolLM2's weights, 2 threads, 6 streams a thread made a one-row product ~0.9x and a
// five-row product ~0.7-0.9x the time of 2 (the memory system serves several streams at once better than one or
// two; software prefetching on top made it slower). Per output, the sum runs over c in order whatever the rows, the
// blocks and the parts are, so a row's floats do not depend on the rows beside it or on how the work is grouped.
//
// The rows run in `Parts` (sizes, in order): with one part all R x B sums stay in registers for the whole sweep;
// with several, the inputs go by in spans of INPUT_SPAN, and per span each part's sums come from `acc`, take the
// span's inputs (their weights read from memory by the first part and from the first-level cache by the others) and
// go back. Rows beyond what the registers hold would otherwise spill sums at every input; parts keep them in
// registers there and move them once a span.
constexpr int64_t INPUT_SPAN = 32;  // inputs per span when the rows run in parts (16-64 measured alike)

template <int B, int R0, int N>
inline void sweep_part(const float* x, int64_t k, const float* block, int64_t c0, int64_t c1, __m256 (*acc)[B]) {
  __m256 sums[B][N];
#pragma GCC unroll 8
  for (int b = 0; b < B; ++b) {
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) sums[b][r] = acc[R0 + r][b];
  }
  for (int64_t c = c0; c < c1; ++c) {
    __m256 w[B];
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) w[b] = _mm256_loadu_ps(block + b * k * LANES + c * LANES);
#pragma GCC unroll 8  // the sums stay in registers (as far as they fit) only when these loops are unrolled
    for (int r = 0; r < N; ++r) {
      const __m256 xr = _mm256_broadcast_ss(x + (R0 + r) * k + c);
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) sums[b][r] = _mm256_fmadd_ps(w[b], xr, sums[b][r]);
    }
  }
#pragma GCC unroll 8
  for (int b = 0; b < B; ++b) {
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) acc[R0 + r][b] = sums[b][r];
  }
}

template <int B, int R0, int N, int... Rest>
inline void sweep_parts(const float* x, int64_t k, const float* block, int64_t c0, int64_t c1, __m256 (*acc)[B]) {
  sweep_part<B, R0, N>(x, k, block, c0, c1, acc);
  if constexpr (sizeof...(Rest) > 0) sweep_parts<B, R0 + N, Rest...>(x, k, block, c0, c1, acc);
}

template <int B, int... Parts>
void sweep(const float* x, int64_t k, const float* block, const float* bias, float* out, int64_t stride) {
  constexpr int R = (Parts + ...);
  __m256 acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) acc[r][b] = bias ? _mm256_loadu_ps(bias + b * LANES) : _mm256_setzero_ps();
  }
  const int64_t span = sizeof...(Parts) == 1 ? k : INPUT_SPAN;
  for (int64_t c0 = 0; c0 < k; c0 += span) sweep_parts<B, 0, Parts...>(x, k, block, c0, std::min(k, c0 + span), acc);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) _mm256_storeu_ps(out + r * stride + b * LANES, acc[r][b]);
  }
}

using Sweep = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t);
struct Stream {
  int64_t blocks;  // blocks swept side by side
  Sweep swept;
};
template <int B, int... Parts>
constexpr Stream stream() {
  return {B, sweep<B, Parts...>};
}

// Blocks and parts per sweep, by rows, for the vector registers of the build (a part's N x B sums, the blocks'
// weights and a broadcast compete for them), measured on SmolLM2's weights, 2 threads. With AVX-512's 32 registers
// (native.py builds with them where the CPU has them): 6 blocks up to 6 rows, 4 at 7-8 (their 42-48 sums spill too
// much; 5 blocks at 5 rows or 3 at 8 were slower: fewer streams), the rows in one part. With AVX2's 16, on a Zen 3
// EPYC: 6 blocks at 1-5 rows and 4 at 6-8, a part at most 3 rows (6 x 2 or 4 x 3 sums). Against every row in one
// part (of 6 blocks at 1-3 rows, 4 at 4-5, 3 at 6-7, 2 at 8: the best grouping then), bench/native_ab.py, SmolLM2's
// products: 0.96-0.98x the time at 3 rows, 0.90-0.95x at 4, 0.88-0.89x at 5, 0.88-0.91x at 6, 0.83-0.89x at 7 and
// 0.82x at 8 (docs/performance.md).
#ifdef __AVX512F__
constexpr Stream STREAMS[MAX_CHUNK] = {stream<6, 1>(), stream<6, 2>(), stream<6, 3>(), stream<6, 4>(),
                                       stream<6, 5>(), stream<6, 6>(), stream<4, 7>(), stream<4, 8>()};
#else
constexpr Stream STREAMS[MAX_CHUNK] = {stream<6, 1>(),       stream<6, 2>(),       stream<6, 2, 1>(),
                                       stream<6, 2, 2>(),    stream<6, 2, 2, 1>(), stream<4, 3, 3>(),
                                       stream<4, 3, 3, 1>(), stream<4, 3, 3, 2>()};
#endif
// A pass of more than MAX_CHUNK rows is bound by the multiply-adds, not by the weight's stream: each thread takes
// WIDE_GROUP blocks at a time and sweeps them for every WIDE_CHUNK rows in turn while they sit in its core's caches
// (two blocks of 576 inputs are 36 KiB), so the weight comes from memory once per pass; 6 rows x 2 blocks are 12
// sums in registers, with the two blocks' weights and a broadcast 15 of AVX2's 16.
constexpr int WIDE_CHUNK = 6, WIDE_GROUP = 2;
// A prompt's pass of thousands of rows runs in panels of PANEL rows, each over the whole weight: 768 rows of 576
// inputs are 1.7 MiB, which stay in the shared cache while every group sweeps them (against all rows in one: 0.93x
// the time at 1,000 rows and 0.89x at 4,000 on SmolLM2's layers, 2 threads; panels of 96 rows: 1.05-1.10x at
// 200-1,000).
constexpr int64_t PANEL = 768;
// The sweeps of 1..N rows in one part over `Group` blocks each (a group of 1: a group cut short, one block at a time).
template <int Group, int N, int... R>
constexpr std::array<Sweep, N> sweeps(std::integer_sequence<int, R...>) {
  return {sweep<Group, R + 1>...};
}
constexpr auto WIDE_SWEEPS = sweeps<WIDE_GROUP, WIDE_CHUNK>(std::make_integer_sequence<int, WIDE_CHUNK>{});
constexpr auto SWEEPS = sweeps<1, MAX_CHUNK>(std::make_integer_sequence<int, MAX_CHUNK>{});

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
  const int64_t full = features / LANES;  // blocks with all eight features the weight's
  // `group` blocks from b0, for n rows from r: `swept` sweeps them together where all are whole; else (the weight's
  // last blocks) one block at a time, the last one's sums through `partial` when it holds fewer than LANES features.
  const auto sweep_group = [&](Sweep swept, int64_t b0, int64_t group, int64_t r, int64_t n, float* partial) {
    const float* xr = xp + r * k;
    float* out_r = op + r * features;
    if (b0 + group <= full) {
      swept(xr, k, wp + b0 * k * LANES, bp ? bp + b0 * LANES : nullptr, out_r + b0 * LANES, features);
      return;
    }
    for (int64_t b = b0; b < std::min(blocks, b0 + group); ++b) {
      const float* block = wp + b * k * LANES;
      const float* bias_b = bp ? bp + b * LANES : nullptr;
      if (b < full) {
        SWEEPS[n - 1](xr, k, block, bias_b, out_r + b * LANES, features);
        continue;
      }
      const int64_t width = features - b * LANES;
      float partial_bias[LANES] = {};
      if (bias_b) {
        std::memcpy(partial_bias, bias_b, width * sizeof(float));
        bias_b = partial_bias;
      }
      SWEEPS[n - 1](xr, k, block, bias_b, partial, LANES);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(out_r + i * features + b * LANES, partial + i * LANES, width * sizeof(float));
    }
  };
  if (rows == 0) return out;
  if (rows <= MAX_CHUNK) {  // one sweep over the weight, STREAMS[rows - 1].blocks streams side by side
    const Stream& stream = STREAMS[rows - 1];
    const int64_t group = stream.blocks;
    at::parallel_for(0, (blocks + group - 1) / group, std::max<int64_t>(1, GRAIN / group), [&](int64_t first,
                                                                                                int64_t last) {
      float partial[MAX_CHUNK * LANES];
      for (int64_t g = first; g < last; ++g) sweep_group(stream.swept, g * group, group, 0, rows, partial);
    });
    return out;
  }
  // Wider: each group of WIDE_GROUP blocks for all the rows of a panel, WIDE_CHUNK at a time, while it is in cache.
  for (int64_t r0 = 0; r0 < rows; r0 += PANEL) {
    const int64_t r1 = std::min(rows, r0 + PANEL);
    at::parallel_for(0, (blocks + WIDE_GROUP - 1) / WIDE_GROUP, std::max<int64_t>(1, GRAIN / WIDE_GROUP),
                     [&](int64_t first, int64_t last) {
      float partial[MAX_CHUNK * LANES];
      for (int64_t g = first; g < last; ++g)
        for (int64_t r = r0; r < r1; r += WIDE_CHUNK) {
          const int64_t n = std::min<int64_t>(WIDE_CHUNK, r1 - r);
          sweep_group(WIDE_SWEEPS[n - 1], g * WIDE_GROUP, WIDE_GROUP, r, n, partial);
        }
    });
  }
  return out;
}

// The fused q|k|v product (batch, rows, (heads + 2 kv_heads) * dim) as query (batch, heads, rows, dim) and key and
// value (batch, kv_heads, rows, dim), RoPE applied to query and key: x·cos + roll(x, dim / 2)·sin, where sin's first
// half is negated (compact_llama.Rope). float32 heads of a multiple of 16 by our loop: each product rounded, then
// their sum, as ATen's mul, mul and add round them: the same floats. Anything else by those operators.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attention_in(const torch::Tensor& qkv, const torch::Tensor& cos,
                                                                     const torch::Tensor& sin, int64_t heads,
                                                                     int64_t kv_heads, int64_t dim) {
  const int64_t batch = qkv.size(0), rows = qkv.size(1), turned = heads + kv_heads;
  auto value = qkv.narrow(-1, turned * dim, kv_heads * dim).view({batch, rows, kv_heads, dim}).transpose(1, 2);
  const auto table = [&](const torch::Tensor& t) {
    return t.scalar_type() == torch::kFloat && t.dim() == 4 && (t.size(0) == batch || t.size(0) == 1) &&
           t.size(1) == 1 && t.size(2) == rows && t.size(3) == dim && t.stride(3) == 1;
  };
  if (qkv.scalar_type() != torch::kFloat || qkv.stride(2) != 1 || dim % 16 != 0 || !table(cos) || !table(sin)) {
    auto qk = qkv.narrow(-1, 0, turned * dim).view({batch, rows, turned, dim}).transpose(1, 2);
    qk = qk * cos + qk.roll(dim / 2, -1) * sin;
    return {qk.narrow(1, 0, heads), qk.narrow(1, heads, kv_heads), value};
  }
  auto qk = torch::empty({batch, rows, turned, dim}, qkv.options());
  const float* xp = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = qk.data_ptr<float>();
  const int64_t half = dim / 2, cos_b = cos.size(0) == 1 ? 0 : cos.stride(0), sin_b = sin.size(0) == 1 ? 0 : sin.stride(0);
  at::parallel_for(0, batch * rows, std::max<int64_t>(1, 16384 / (turned * dim)), [&](int64_t first, int64_t last) {
    for (int64_t bt = first; bt < last; ++bt) {
      const int64_t b = bt / rows, t = bt % rows;
      const float* x = xp + b * qkv.stride(0) + t * qkv.stride(1);
      const float* c = cp + b * cos_b + t * cos.stride(2);
      const float* s = sp + b * sin_b + t * sin.stride(2);
      float* o = op + bt * turned * dim;
      for (int64_t h = 0; h < turned; ++h, x += dim, o += dim)
        for (int64_t d = 0; d < dim; d += 8) {
          __m256 straight = _mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(c + d));
          __m256 rolled = _mm256_mul_ps(_mm256_loadu_ps(x + (d < half ? d + half : d - half)), _mm256_loadu_ps(s + d));
          asm("" : "+x"(straight), "+x"(rolled));  // each product rounded on its own: no fused multiply-add
          _mm256_storeu_ps(o + d, _mm256_add_ps(straight, rolled));
        }
    }
  });
  const auto split = qk.transpose(1, 2);
  return {split.narrow(1, 0, heads), split.narrow(1, heads, kv_heads), value};
}

namespace {

// e^x for eight floats, x <= 0 (a softmax's shifted scores): 2^n · e^r with n = round(x · log2 e) and
// r = x - n · ln 2 in two parts (Cody and Waite), e^r by Cephes' degree-7 polynomial; relative error ~2e-7.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // below, e^x is under float's smallest normal: taken as ~0
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

inline float sum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

constexpr int64_t QUERIES = 8;  // query rows (a key/value head's query heads x the pass's rows) per sweep over keys
constexpr int64_t SPAN = 64;    // a head's features whose dot products are summed before the next span's
constexpr int64_t VALUE_ROWS = 3;   // rows whose weighted values are summed side by side, sharing each value's loads
constexpr int64_t VALUE_SPAN = 4;   // and the registers of values per row they hold: 3 x 4 sums, 3 weights, a value

// Eight vectors' sums of their lanes, lane i holding v[i]'s: each added in sum8's order (the halves, then lanes
// 0 + 2 and 1 + 3, then those two), so that a score is the same float either way.
inline __m256 sums8(const __m256* v) {
  __m256 s[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // [v_i's halves added | v_{i+4}'s], lanes reordered 0, 2, 1, 3 for the hadds
    const __m256 halves = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i + 4], 0x20),
                                        _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
    s[i] = _mm256_permute_ps(halves, 0xD8);
  }
  return _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
}

// Dot products of G query rows with 8 / G keys over `width` vectors of features: dot[g * 8 / G + i] is row g's
// with key i, its products summed in feature order. Two rows share each key's loads (11 registers).
template <int G>
inline __m256 dots(const float* const* q, const float* const* kt, int64_t width) {
  constexpr int K = 8 / G;
  __m256 dot[8];
#pragma GCC unroll 8
  for (int i = 0; i < K; ++i) {
    const __m256 key = _mm256_loadu_ps(kt[i]);
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) dot[g * K + i] = _mm256_mul_ps(_mm256_loadu_ps(q[g]), key);
  }
  for (int64_t w = 1; w < width; ++w) {
    __m256 qw[G];
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) qw[g] = _mm256_loadu_ps(q[g] + 8 * w);
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) {
      const __m256 key = _mm256_loadu_ps(kt[i] + 8 * w);
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) dot[g * K + i] = _mm256_fmadd_ps(qw[g], key, dot[g * K + i]);
    }
  }
  return sums8(dot);
}

inline void add4(float* at, __m128 x) { _mm_storeu_ps(at, _mm_add_ps(_mm_loadu_ps(at), x)); }

// G rows' weighted values over W vectors of features from `d`: out_g = inverse_g · Σ_t weight_g[t] · v_t, t below
// seen_g, each sum in key order; the keys every row sees side by side (each value loaded once for the G rows), then
// each row's further keys alone.
template <int G, int W>
void weigh(const float* const* weights, const int64_t* seen, const float* v, int64_t v_step, int64_t d,
           const float* inverse, float* const* out) {
  __m256 acc[G][W];
#pragma GCC unroll 3
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) acc[g][w] = _mm256_setzero_ps();
  const int64_t common = *std::min_element(seen, seen + G);
  for (int64_t t = 0; t < common; ++t) {
    const float* vt = v + t * v_step + d;
    __m256 weight[G];
#pragma GCC unroll 3
    for (int g = 0; g < G; ++g) weight[g] = _mm256_broadcast_ss(weights[g] + t);
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) {
      const __m256 value = _mm256_loadu_ps(vt + 8 * w);
#pragma GCC unroll 3
      for (int g = 0; g < G; ++g) acc[g][w] = _mm256_fmadd_ps(weight[g], value, acc[g][w]);
    }
  }
#pragma GCC unroll 3
  for (int g = 0; g < G; ++g) {
    for (int64_t t = common; t < seen[g]; ++t) {
      const __m256 weight = _mm256_broadcast_ss(weights[g] + t);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w)
        acc[g][w] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + t * v_step + d + 8 * w), acc[g][w]);
    }
    const __m256 scale = _mm256_set1_ps(inverse[g]);
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(out[g] + d + 8 * w, _mm256_mul_ps(acc[g][w], scale));
  }
}

using Weigh = void (*)(const float* const*, const int64_t*, const float*, int64_t, int64_t, const float*,
                       float* const*);
template <int G, int... W>
constexpr std::array<Weigh, VALUE_SPAN> weighs(std::integer_sequence<int, W...>) {
  return {weigh<G, W + 1>...};
}
template <int... G>
constexpr std::array<std::array<Weigh, VALUE_SPAN>, VALUE_ROWS> weigh_table(std::integer_sequence<int, G...>) {
  return {weighs<G + 1>(std::make_integer_sequence<int, VALUE_SPAN>{})...};
}
constexpr auto WEIGHS = weigh_table(std::make_integer_sequence<int, VALUE_ROWS>{});  // [rows - 1][vectors - 1]

// Up to QUERIES query rows of one key/value head: row j sees its first seen[j] keys, and
// out_j = Σ_t softmax_t(scale · q_j·k_t) v_t. The scores eight keys at a time: those keys' features (SPAN at a
// time) stay in the first-level cache while every row's dot products with them are summed, two rows at once, their
// lanes added eight dot products at once (sums8); the weighted values three rows at once. Every sum runs in the
// same order whatever rows share it, so a row's output is the same floats whatever rows share its sweep. dim is a
// multiple of 8.
void attend(const float* const* q, const int64_t* seen, int64_t n, const float* k, int64_t k_step, const float* v,
            int64_t v_step, int64_t dim, float scale, float* scores, int64_t stride, float* const* out) {
  const int64_t keys = *std::max_element(seen, seen + n);
  std::fill(scores, scores + n * stride, 0.0f);
  for (int64_t d0 = 0; d0 < dim; d0 += SPAN) {  // the dot products, a span of features at a time
    const int64_t width = std::min(SPAN, dim - d0) / 8;
    for (int64_t t0 = 0; t0 < keys; t0 += 8) {
      const float* kt[8];  // past the last key, the last key again: its scores are masked out below
#pragma GCC unroll 8
      for (int64_t i = 0; i < 8; ++i) kt[i] = k + std::min(t0 + i, keys - 1) * k_step + d0;
      for (int64_t j = 0; j < n;) {
        if (t0 >= seen[j]) {
          ++j;
          continue;
        }
        float* at = scores + j * stride + t0;
        if (j + 1 < n && t0 < seen[j + 1]) {  // two rows: four keys at a time
          const float* qs[2] = {q[j] + d0, q[j + 1] + d0};
          for (int64_t half = 0; half < 8; half += 4) {
            const __m256 s = dots<2>(qs, kt + half, width);
            add4(at + half, _mm256_castps256_ps128(s));
            add4(at + stride + half, _mm256_extractf128_ps(s, 1));
          }
          j += 2;
        } else {
          const float* qs[1] = {q[j] + d0};
          _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), dots<1>(qs, kt, width)));
          ++j;
        }
      }
    }
  }
  float inverse[QUERIES];
  const float* weights[QUERIES];
  for (int64_t j = 0; j < n; ++j) {
    float* row = scores + j * stride;
    __m256 tops = _mm256_set1_ps(-INFINITY);  // the scores scaled, and their largest (exact in any order)
    int64_t t = 0;
    for (; t + 8 <= seen[j]; t += 8) {
      const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(row + t), _mm256_set1_ps(scale));
      _mm256_storeu_ps(row + t, scaled);
      tops = _mm256_max_ps(tops, scaled);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, tops);
    float top = *std::max_element(lanes, lanes + 8);
    for (; t < seen[j]; ++t) top = std::max(top, row[t] *= scale);
    for (int64_t t = seen[j]; t < (keys + 7) / 8 * 8; ++t) row[t] = -INFINITY;  // unseen, and a full last register
    __m256 total = _mm256_setzero_ps();
    for (int64_t t = 0; t < keys; t += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + t), _mm256_set1_ps(top)));
      _mm256_storeu_ps(row + t, e);  // the softmax's weights, unnormalised: the sum divides at the end
      total = _mm256_add_ps(total, e);
    }
    inverse[j] = 1.0f / sum8(total);
    weights[j] = row;
  }
  for (int64_t j = 0; j < n; j += VALUE_ROWS) {  // the weighted values, VALUE_SPAN vectors of features at a time
    const int64_t rows = std::min(VALUE_ROWS, n - j);
    for (int64_t d = 0; d < dim; d += 8 * VALUE_SPAN)
      WEIGHS[rows - 1][std::min(VALUE_SPAN, (dim - d) / 8) - 1](weights + j, seen + j, v, v_step, d, inverse + j,
                                                               out + j);
  }
}

bool attends_natively(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value) {
  for (const auto* t : {&query, &key, &value})
    if (t->scalar_type() != torch::kFloat || t->stride(3) != 1) return false;
  return query.size(3) % 8 == 0 && query.size(1) % key.size(1) == 0;
}

}  // namespace

// Attention of the pass's queries over the cached and new keys and values, as (batch, rows, heads * dim) for the
// output product. Without a mask, the pass is a chain after the cache: row i sees every key but the last
// rows - 1 - i. float32 heads of a multiple of 8 take our kernel (`attend`: a key/value head's query rows together,
// e^x by exp8), others and masked passes (trees, batches) ATen's.
torch::Tensor attention_out(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                            const c10::optional<torch::Tensor>& mask, double scale) {
  const int64_t batch = query.size(0), heads = query.size(1), rows = query.size(2), dim = query.size(3);
  const int64_t kv_heads = key.size(1), keys = key.size(2);
  const bool masked = mask && mask->defined();
  if (!masked && attends_natively(query, key, value)) {
    auto out = torch::empty({batch, rows, heads * dim}, query.options());
    const float* qp = query.data_ptr<float>();
    const float* kp = key.data_ptr<float>();
    const float* vp = value.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t group = heads / kv_heads, per_head = group * rows;  // query rows per key/value head
    const int64_t sweeps = (per_head + QUERIES - 1) / QUERIES, tasks = batch * kv_heads * sweeps;
    const int64_t stride = (keys + 7) / 8 * 8;  // a query's scores, padded to full registers
    const int64_t grain = keys * dim * per_head < 65536 ? tasks : 1;  // a short context stays on one thread
    at::parallel_for(0, tasks, grain, [&](int64_t first, int64_t last) {
      std::vector<float> scores(QUERIES * stride);
      const float* q[QUERIES];
      float* o[QUERIES];
      int64_t seen[QUERIES];
      for (int64_t task = first; task < last; ++task) {
        const int64_t b = task / (kv_heads * sweeps), g = task / sweeps % kv_heads, sweep = task % sweeps;
        const int64_t n = std::min(QUERIES, per_head - sweep * QUERIES);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t index = sweep * QUERIES + j, h = g * group + index / rows, i = index % rows;
          q[j] = qp + b * query.stride(0) + h * query.stride(1) + i * query.stride(2);
          o[j] = op + (b * rows + i) * heads * dim + h * dim;
          seen[j] = keys - (rows - 1 - i);
        }
        attend(q, seen, n, kp + b * key.stride(0) + g * key.stride(1), key.stride(2),
               vp + b * value.stride(0) + g * value.stride(1), value.stride(2), dim, static_cast<float>(scale),
               scores.data(), stride, o);
      }
    });
    return out;
  }
  torch::Tensor out;
  if (rows == 1 && !masked) {
    out = at::scaled_dot_product_attention(query.reshape({batch, kv_heads, heads / kv_heads, dim}), key, value,
                                           c10::nullopt, 0.0, false, scale)
              .view({batch, heads, 1, dim});
  } else {
    const auto chain =
        masked ? *mask : torch::ones({rows, keys}, query.options().dtype(torch::kBool)).tril(keys - rows);
    out = at::scaled_dot_product_attention(query, key, value, chain, 0.0, false, scale, heads != kv_heads);
  }
  return out.transpose(1, 2).reshape({batch, rows, heads * dim});
}

// RMS norm over the last dimension, as transformers' Llama norm: weight · (x / sqrt(mean(x²) + eps)). float32 rows
// by our loop (the squares summed in eight lanes), anything else by ATen.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const int64_t width = x.size(-1);
  if (x.scalar_type() != torch::kFloat || weight.scalar_type() != torch::kFloat || width % 8 != 0 ||
      !x.is_contiguous() || !weight.is_contiguous())
    return at::rms_norm(x, {width}, weight, eps);
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t row = 0; row < x.numel() / width; ++row) {
    const float* xr = xp + row * width;
    __m256 squares = _mm256_setzero_ps();
    for (int64_t i = 0; i < width; i += 8) {
      const __m256 v = _mm256_loadu_ps(xr + i);
      squares = _mm256_fmadd_ps(v, v, squares);
    }
    const __m256 inverse = _mm256_set1_ps(1.0f / std::sqrt(sum8(squares) / width + static_cast<float>(eps)));
    for (int64_t i = 0; i < width; i += 8)
      _mm256_storeu_ps(op + row * width + i,
                       _mm256_mul_ps(_mm256_loadu_ps(wp + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), inverse)));
  }
  return out;
}

// The residual sum x + delta and its RMS norm (the next product's input).
std::tuple<torch::Tensor, torch::Tensor> residual_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                       const torch::Tensor& weight, double eps) {
  auto sum = x + delta;
  return {sum, rms_norm(sum, weight, eps)};
}

// SwiGLU's SiLU(gate)·up from the fused gate|up product.
torch::Tensor gated(const torch::Tensor& gate_up) {
  const int64_t half = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, half)) * gate_up.narrow(-1, half, half);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_in", &attention_in);
  m.def("attention_out", &attention_out);
  m.def("residual_norm", &residual_norm);
  m.def("rms_norm", &rms_norm);
  m.def("gated", &gated);
  m.def("product", &product, pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"),
        pybind11::arg("features"));
}
