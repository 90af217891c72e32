/* cpu.c: which vector instruction sets this CPU runs (asked once, then
 * cached), for the kernels that pick a path at run time: the GEMM kernels
 * (gemm.c), the transposes, Winograd transforms and attention heads.
 * GROVE_GEMM=avx2 turns the AVX-512 paths off (tests and benchmarks of the
 * AVX2 kernel on an AVX-512 machine).  Split out of gemm.c.  Any thread. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

/* A CPU feature, asked once: 0 not asked yet, 1 no, 2 yes (threads asking
 * at once agree). */
static bool cpu_feature(_Atomic int *cached, bool (*ask)(void)) {
  int v = atomic_load_explicit(cached, memory_order_relaxed);
  if (!v) {
    v = ask() ? 2 : 1;
    atomic_store_explicit(cached, v, memory_order_relaxed);
  }
  return v == 2;
}

#if CPU_X86
static bool ask_avx512(void) {
  __builtin_cpu_init();
  const char *force = getenv("GROVE_GEMM");
  return __builtin_cpu_supports("avx512f") && !(force && strcmp(force, "avx2") == 0);
}

static bool ask_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

bool grove__cpu_avx512(void) {
#if CPU_X86
  static _Atomic int cached;
  return cpu_feature(&cached, ask_avx512);
#else
  return false;
#endif
}

bool grove__cpu_avx2(void) {
#if CPU_X86
  static _Atomic int cached;
  return cpu_feature(&cached, ask_avx2);
#else
  return false;
#endif
}
