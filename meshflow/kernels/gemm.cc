#include "meshflow/kernels/gemm.h"

#include <cblas.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow {

namespace {

// Multiply-adds below which a product runs on one thread: splitting it costs more than the
// half it saves (a 64 x 256 x 64 attention block is 1 Mi).
constexpr std::int64_t kSplitMacs = std::int64_t{1} << 22;
// Rows or columns per block at least: below this a GEMM's packing dominates.
constexpr std::int64_t kSplitMin = 32;

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

blasint blas_int(std::int64_t v) {
  MESHFLOW_CHECK(v >= 0 && v <= INT_MAX, "GEMM dimension {} exceeds the BLAS integer range", v);
  return static_cast<blasint>(v);
}

template <typename T>
void blas(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(k), 1.0f, a,
                blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(k), 1.0, a, blas_int(lda),
                b, blas_int(ldb), beta, c, blas_int(ldc));
  }
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta * c
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  single_threaded_blas();
  const bool by_rows = m >= n;
  const std::int64_t span = by_rows ? m : n;
  const int parts = m * n * k < kSplitMacs ? 1 : parallel_parts(span, kSplitMin);
  parallel_parts_for(span, parts, [&](int, std::int64_t begin, std::int64_t end) {
    if (begin == end) return;
    if (by_rows) {  // rows [begin, end) of c: of a's rows (a's columns when transposed)
      blas<T>(trans_a, trans_b, end - begin, n, k, a + (trans_a ? begin : begin * lda), lda, b, ldb,
              beta, c + begin * ldc, ldc);
    } else {  // columns [begin, end) of c: of b's columns (b's rows when transposed)
      blas<T>(trans_a, trans_b, m, end - begin, k, a, lda, b + (trans_b ? begin * ldb : begin), ldb,
              beta, c + begin, ldc);
    }
  });
}

namespace {

// The vector unit an OpenBLAS core's kernels use: 1 SSE, 2 AVX, 3 AVX2 + FMA, 4 AVX-512.
int vector_level(std::string_view core) {
  for (std::string_view c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return 4;
  for (std::string_view c : {"Haswell", "Zen"})
    if (core == c) return 3;
  for (std::string_view c : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    if (core == c) return 2;
  return 1;
}

}  // namespace

std::optional<std::string> wider_blas_core(std::string_view loaded, CpuVectors cpu) {
  const int have = vector_level(loaded);
  if (cpu.avx512 && have < 4) return "SkylakeX";
  if (cpu.avx2_fma && have < 3) return "Haswell";
  return std::nullopt;
}

std::string blas_core() { return openblas_get_corename(); }

std::optional<std::string> blas_core_to_restart_with() {
  if (std::getenv("OPENBLAS_CORETYPE")) return std::nullopt;
  CpuVectors cpu;
#if defined(__x86_64__)
  __builtin_cpu_init();
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return wider_blas_core(blas_core(), cpu);
}

template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*,
                           std::int64_t);

}  // namespace meshflow
