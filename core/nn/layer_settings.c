/* layer_settings.c: a layer's constructor settings (layers_internal.h,
 * grove__layer_settings) from the module its builder made: the op modules'
 * bound arguments (ops_module.c) and each layer file's accessor.  The
 * training replica reads them here, so model.json is decoded once, by the
 * builders.  Above the layer files and ops_module.c. */
#include <math.h>
#include <string.h>

#include "layers_internal.h"
#include "ops.h"

/* An op module's bound argument as a number (its default when unbound). */
static double op_num(const grove_module *m, const char *name, double dflt) {
  const garg *a = grove__op_module_arg(m, name);
  if (!a) return dflt;
  return a->kind == A_FLOAT ? a->f : a->kind == A_INT || a->kind == A_BOOL ? (double)a->i : dflt;
}

static void op_settings(const grove_module *m, grove__layer_settings *s) {
  s->slope = op_num(m, "negative_slope", 0.01);
  const garg *ap = grove__op_module_arg(m, "approximate");
  s->tanh_approx = ap && ap->kind == A_STR && strcmp(ap->s, "tanh") == 0;
  const garg *dim = grove__op_module_arg(m, "dim");
  s->has_dim = dim && dim->kind == A_INT;
  s->dim = s->has_dim ? (int)dim->i : 0;
  s->start_dim = (int)op_num(m, "start_dim", 1);
  s->end_dim = (int)op_num(m, "end_dim", -1);
  s->p = op_num(m, "p", 0.5);
}

bool grove__layer_settings_of(const grove_module *m, grove__layer_settings *s) {
  memset(s, 0, sizeof *s);
  s->padding_idx = -1;
  const grove_module_type *ty = m->type;
  if (ty->forward == grove__op_module_forward)
    op_settings(m, s);
  else if (ty == &grove__conv1d_type || ty == &grove__conv2d_type)
    grove__conv_settings(m, s);
  else if (ty == &grove__batch_norm1d_type || ty == &grove__batch_norm2d_type)
    grove__bn_settings(m, s);
  else if (ty == &grove__layer_norm_type)
    grove__ln_settings(m, s);
  else if (ty == &grove__max_pool2d_type || ty == &grove__avg_pool2d_type ||
           ty == &grove__adaptive_avg_pool2d_type)
    grove__pool_settings(m, s);
  else if (ty == &grove__embedding_type)
    grove__embedding_settings(m, s);
  else if (ty == &grove__mha_type)
    grove__mha_settings(m, s);
  else if (ty == &grove__tel_type)
    grove__tel_settings(m, s);
  else
    return false;
  return true;
}
