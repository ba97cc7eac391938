// MESHFLOW_VECTOR_CLONES, written before a function's declaration, builds the function once per
// x86-64 vector unit (AVX-512F, AVX2, and the SSE2 every x86-64 has) and has the loader pick the
// widest this CPU runs, once, when the program starts (GCC's and Clang's target_clones): the
// compiler's vectorised loops then use 16 floats a register where the CPU has them, and the
// same binary runs on any x86-64. Not for templates (Clang cannot clone them): a template
// calls a cloned float loop. Elsewhere (no x86-64, no ELF loader) it is empty, and under
// ThreadSanitizer too: it instruments the function that picks the copy, which the loader calls
// before the sanitizer's runtime has started (a crash at load).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define MESHFLOW_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MESHFLOW_THREAD_SANITIZER 1
#endif
#endif

#if defined(__x86_64__) && defined(__ELF__) && defined(__linux__) && \
    !defined(MESHFLOW_THREAD_SANITIZER)
#define MESHFLOW_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MESHFLOW_VECTOR_CLONES
#endif
