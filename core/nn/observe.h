/* observe.h: what the layers need to know about a forward's observer
 * (grove_observer, module.h).  Never installed.
 *
 * A layer that runs two children as one fused pass (Sequential's Linear then
 * ReLU) must not fuse them while an observer watches either one: each must
 * be called on its own through grove_module_forward so that the observer sees
 * the Linear's own output.  Fusion already stays off while any forward hook
 * is registered (grove__no_forward_hooks). */
#ifndef GROVE_CORE_OBSERVE_H
#define GROVE_CORE_OBSERVE_H

#include <stdbool.h>

#include "grove/module.h"

/* True when f's observer watches m (any kind).  False without observer, at
 * the cost of one pointer test. */
static inline bool grove__observes(const grove_fwd *f, const grove_module *m) {
  return f->observer && grove_observer_find(f->observer, m) >= 0;
}

#endif
