/* grove.h: the whole public API of libgrove. */
#ifndef GROVE_GROVE_H
#define GROVE_GROVE_H

#include "grove/arena.h"
#include "grove/checkpoint.h"
#include "grove/layers.h"
#include "grove/log.h"
#include "grove/model.h"
#include "grove/module.h"
#include "grove/state_dict.h"
#include "grove/status.h"
#include "grove/tensor.h"
#include "grove/train.h"

#define GROVE_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads one forward may use for its matrix products (the BLAS threads).
 * Process-wide: set it once, before forwards run, so that workers x threads
 * never exceeds the cores given.  n < 1 means 1.  Default: 1.  It also sets
 * OpenBLAS's thread count, and starts n - 1 helper threads for Grove's own
 * kernel (joined at exit; a forked child runs on one thread until this is
 * called again).  Concurrent forwards each take a pool of helpers; the
 * first time a further one runs concurrently it starts another pool (once). */
void grove_set_compute_threads(int n);
int grove_compute_threads(void);
/* Makes the calling thread compute alone (true) or with the compute helpers
 * again (false, the default): alone, its forwards never hand chunks to a
 * pool of helpers nor start one.  For a thread at idle priority (groved's
 * reload builds): helpers doing its chunks would run its work at their
 * priority, and a pool it started would keep its priority for the workers
 * that take the pool later.  Affects the calling thread only. */
void grove_thread_compute_alone(bool alone);
/* The cores this process may run on: its affinity mask's count (a
 * container's or taskset's limit), else the online CPUs; at least 1.  What
 * groved and grove use for their default thread counts.  Any thread. */
int grove_available_cores(void);
/* The matrix kernel Linear layers packed from now on run: "avx512",
 * "avx2" (CPUs without AVX-512) or "blas" (OpenBLAS: other CPUs, or
 * GROVE_GEMM=blas); GROVE_GEMM=avx2 forces "avx2" where the CPU has it.  A
 * static string.  Any thread. */
const char *grove_compute_kernel(void);

/* Makes the calling thread a background one: while it computes in Grove
 * (matrix products and their packing, module forwards and backwards, graph
 * nodes, optimizer updates, checkpoint checks) it calls sched_yield() at
 * least every interval_us, so that threads woken onto its core run without
 * waiting for the scheduler's tick (core/base/yield.c says why; OpenBLAS's own
 * loops have no yield points).  0 makes it a foreground thread again, the
 * default.  Affects the calling thread only; call it from that thread.
 * grove_thread_yields: how many times the calling thread has yielded. */
void grove_thread_yield_every(int interval_us);
long grove_thread_yields(void);

#ifdef __cplusplus
}
#endif

#endif
