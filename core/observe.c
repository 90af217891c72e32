/* observe.c: the per-call observer of a forward (grove_observer, module.h).
 *
 * grove_module_forward asks, for each module it calls while an observer is
 * set, whether the observer watches that module.  The answer is a binary
 * search over the observer's sorted module pointers: no allocation, no lock,
 * and O(log n) for n watched modules (an observer on every module of a
 * thousand-module tree costs ten comparisons per call). */
#include <stdint.h>

#include "grove/module.h"

long grove_observer_find(const grove_observer *o, const grove_module *m) {
  if (!o || o->n == 0) return -1;
  uintptr_t key = (uintptr_t)m;
  size_t lo = 0, hi = o->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    uintptr_t v = (uintptr_t)o->modules[mid];
    if (v == key) return (long)mid;
    if (v < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}
