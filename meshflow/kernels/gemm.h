// Matrix products through OpenBLAS's cblas_sgemm / cblas_dgemm. OpenBLAS itself runs
// single-threaded: every device already is a thread (or an MPI process) of its own, and
// OpenBLAS's one process-wide thread pool would make devices contend for it. A device with a
// team of threads (kernels/parallel.h) splits a large product instead: the result's rows (or,
// when it has more columns than rows, its columns) into one block per thread, each a GEMM of its
// own on the operands' memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace meshflow {

// c[m, n] = op(a) @ op(b) + beta * c, row-major with leading dims lda, ldb, ldc; op(a) is
// a[m, k], or aᵀ of a[k, m] when trans_a (likewise b: [k, n], or [n, k] when trans_b).
template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);

// OpenBLAS chooses its kernels by CPU model when it loads. Debian 12's OpenBLAS 0.3.21 falls
// back to its SSE3 kernels ("Prescott") on models newer than it knows, though their vector units
// are those of models it does know: on an Emerald Rapids Xeon (AVX-512) its GEMM then runs 5-7x
// below the SkylakeX kernels. The kernels are fixed for the process once loaded; only
// OpenBLAS's own OPENBLAS_CORETYPE, read as it loads, chooses others.

// Returns the OPENBLAS_CORETYPE for the widest vector unit of a CPU with these features
// ("SkylakeX" for AVX-512 F, BW, DQ and VL; "Haswell" for AVX2 and FMA) when it is wider than
// that of OpenBLAS's `loaded` core, else nothing.
struct CpuVectors {
  bool avx512 = false;    // F, BW, DQ and VL
  bool avx2_fma = false;  // AVX2 and FMA
};
std::optional<std::string> wider_blas_core(std::string_view loaded, CpuVectors cpu);

// Returns wider_blas_core for the loaded OpenBLAS and this CPU, or nothing where
// OPENBLAS_CORETYPE is already set (the user's choice, or a restart's). The meshflow command
// restarts itself with it (cli/main.cc) before anything else runs.
std::optional<std::string> blas_core_to_restart_with();

// Returns the name of OpenBLAS's loaded kernels ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core();

}  // namespace meshflow
