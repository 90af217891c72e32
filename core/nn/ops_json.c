/* ops_json.c: the op table (ops.h) as JSON, which tools/grove_ops_json.c
 * writes to tools/grove_ops.json for the exporter (tools/grove_export.py
 * reads the torch spellings, parameter orders and module classes from it,
 * so the exporter and the C table never drift; `make test` fails when the
 * committed file is stale: mk/ops.mk, tests/check_ops.c). */
#include <jansson.h>

#include "ops.h"

static const char *kind_name(int k) {
  static const char *const names[] = {
      [P_TENSOR] = "tensor", [P_TENSORS] = "tensors", [P_ANY] = "any",     [P_INT] = "int",
      [P_INTS] = "ints",     [P_FLOAT] = "float",     [P_NUMBER] = "number", [P_OPERAND] = "tensor_or_number", [P_BOOL] = "bool",
      [P_STR] = "str",       [P_DTYPE] = "dtype",     [P_INDEX] = "index", [P_IGNORED] = "ignored",
  };
  return k >= 0 && k <= P_IGNORED ? names[k] : "?";
}

static json_t *param_json(const grove__oppar *p) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(p->name));
  json_object_set_new(o, "kind", json_string(kind_name(p->kind)));
  switch (p->dk) {
    case D_REQ:
      json_object_set_new(o, "required", json_true());
      break;
    case D_NONE:
      json_object_set_new(o, "default", json_null());
      break;
    case D_INT:
      json_object_set_new(o, "default", json_integer((json_int_t)p->dv));
      break;
    case D_FLOAT:
      json_object_set_new(o, "default", json_real(p->dv));
      break;
    case D_BOOL:
      json_object_set_new(o, "default", json_boolean(p->dv != 0));
      break;
    case D_STR:
      json_object_set_new(o, "default", json_string(p->ds));
      break;
  }
  if (p->key) json_object_set_new(o, "key", json_string(p->key));
  if (p->choices) {
    json_t *c = json_array();
    for (int i = 0; p->choices[i]; i++) json_array_append_new(c, json_string(p->choices[i]));
    json_object_set_new(o, "choices", c);
  }
  return o;
}

json_t *grove__ops_json(void) {
  int n;
  const grove__opdef *const *t = grove__ops(&n);
  json_t *root = json_object(), *ops = json_array();
  json_object_set_new(root, "generated_by",
                      json_string("tools/grove_ops_json.c from the op table (core/nn/ops_*.c); "
                                  "regenerate with `make ops-json`, never edit"));
  for (int i = 0; i < n; i++) {
    const grove__opdef *d = t[i];
    json_t *o = json_object(), *ps = json_array(), *sp = json_array();
    json_object_set_new(o, "name", json_string(d->name));
    if (d->alias) json_object_set_new(o, "alias", json_string(d->alias));
    for (int k = 0; k < grove__op_nparams(d); k++) json_array_append_new(ps, param_json(&d->p[k]));
    json_object_set_new(o, "params", ps);
    json_object_set_new(o, "varargs",
                        d->varargs >= 0 ? json_string(d->p[d->varargs].name) : json_null());
    for (int k = 0; d->torch && d->torch[k]; k++) json_array_append_new(sp, json_string(d->torch[k]));
    json_object_set_new(o, "torch", sp);
    /* "module": the first class; "more_modules": the rest of its chain
     * (ConstantPad2d, ZeroPad2d, ... after ConstantPad1d). */
    json_t *more = json_array();
    for (const grove__opmod *md = d->module; md; md = md->next) {
      json_t *m = json_object(), *as = json_array();
      json_object_set_new(m, "class", json_string(md->cls));
      for (int k = 0; k < GROVE__OPMOD_MAX_ARGS && md->args[k].name; k++)
        json_array_append_new(as, param_json(&md->args[k]));
      json_object_set_new(m, "args", as);
      if (md->inputs > 1) json_object_set_new(m, "inputs", json_integer(md->inputs));
      if (md == d->module)
        json_object_set_new(o, "module", m);
      else
        json_array_append_new(more, m);
    }
    if (json_array_size(more))
      json_object_set_new(o, "more_modules", more);
    else
      json_decref(more);
    if (d->module_only) json_object_set_new(o, "module_only", json_true());
    json_array_append_new(ops, o);
  }
  json_object_set_new(root, "ops", ops);
  return root;
}
