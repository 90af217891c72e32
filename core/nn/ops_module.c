/* ops_module.c: the one torch.nn layer behind every op that has a module
 * (ReLU, Softmax(dim), Flatten(start_dim, end_dim), Dropout(p) ...): its
 * impl is the op's parameters bound once, at construction (the input a
 * reference to the call's one tensor, the constructor arguments where
 * their names say, the rest torch's defaults), and its forward is the op's
 * own, so a layer module and a graph node that mean the same operation run
 * the same code.  Above ops_args.c, below the family files whose module
 * types point here. */
#include <stdlib.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"

typedef struct opmod_impl {
  const grove__opdef *def;
  const grove__opmod *md; /* the class it was built as */
  int nargs;
  garg args[GROVE__OP_MAX_PARAMS];
} opmod_impl;

void grove__op_module_free(void *impl) {
  opmod_impl *p = impl;
  if (!p) return;
  for (int i = 0; i < p->nargs; i++) grove__garg_fini(&p->args[i]);
  free(p);
}

static int slot_of(const grove__opdef *d, const char *name) {
  for (int i = 0; i < GROVE__OP_MAX_PARAMS && d->p[i].name; i++)
    if (strcmp(d->p[i].name, name) == 0) return i;
  return -1;
}

/* *dst = a deep copy of src (its list items and string owned). */
static bool garg_copy(garg *dst, const garg *src) {
  *dst = *src;
  dst->s = NULL;
  dst->items = NULL;
  dst->n = 0;
  if (src->s && !(dst->s = strdup(src->s))) return false;
  if (src->n > 0) {
    if (!(dst->items = calloc((size_t)src->n, sizeof *dst->items))) return false;
    for (int i = 0; i < src->n; i++) {
      dst->n = i + 1;
      if (!garg_copy(&dst->items[i], &src->items[i])) return false;
    }
  }
  return true;
}

grove_status grove__op_module_new(const grove__opdef *d, const grove__opmod *md, const garg *args,
                                  int n, grove_module **out, grove_err *err) {
  *out = NULL;
  opmod_impl *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", md->cls);
  p->def = d;
  p->md = md;
  p->nargs = grove__op_nparams(d);
  const int nin = md->inputs > 1 ? md->inputs : 1;
  for (int i = 0; i < p->nargs; i++) {
    if (i < nin) { /* the call's inputs */
      p->args[i].kind = A_NODE;
      p->args[i].node = i;
      continue;
    }
    grove_status s = grove__op_default(&d->p[i], &p->args[i]);
    if (s == GROVE_E_SPEC) s = GROVE_OK; /* required: a constructor argument sets it */
    if (s) {
      grove__op_module_free(p);
      return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", md->cls);
    }
  }
  for (int k = 0; k < n; k++) {
    int i = slot_of(d, md->args[k].name);
    garg *a = &p->args[i];
    grove__garg_fini(a);
    if (!garg_copy(a, &args[k])) {
      grove__op_module_free(p);
      return grove_err_set(err, GROVE_E_NOMEM, "%s: out of memory", md->cls);
    }
  }
  return grove__layer_make(md->type, p, out, err);
}

grove_status grove__op_module_forward(const grove_module *m, grove_fwd *f, const grove_values *in,
                                      grove_values *out) {
  const opmod_impl *p = m->impl;
  const char *cls = p->md->cls;
  const int nin = p->md->inputs > 1 ? p->md->inputs : 1;
  if (in->n != nin)
    return grove_err_set(f->err, GROVE_E_INVALID_ARGUMENT, "%s: expected %d input tensor%s, got %d",
                         cls, nin, nin == 1 ? "" : "s", in->n);
  gval x[2] = {{0}};
  for (int i = 0; i < nin; i++) {
    for (int k = 0; k < GROVE_MAX_VALUES; k++) x[i].reg[k] = -1;
    grove__op_set_tensor(&x[i], &in->v[i]);
  }
  const grove__opctx c = {f, p->def, p->args, x, m, 0};
  gval res; /* the forward sets what it returns */
  res.kind = V_NONE;
  res.none_mask = 0;
  grove_status s = p->def->forward(&c, &res);
  if (s) return s;
  if (res.kind == V_TENSOR) {
    out->n = 1;
    out->v[0] = res.t[0];
  } else if (res.kind == V_TUPLE && !res.none_mask) {
    out->n = res.n;
    for (int k = 0; k < res.n; k++) out->v[k] = res.t[k];
  } else {
    return grove_err_set(f->err, GROVE_E_INTERNAL, "%s: the operation returned no tensor", cls);
  }
  return GROVE_OK;
}

const garg *grove__op_module_arg(const grove_module *m, const char *name) {
  if (!m || !m->type || m->type->forward != grove__op_module_forward) return NULL;
  const opmod_impl *p = m->impl;
  int i = slot_of(p->def, name);
  return i < 0 ? NULL : &p->args[i];
}
