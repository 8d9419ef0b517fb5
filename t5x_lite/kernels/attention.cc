// Fused softmax attention for XLA:CPU in float32, forward and backward, registered as the FFI
// custom calls `t5x_lite_attention_fwd` and `t5x_lite_attention_bwd` (t5x_lite/kernels/build.py
// builds this file; attention.py calls it).
//
// One task per (batch row, key/value head) runs every product and the softmax of that matrix
// while its [q_len, kv_len] scores are in cache: each product one single-threaded sgemm of
// scipy's OpenBLAS, the tasks spread over XLA's intra-op threads. q, k, v and their gradients
// stay in the model's [batch, length, heads, head_dim] layout (sgemm's leading dimensions step
// over the heads), so no heads-first copies are made. The math is the explicit attention's
// (models/explicit_attention.py):
//
//   forward:  P = softmax(where(mask, scale q k^T + bias, MASKED))     out = P v
//   backward: dP = dout v^T   dv = P^T dout   dS = where(mask, P (dP - rowsum(dP P)), 0)
//             dq = scale dS k   dk = scale dS^T q
//
// Grouped-query attention: the query heads j * groups ... (j + 1) * groups - 1 share key/value
// head j; one task handles the whole group, so dk and dv sum over it without atomics.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "blas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace t5x_lite {
namespace {

// Masked scores: finite, so a row with nothing visible gives a uniform (not NaN) softmax.
constexpr float kMasked = -0.7f * std::numeric_limits<float>::max();

// exp(x) for x <= 0 (scores minus their row's maximum), about 1 ulp: x = n ln2 + r with
// |r| <= ln2 / 2, exp(r) by Cephes' polynomial, 2^n by the exponent bits; 0 below -87 (where
// float32's exp is subnormal or 0). Branch-free, so the loops that call it vectorize.
inline float ExpNonPositive(float x) {
  const float clamped = std::max(x, -87.0f);
  const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? 0.0f : p * scale;
}

// target_clones needs ifuncs (ELF with glibc): Linux on x86-64 only; elsewhere one build.
#if defined(__x86_64__) && defined(__linux__)
#define T5X_LITE_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define T5X_LITE_VECTOR_CLONES
#endif

// One row of scores -> probabilities, in place: biased (bias may be null: none), masked (mask
// may be null: all visible), softmax. Separate passes keep each loop branch-free (vectorized);
// the row is in L1.
T5X_LITE_VECTOR_CLONES
void SoftmaxRow(float* row, const bool* mask, const float* bias, int64_t length) {
  if (bias != nullptr) {
    for (int64_t s = 0; s < length; ++s) row[s] += bias[s];
  }
  if (mask != nullptr) {
    for (int64_t s = 0; s < length; ++s) row[s] = mask[s] ? row[s] : kMasked;
  }
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t s = 0; s < length; ++s) max = max > row[s] ? max : row[s];
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < length; ++s) {
    row[s] = ExpNonPositive(row[s] - max);
    sum += row[s];
  }
  const float inverse = 1.0f / sum;
  for (int64_t s = 0; s < length; ++s) row[s] *= inverse;
}

// One row of dP -> dS = P (dP - rowsum(dP P)), in place; 0 where masked (mask may be null). A
// masked score's probability is 0 unless its whole row is masked, and then the scores were
// replaced by a constant: either way nothing flows back to them.
T5X_LITE_VECTOR_CLONES
void SoftmaxGradRow(float* d_row, const float* p_row, const bool* mask, int64_t length) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t s = 0; s < length; ++s) dot += d_row[s] * p_row[s];
  for (int64_t s = 0; s < length; ++s) {
    const float ds = p_row[s] * (d_row[s] - dot);
    d_row[s] = (mask == nullptr || mask[s]) ? ds : 0.0f;
  }
}

// The shapes of one call: q and dq [batch, q_len, heads, head_dim], k and v [batch, kv_len,
// kv_heads, head_dim], probabilities [batch, heads, q_len, kv_len].
struct Dims {
  int64_t batch, q_len, heads, head_dim, kv_len, kv_heads, groups;

  int64_t QOffset(int64_t b, int64_t head) const { return (b * q_len * heads + head) * head_dim; }
  int64_t KvOffset(int64_t b, int64_t kv_head) const { return (b * kv_len * kv_heads + kv_head) * head_dim; }
  int64_t POffset(int64_t b, int64_t head) const { return (b * heads + head) * q_len * kv_len; }
  int q_ld() const { return static_cast<int>(heads * head_dim); }
  int kv_ld() const { return static_cast<int>(kv_heads * head_dim); }
};

ffi::Error ReadDims(const ffi::AnyBuffer::Dimensions& q, const ffi::AnyBuffer::Dimensions& k,
                    const ffi::AnyBuffer::Dimensions& v, Dims* d) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) {
    return ffi::Error::InvalidArgument("t5x_lite attention: q, k and v must be [batch, length, heads, head_dim]");
  }
  *d = Dims{q[0], q[1], q[2], q[3], k[1], k[2], 1};
  if (k[0] != q[0] || k[3] != q[3] || v[0] != k[0] || v[1] != k[1] || v[2] != k[2] || v[3] != k[3] ||
      d->kv_heads == 0 || d->heads % d->kv_heads != 0) {
    return ffi::Error::InvalidArgument("t5x_lite attention: q, k and v shapes do not match");
  }
  d->groups = d->heads / d->kv_heads;
  return ffi::Error::Success();
}

// A [B or 1, heads or 1, q_len, kv_len] array (mask or bias), indexed by (batch row, head, query).
template <typename T>
struct RowSource {
  const T* data = nullptr;  // null: none
  int64_t batch_stride = 0, head_stride = 0, row = 0;

  static ffi::Error Make(const T* data, const ffi::AnyBuffer::Dimensions& dims, const Dims& d, RowSource* out) {
    if (dims.size() == 1 && dims[0] == 0) return ffi::Error::Success();  // an empty array: none given
    if (dims.size() != 4 || (dims[0] != 1 && dims[0] != d.batch) || (dims[1] != 1 && dims[1] != d.heads) ||
        dims[2] != d.q_len || dims[3] != d.kv_len) {
      return ffi::Error::InvalidArgument(
          "t5x_lite attention: mask and bias must be [batch or 1, heads or 1, q_len, kv_len]");
    }
    out->data = data;
    out->row = d.kv_len;
    out->head_stride = dims[1] == 1 ? 0 : d.q_len * d.kv_len;
    out->batch_stride = dims[0] == 1 ? 0 : dims[1] * d.q_len * d.kv_len;
    return ffi::Error::Success();
  }
  const T* At(int64_t b, int64_t head, int64_t t) const {
    return data ? data + b * batch_stride + head * head_stride + t * row : nullptr;
  }
};

// Queries in blocks of this many rows, each with the key range its mask leaves visible.
constexpr int64_t kRowBlock = 64;

// Where the probabilities (forward) or dS (backward) are no output, each thread holds one block
// of their rows in scratch, not a whole [q_len, kv_len] matrix (256 MiB at 8,192 tokens): blocks
// are cut to ScratchRows rows, which keeps it to this many floats (4 MiB), or to kRowBlock rows
// where the keys are more than 16,384.
constexpr int64_t kScratchFloats = int64_t{1} << 20;

// The rows of one scratch block for kv_len keys: a multiple of kRowBlock.
int64_t ScratchRows(int64_t kv_len) {
  return std::max<int64_t>(1, kScratchFloats / std::max<int64_t>(kv_len, 1) / kRowBlock) * kRowBlock;
}

// Scratch of one thread, reused across calls (and kept: it is bounded by ScratchRows).
float* Scratch(int64_t size) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < size) scratch.resize(size);
  return scratch.data();
}

// Rows [t0, t1) of one (batch row, head) and the keys [lo, hi) outside which all of them are
// masked: there their probabilities are exactly 0, so no product or softmax touches those
// columns (a causal mask skips the keys after the block, packed segments those of the others).
struct Block {
  int64_t t0, t1, lo, hi;
};

// The row blocks of one (batch row, head); neighbours with the same key range are merged up to
// max_rows rows (one block, one product, for a mask that hides nothing). A row with nothing
// visible attends uniformly to every key, so its block keeps them all.
void RowBlocks(const RowSource<bool>& masks, int64_t b, int64_t head, int64_t q_len, int64_t kv_len,
               int64_t max_rows, std::vector<Block>* blocks) {
  blocks->clear();
  for (int64_t t0 = 0; t0 < q_len; t0 += kRowBlock) {
    const int64_t t1 = std::min(t0 + kRowBlock, q_len);
    int64_t lo = kv_len, hi = 0;
    for (int64_t t = t0; t < t1 && (lo > 0 || hi < kv_len); ++t) {
      const bool* row = masks.At(b, head, t);
      const void* first = row ? memchr(row, 1, kv_len) : nullptr;
      if (first == nullptr) {
        lo = 0, hi = kv_len;
        break;
      }
      lo = std::min<int64_t>(lo, static_cast<const bool*>(first) - row);
      int64_t last = kv_len;  // one past the row's last visible key (there is one: `first`)
      while (!row[last - 1]) --last;
      hi = std::max<int64_t>(hi, last);
    }
    if (!blocks->empty() && blocks->back().lo == lo && blocks->back().hi == hi && t1 - blocks->back().t0 <= max_rows) {
      blocks->back().t1 = t1;
    } else {
      blocks->push_back({t0, t1, lo, hi});
    }
  }
}

// Sets rows [t0, t1) of a [.., kv_len] matrix to 0 outside the columns [lo, hi).
void ZeroOutside(float* m, const Block& block, int64_t kv_len) {
  for (int64_t t = block.t0; t < block.t1; ++t) {
    std::fill(m + t * kv_len, m + t * kv_len + block.lo, 0.0f);
    std::fill(m + t * kv_len + block.hi, m + (t + 1) * kv_len, 0.0f);
  }
}

ffi::Error AttentionForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::F32> bias,
                            ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> probs, float scale) {
  if (!SgemmReady()) return ffi::Error::Internal("t5x_lite attention: no sgemm was set");
  Dims d;
  if (auto error = ReadDims(q.dimensions(), k.dimensions(), v.dimensions(), &d); error.failure()) return error;
  RowSource<bool> masks;
  RowSource<float> biases;
  if (auto e = RowSource<bool>::Make(mask.typed_data(), mask.dimensions(), d, &masks); e.failure()) return e;
  if (auto e = RowSource<float>::Make(bias.typed_data(), bias.dimensions(), d, &biases); e.failure()) return e;
  // Probabilities are written for the backward pass when the caller asks for them (a full-size
  // result), else kept in scratch.
  float* p_out = probs->element_count() == 0 ? nullptr : probs->typed_data();
  const float* qd = q.typed_data();
  const float* kd = k.typed_data();
  const float* vd = v.typed_data();
  float* od = out->typed_data();
  if (d.batch * d.q_len * d.heads * d.head_dim == 0) return ffi::Error::Success();
  const int t_len = d.q_len, s_len = d.kv_len, h = d.head_dim;
  // Without a probabilities output, blocks are one scratch block at most.
  const int64_t max_rows = p_out ? t_len : ScratchRows(s_len);
  ParallelFor(pool, d.batch * d.kv_heads, [&](int64_t task) {
    const int64_t b = task / d.kv_heads, j = task % d.kv_heads;
    thread_local std::vector<Block> blocks;
    const float *k_j = kd + d.KvOffset(b, j), *v_j = vd + d.KvOffset(b, j);
    float* scratch = p_out ? nullptr : Scratch(std::min<int64_t>(t_len, max_rows) * s_len);
    for (int64_t head = j * d.groups; head < (j + 1) * d.groups; ++head) {
      if (head == j * d.groups || masks.head_stride != 0) RowBlocks(masks, b, head, t_len, s_len, max_rows, &blocks);
      float* p = p_out ? p_out + d.POffset(b, head) : nullptr;
      const float* q_head = qd + d.QOffset(b, head);
      float* o_head = od + d.QOffset(b, head);
      for (const Block& x : blocks) {
        const int rows = x.t1 - x.t0, keys = x.hi - x.lo;
        // The block's first row of probabilities: in the output, else the scratch's first.
        float* p_block = (p ? p + x.t0 * s_len : scratch) + x.lo;
        Gemm(false, true, rows, keys, h, scale, q_head + x.t0 * d.q_ld(), d.q_ld(), k_j + x.lo * d.kv_ld(), d.kv_ld(),
             0.0f, p_block, s_len);
        for (int64_t t = x.t0; t < x.t1; ++t) {
          const bool* mask_row = masks.At(b, head, t);
          const float* bias_row = biases.At(b, head, t);
          SoftmaxRow(p_block + (t - x.t0) * s_len, mask_row ? mask_row + x.lo : nullptr,
                     bias_row ? bias_row + x.lo : nullptr, keys);
        }
        Gemm(false, false, rows, h, keys, 1.0f, p_block, s_len, v_j + x.lo * d.kv_ld(), d.kv_ld(), 0.0f,
             o_head + x.t0 * d.q_ld(), d.q_ld());
        if (p) ZeroOutside(p, x, s_len);
      }
    }
  });
  return ffi::Error::Success();
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                             ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::F32> probs,
                             ffi::Buffer<ffi::F32> d_out, ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                             ffi::ResultBuffer<ffi::F32> dv, ffi::ResultBuffer<ffi::F32> d_scores, float scale) {
  if (!SgemmReady()) return ffi::Error::Internal("t5x_lite attention: no sgemm was set");
  Dims d;
  if (auto error = ReadDims(q.dimensions(), k.dimensions(), v.dimensions(), &d); error.failure()) return error;
  if (probs.element_count() != d.batch * d.heads * d.q_len * d.kv_len || d_out.element_count() != q.element_count()) {
    return ffi::Error::InvalidArgument("t5x_lite attention: probabilities or output gradient of the wrong size");
  }
  RowSource<bool> masks;
  if (auto e = RowSource<bool>::Make(mask.typed_data(), mask.dimensions(), d, &masks); e.failure()) return e;
  // dS is written out when the caller asks for it (a bias's gradient), else kept in scratch.
  float* ds_out = d_scores->element_count() == 0 ? nullptr : d_scores->typed_data();
  const float *qd = q.typed_data(), *kd = k.typed_data(), *vd = v.typed_data();
  const float *pd = probs.typed_data(), *god = d_out.typed_data();
  float *dqd = dq->typed_data(), *dkd = dk->typed_data(), *dvd = dv->typed_data();
  if (d.batch * d.kv_len * d.kv_heads * d.head_dim == 0) return ffi::Error::Success();
  const int t_len = d.q_len, s_len = d.kv_len, h = d.head_dim;
  // Without a dS output, blocks are one scratch block at most.
  const int64_t max_rows = ds_out ? t_len : ScratchRows(s_len);
  ParallelFor(pool, d.batch * d.kv_heads, [&](int64_t task) {
    const int64_t b = task / d.kv_heads, j = task % d.kv_heads;
    thread_local std::vector<Block> blocks;
    const float *k_j = kd + d.KvOffset(b, j), *v_j = vd + d.KvOffset(b, j);
    float *dk_j = dkd + d.KvOffset(b, j), *dv_j = dvd + d.KvOffset(b, j);
    float* scratch = ds_out ? nullptr : Scratch(std::min<int64_t>(t_len, max_rows) * s_len);
    // Blocks add to dk and dv over the keys they see; keys no block sees get 0.
    for (int64_t s = 0; s < s_len; ++s) {
      std::fill(dk_j + s * d.kv_ld(), dk_j + s * d.kv_ld() + h, 0.0f);
      std::fill(dv_j + s * d.kv_ld(), dv_j + s * d.kv_ld() + h, 0.0f);
    }
    for (int64_t head = j * d.groups; head < (j + 1) * d.groups; ++head) {
      if (head == j * d.groups || masks.head_stride != 0) RowBlocks(masks, b, head, t_len, s_len, max_rows, &blocks);
      const float* p = pd + d.POffset(b, head);
      const float* g = god + d.QOffset(b, head);
      const float* q_head = qd + d.QOffset(b, head);
      float* dq_head = dqd + d.QOffset(b, head);
      float* ds = ds_out ? ds_out + d.POffset(b, head) : nullptr;
      for (const Block& x : blocks) {
        const int rows = x.t1 - x.t0, keys = x.hi - x.lo;
        const float* p_block = p + x.t0 * s_len + x.lo;
        // The block's first row of dS: in the output, else the scratch's first.
        float* ds_block = (ds ? ds + x.t0 * s_len : scratch) + x.lo;
        const float* g_block = g + x.t0 * d.q_ld();
        Gemm(false, true, rows, keys, h, 1.0f, g_block, d.q_ld(), v_j + x.lo * d.kv_ld(), d.kv_ld(), 0.0f, ds_block,
             s_len);
        Gemm(true, false, keys, h, rows, 1.0f, p_block, s_len, g_block, d.q_ld(), 1.0f, dv_j + x.lo * d.kv_ld(),
             d.kv_ld());
        for (int64_t t = x.t0; t < x.t1; ++t) {
          const bool* mask_row = masks.At(b, head, t);
          SoftmaxGradRow(ds_block + (t - x.t0) * s_len, p + t * s_len + x.lo, mask_row ? mask_row + x.lo : nullptr,
                         keys);
        }
        Gemm(false, false, rows, h, keys, scale, ds_block, s_len, k_j + x.lo * d.kv_ld(), d.kv_ld(), 0.0f,
             dq_head + x.t0 * d.q_ld(), d.q_ld());
        Gemm(true, false, keys, h, rows, scale, ds_block, s_len, q_head + x.t0 * d.q_ld(), d.q_ld(), 1.0f,
             dk_j + x.lo * d.kv_ld(), d.kv_ld());
        if (ds) ZeroOutside(ds, x, s_len);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace t5x_lite

XLA_FFI_DEFINE_HANDLER_SYMBOL(t5x_lite_attention_fwd, t5x_lite::AttentionForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask, or empty
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias, or empty
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out
                                  .Ret<ffi::Buffer<ffi::F32>>()   // probabilities, or empty
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(t5x_lite_attention_bwd, t5x_lite::AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask, or empty
                                  .Arg<ffi::Buffer<ffi::F32>>()   // probabilities
                                  .Arg<ffi::Buffer<ffi::F32>>()  // output gradient
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dq
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dk
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dv
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dS, or empty
                                  .Attr<float>("scale"));
