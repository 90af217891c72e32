/* yield.c: background threads that step aside while they compute.
 *
 * groved runs two kinds of long computation beside predict's workers: a
 * reload's build (server/reload.c) and a training session's steps
 * (server/train.c).  Both run at a lower priority (SCHED_IDLE, nice 10),
 * meant to take only CPU that no worker wants.  On the kernels we serve on
 * that is not enough: a request's NNG threads and the workers, woken onto the
 * core such a thread held, waited for it for up to a scheduler tick (4 ms at
 * HZ=250).  perf sched showed wake-up delays of 1 to 3 ms (the kernel did not
 * preempt the low-priority thread on their wake-up), and the p99 of a reload
 * storm doubled.  A spinning loop in the build's place did the same, so it
 * was the scheduling, not the build's memory traffic; a build that called
 * sched_yield() every 100 us did not.
 *
 * So a thread made a background one (grove_thread_yield_every) calls
 * sched_yield() from Grove's long loops once its interval has passed:
 * whatever waits on that core runs, and when nothing waits the call returns
 * at once (0.6 us here).  The yield points sit where a stretch of work ends
 * every few tens of microseconds: each panel of a matrix product and of its
 * packing, each module's forward and backward, each graph node, each
 * parameter's optimizer update, each megabyte of a checkpoint's CRC.  A
 * timer signal instead would reach every line, OpenBLAS's included, but one
 * cost 23 us in this VM (the timer's exits and the AVX-512 state saved for
 * the handler): 23 % of the build at 100 us.  A yield point costs a
 * thread-local load on every other thread. */
#include <sched.h>
#include <time.h>

#include "base.h"

_Thread_local int64_t grove__yield_every_ns;
static _Thread_local int64_t next_ns;
static _Thread_local long count;

int64_t grove__clock_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void grove__yield_due(void) {
  if (grove__clock_ns() < next_ns) return;
  sched_yield();
  count++;
  next_ns = grove__clock_ns() + grove__yield_every_ns;
}

void grove_thread_yield_every(int interval_us) {
  grove__yield_every_ns = interval_us > 0 ? (int64_t)interval_us * 1000 : 0;
  next_ns = grove__clock_ns() + grove__yield_every_ns;
}

long grove_thread_yields(void) {
  return count;
}
