// Batched float32 matmuls for XLA:CPU, registered as the FFI custom call
// `t5x_lite_batched_matmul` (t5x_lite/kernels/sgemm_batch.py builds and loads this file).
//
// C[i] = alpha op(A[i]) op(B[i]) for every i of the leading (batch) dimensions, row-major, op a
// transpose or not. Each matrix is one single-threaded sgemm of scipy's OpenBLAS; the matrices
// are spread over XLA's own intra-op thread pool. XLA:CPU runs a batched dot of small matrices
// (attention's [length, head_dim] products) with less parallelism than this
// (docs/benchmarks.md).

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The Fortran BLAS sgemm (column-major, every argument by pointer), as scipy.linalg.cython_blas
// exports it.
using FortranSgemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n, const int* k,
                              const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                              const float* beta, float* c, const int* ldc);

FortranSgemm g_sgemm = nullptr;

// One call's matrices, taken one at a time by whichever thread asks next.
struct Work {
  const float* a;
  const float* b;
  float* c;
  int64_t batch, a_stride, b_stride, c_stride;
  char op_a, op_b;  // 'N' or 'T', for the column-major call below
  int m, n, k, lda, ldb, ldc;
  float alpha;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    const float zero = 0.0f;
    for (int64_t i = next.fetch_add(1); i < batch; i = next.fetch_add(1)) {
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first.
      g_sgemm(&op_b, &op_a, &n, &m, &k, &alpha, b + i * b_stride, &ldb, a + i * a_stride, &lda, &zero,
              c + i * c_stride, &ldc);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

}  // namespace

// Takes scipy's sgemm and sets its OpenBLAS to one thread (the pool above does the threading).
// Returns 0, or -1 where the library holding `sgemm` has no OpenBLAS thread control.
extern "C" int t5x_lite_use_sgemm(void* sgemm) {
  Dl_info info;
  if (dladdr(sgemm, &info) == 0) return -1;
  void* library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return -1;
  for (const char* name : {"scipy_openblas_set_num_threads", "openblas_set_num_threads"}) {
    if (auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(library, name))) {
      set_threads(1);
      g_sgemm = reinterpret_cast<FortranSgemm>(sgemm);
      return 0;
    }
  }
  return -1;
}

static ffi::Error BatchedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                                ffi::ResultBuffer<ffi::F32> c, bool transpose_a, bool transpose_b, float alpha) {
  if (g_sgemm == nullptr) return ffi::Error::Internal("t5x_lite_batched_matmul: no sgemm was set");
  auto a_dims = a.dimensions(), b_dims = b.dimensions();
  const size_t rank = a_dims.size();
  if (rank < 2 || b_dims.size() != rank) {
    return ffi::Error::InvalidArgument("t5x_lite_batched_matmul: a and b need the same rank, at least 2");
  }
  auto work = std::make_shared<Work>();
  work->batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (a_dims[i] != b_dims[i]) return ffi::Error::InvalidArgument("t5x_lite_batched_matmul: batch dims differ");
    work->batch *= a_dims[i];
  }
  const int rows_a = a_dims[rank - 2], cols_a = a_dims[rank - 1];
  const int rows_b = b_dims[rank - 2], cols_b = b_dims[rank - 1];
  work->m = transpose_a ? cols_a : rows_a;
  work->k = transpose_a ? rows_a : cols_a;
  work->n = transpose_b ? rows_b : cols_b;
  if ((transpose_b ? cols_b : rows_b) != work->k) {
    return ffi::Error::InvalidArgument("t5x_lite_batched_matmul: contracting dims differ");
  }
  work->a = a.typed_data();
  work->b = b.typed_data();
  work->c = c->typed_data();
  work->a_stride = int64_t{rows_a} * cols_a;
  work->b_stride = int64_t{rows_b} * cols_b;
  work->c_stride = int64_t{work->m} * work->n;
  work->alpha = alpha;
  work->op_a = transpose_a ? 'T' : 'N';
  work->op_b = transpose_b ? 'T' : 'N';
  work->lda = std::max(cols_a, 1);
  work->ldb = std::max(cols_b, 1);
  work->ldc = std::max(work->n, 1);
  if (work->batch * work->c_stride == 0) return ffi::Error::Success();
  if (work->k == 0) {
    std::memset(work->c, 0, sizeof(float) * work->batch * work->c_stride);
    return ffi::Error::Success();
  }
  // Helpers that start after the matrices are all taken find none and return; the shared Work
  // outlives this call for them, and the buffers are never touched after the wait below.
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), work->batch) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load(std::memory_order_acquire) < work->batch) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(t5x_lite_batched_matmul, BatchedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b")
                                  .Attr<float>("alpha"));
