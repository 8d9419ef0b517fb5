// What the kernels share: scipy's single-threaded sgemm in row-major terms, and a parallel
// loop over XLA's intra-op thread pool.

#ifndef T5X_LITE_KERNELS_BLAS_H_
#define T5X_LITE_KERNELS_BLAS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace t5x_lite {

// The Fortran BLAS sgemm (column-major, every argument by pointer), as scipy.linalg.cython_blas
// exports it; set once by t5x_lite_use_sgemm (blas.cc).
using FortranSgemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n, const int* k,
                              const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                              const float* beta, float* c, const int* ldc);

inline FortranSgemm g_sgemm = nullptr;

inline bool SgemmReady() { return g_sgemm != nullptr; }

// Row-major C = alpha op(A) op(B) + beta C, op(A) [m, k], op(B) [k, n]; lda, ldb and ldc are the
// row strides of A, B and C as stored.
inline void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first.
  const char op_a = transpose_a ? 'T' : 'N', op_b = transpose_b ? 'T' : 'N';
  lda = std::max(lda, 1);
  ldb = std::max(ldb, 1);
  ldc = std::max(ldc, 1);
  g_sgemm(&op_b, &op_a, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// Runs body(i) for i in [0, count) on the calling thread and up to the pool's other threads, and
// returns when every call has returned. The caller takes tasks too and never waits on helpers
// that have not started, so it cannot deadlock; a helper that starts after the tasks are all
// taken finds none and returns without touching `body`.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t count, std::function<void(int64_t)> body) {
  struct State {
    std::function<void(int64_t)> body;
    int64_t count;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    void Run() {
      for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
        body(i);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto state = std::make_shared<State>();
  state->body = std::move(body);
  state->count = count;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), count) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([state] { state->Run(); });
  state->Run();
  while (state->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

}  // namespace t5x_lite

#endif  // T5X_LITE_KERNELS_BLAS_H_
