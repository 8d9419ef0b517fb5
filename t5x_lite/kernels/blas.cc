// Takes scipy's sgemm for the kernels (blas.h) and sets its OpenBLAS to one thread: the kernels
// spread their matrices over XLA's threads themselves.

#include <dlfcn.h>

#include "blas.h"

// Returns 0, or -1 where the library holding `sgemm` has no OpenBLAS thread control.
extern "C" int t5x_lite_use_sgemm(void* sgemm) {
  Dl_info info;
  if (dladdr(sgemm, &info) == 0) return -1;
  void* library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return -1;
  for (const char* name : {"scipy_openblas_set_num_threads", "openblas_set_num_threads"}) {
    if (auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(library, name))) {
      set_threads(1);
      t5x_lite::g_sgemm = reinterpret_cast<t5x_lite::FortranSgemm>(sgemm);
      return 0;
    }
  }
  return -1;
}
