/* telemetry_rpc.c: the hook RPCs (RegisterHook, RemoveHook, ListHooks) and
 * the hook metrics of groved's forward-hook telemetry.  RPCs run on the NNG
 * thread that received them and change the registry under tel->mu; a
 * change stages a new hook table for the loop (telemetry.c). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry.h"

/* ================================================================ RPCs */

/* HookSpec and HookInfo of h; strings point into h (pack before unlocking). */
typedef struct info_tmp {
  Grove__HookSpec spec;
  Grove__HookInfo info;
  char note[256];
} info_tmp;

static void fill_info(srv_telemetry *tel, const tel_hook *h, info_tmp *t) {
  grove__hook_spec__init(&t->spec);
  grove__hook_info__init(&t->info);
  t->spec.model = tel->srv->models[h->model].name;
  t->spec.pattern = h->pattern;
  t->spec.kind = h->spec.kind == GROVE_OBSERVE_PRE ? GROVE__HOOK_KIND__HOOK_FORWARD_PRE
                                                   : GROVE__HOOK_KIND__HOOK_FORWARD;
  t->spec.every = h->spec.every;
  t->spec.sample_rate = h->spec.sample_rate;
  t->spec.histogram_bins = h->spec.bins;
  t->spec.histogram_min = h->spec.lo;
  t->spec.histogram_max = h->spec.hi;
  t->spec.per_feature = h->spec.per_feature;
  t->info.id = h->id;
  t->info.spec = &t->spec;
  t->info.n_modules = h->nmodules;
  t->info.modules = h->modules;
  t->info.version = h->version;
  t->info.events_published = atomic_load(&h->ctr->published);
  t->info.events_dropped = atomic_load(&h->ctr->dropped);
  if (h->nmodules == 0) {
    snprintf(t->note, sizeof t->note,
             "'%s' matches no module of version %" PRId64
             "; the hook stays registered and is resolved again at the next version",
             h->pattern, h->version);
    t->info.note = t->note;
  }
}

static nng_msg *pack_reply(srv_req *r, Grove__Reply *rep) {
  rep->protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rep->id = r->id;
  return grove__rpc_pack(rep);
}

static void send_packed(srv_req *r, nng_msg *msg) {
  if (msg)
    grove__rpc_send(r, msg, GROVE_OK);
  else
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory encoding the reply");
}

static grove_status check_spec(const Grove__HookSpec *sp, tel_spec *out, grove_err *err) {
  grove_status s = grove_module_pattern_check(sp->pattern ? sp->pattern : "", err);
  if (s) return s;
  if (sp->kind != GROVE__HOOK_KIND__HOOK_FORWARD && sp->kind != GROVE__HOOK_KIND__HOOK_FORWARD_PRE)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "spec.kind: %d is not a HookKind (0 forward, 1 forward_pre)", sp->kind);
  out->kind =
      sp->kind == GROVE__HOOK_KIND__HOOK_FORWARD_PRE ? GROVE_OBSERVE_PRE : GROVE_OBSERVE_POST;
  out->every = sp->every ? sp->every : 1;
  if (out->every > TEL_MAX_EVERY)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "spec.every: %u is more than %u batches",
                         sp->every, TEL_MAX_EVERY);
  out->sample_rate = sp->sample_rate == 0 ? 1.0 : sp->sample_rate;
  if (!(out->sample_rate > 0 && out->sample_rate <= 1.0))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "spec.sample_rate: %g is not in (0, 1] (0 means 1)", sp->sample_rate);
  out->bins = sp->histogram_bins;
  out->lo = sp->histogram_min;
  out->hi = sp->histogram_max;
  if (out->bins > TEL_MAX_BINS)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "spec.histogram_bins: %u is more than %u",
                         out->bins, TEL_MAX_BINS);
  if (out->bins && !(isfinite(out->lo) && isfinite(out->hi) && out->lo < out->hi))
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                         "spec.histogram_min/max: [%g, %g) is not a finite, non-empty range",
                         out->lo, out->hi);
  if (!out->bins) out->lo = out->hi = 0;
  out->per_feature = sp->per_feature;
  return GROVE_OK;
}

static void handle_register(srv_req *r) {
  srv_server *srv = r->srv;
  srv_telemetry *tel = srv->telemetry;
  const Grove__RegisterHookRequest *rq = r->msg->register_hook;
  const Grove__HookSpec *sp = rq ? rq->spec : NULL;
  if (!sp) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT, "register_hook.spec is missing");
    return;
  }
  if (!tel || !tel->enabled) {
    grove__rpc_reply_error(r, GROVE_E_FAILED_PRECONDITION, "forward-hook telemetry is off: %s",
                           tel ? tel->why_off : "not started");
    return;
  }
  srv_model *m = grove__registry_find(srv, sp->model);
  if (!m) {
    char names[512];
    grove__registry_names(srv, names, sizeof names);
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here (models: %s)",
                           sp->model ? sp->model : "", names);
    return;
  }
  grove_err err = {0};
  tel_spec spec;
  if (check_spec(sp, &spec, &err)) {
    grove__rpc_reply_error(r, GROVE_E_INVALID_ARGUMENT, "%s", grove_err_msg(&err));
    return;
  }
  srv_version *v = grove__model_acquire(m);
  if (!v) {
    grove__rpc_reply_error(r, GROVE_E_UNAVAILABLE, "model '%s' is not loaded: %s", m->name,
                           m->error ? m->error : "no version");
    return;
  }
  tel_hook *h = calloc(1, sizeof *h);
  tel_counters *ctr = calloc(1, sizeof *ctr);
  char *pattern = strdup(sp->pattern);
  if (!h || !ctr || !pattern) {
    free(h);
    free(ctr);
    free(pattern);
    grove__version_release(v);
    grove__rpc_reply_error(r, GROVE_E_NOMEM, "out of memory registering a hook");
    return;
  }
  h->model = m->index;
  h->pattern = pattern;
  h->spec = spec;
  h->ctr = ctr;
  grove_status s = GROVE_OK;
  nng_msg *msg = NULL;
  char names[1024] = "";
  size_t matched = 0;
  uint64_t id = 0;
  pthread_mutex_lock(&tel->mu);
  if (tel->nhooks >= TEL_MAX_HOOKS) {
    s = grove_err_set(&err, GROVE_E_RESOURCE_EXHAUSTED,
                      "groved holds %d hooks already; remove some (grove hook rm ID)",
                      TEL_MAX_HOOKS);
  } else if (tel->nhooks == tel->hooks_cap) {
    size_t cap = tel->hooks_cap ? 2 * tel->hooks_cap : 16;
    tel_hook **g = realloc(tel->hooks, cap * sizeof *g);
    if (!g)
      s = grove_err_set(&err, GROVE_E_NOMEM, "out of memory registering a hook");
    else {
      tel->hooks = g;
      tel->hooks_cap = cap;
    }
  }
  if (!s) {
    /* The new hook must match something now: a typo is answered at once. */
    grove_named_modules nm = {0};
    s = grove_module_named_modules(v->model->root, "", true, &nm, &err);
    size_t used = 0, inlined = 0;
    char inl[256] = "";
    for (size_t i = 0; !s && i < nm.n; i++) {
      if (grove__tel_observes(pattern, &nm.items[i])) {
        matched++;
      } else if (grove_module_pattern_match(pattern, nm.items[i].name)) {
        size_t u = strlen(inl);
        if (u + 1 < sizeof inl)
          snprintf(inl + u, sizeof inl - u, "%s'%s'", inlined ? ", " : "", nm.items[i].name);
        inlined++;
      }
      if (*nm.items[i].name && used + 1 < sizeof names) {
        int w =
            snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", nm.items[i].name);
        if (w > 0) used += (size_t)w;
      }
    }
    grove_named_modules_fini(&nm);
    if (!s && matched == 0 && inlined > 0)
      s = grove_err_set(&err, GROVE_E_UNSUPPORTED,
                        "pattern '%s' matches only module(s) whose forward the exporter traced "
                        "into their caller's graph (%s), which are never called and so never "
                        "fire; hook the modules they call",
                        pattern, inl);
    else if (!s && matched == 0)
      s = grove_err_set(&err, GROVE_E_NOT_FOUND,
                        "pattern '%s' matches no module of model %s version %" PRId64
                        " (its modules: %s; '**' matches them all, '' the model itself)",
                        pattern, m->name, v->number, names[0] ? names : "none");
  }
  if (!s) {
    h->id = tel->next_id++;
    tel->hooks[tel->nhooks++] = h;
    ctr->next_all = tel->all_ctr;
    tel->all_ctr = ctr;
    ctr = NULL;
    atomic_fetch_add(&tel->model_hooks[m->index], 1);
    if ((s = grove__tel_stage_table(tel, m->index, v)))
      grove_err_set(&err, s, "cannot build the hook table");
    /* The hook is registered even then (ListHooks shows it); the next
     * change or version builds the table again. */
    info_tmp it;
    fill_info(tel, h, &it);
    Grove__RegisterHookReply rr = GROVE__REGISTER_HOOK_REPLY__INIT;
    rr.hook = &it.info;
    Grove__Reply rep = GROVE__REPLY__INIT;
    rep.body_case = GROVE__REPLY__BODY_REGISTER_HOOK;
    rep.register_hook = &rr;
    msg = pack_reply(r, &rep);
    matched = h->nmodules;
    id = h->id;
    s = GROVE_OK;
  }
  pthread_mutex_unlock(&tel->mu);
  grove__version_release(v);
  if (s) {
    free(ctr);
    free(pattern);
    free(h);
    grove__rpc_reply_error(r, s, "%s", grove_err_msg(&err));
    return;
  }
  grove__slog(GROVE_LOG_INFO, "telemetry.hook_added",
              "hook %" PRIu64 " on model %s: %s '%s' matches %zu module%s, every %u batch%s%s", id,
              m->name, grove__tel_kind_name(spec.kind), sp->pattern, matched,
              matched == 1 ? "" : "s", spec.every, spec.every == 1 ? "" : "es",
              spec.sample_rate < 1 ? " (sampled)" : "");
  send_packed(r, msg);
}

static void handle_remove(srv_req *r) {
  srv_server *srv = r->srv;
  srv_telemetry *tel = srv->telemetry;
  uint64_t id = r->msg->remove_hook ? r->msg->remove_hook->hook_id : 0;
  if (!tel) {
    grove__rpc_reply_error(r, GROVE_E_FAILED_PRECONDITION, "forward-hook telemetry is off");
    return;
  }
  pthread_mutex_lock(&tel->mu);
  size_t at = tel->nhooks;
  for (size_t i = 0; i < tel->nhooks; i++)
    if (tel->hooks[i]->id == id) at = i;
  if (at == tel->nhooks) {
    pthread_mutex_unlock(&tel->mu);
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "no hook %" PRIu64 " (grove hook ls lists them)",
                           id);
    return;
  }
  tel_hook *h = tel->hooks[at];
  info_tmp it;
  fill_info(tel, h, &it);
  Grove__RemoveHookReply rr = GROVE__REMOVE_HOOK_REPLY__INIT;
  rr.hook = &it.info;
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.body_case = GROVE__REPLY__BODY_REMOVE_HOOK;
  rep.remove_hook = &rr;
  nng_msg *msg = pack_reply(r, &rep);
  memmove(&tel->hooks[at], &tel->hooks[at + 1], (tel->nhooks - at - 1) * sizeof *tel->hooks);
  tel->nhooks--;
  size_t mi = h->model;
  atomic_fetch_sub(&tel->model_hooks[mi], 1);
  srv_model *m = &srv->models[mi];
  srv_version *v = grove__model_acquire(m);
  grove_status s = GROVE_OK;
  if (v) {
    s = grove__tel_stage_table(tel, mi, v);
  } else {
    /* Nothing serves: no table at all until a version comes. */
    grove__telemetry_release(tel->pending[mi]);
    tel->pending[mi] = NULL;
    tel->pending_num[mi] = 0;
    tel->has_pending[mi] = true;
    atomic_store(&tel->dirty[mi], true);
  }
  pthread_mutex_unlock(&tel->mu);
  grove__version_release(v);
  if (s)
    grove__slog(GROVE_LOG_ERROR, "telemetry.table", "model %s: cannot rebuild its hook table (%s)",
                m->name, grove_status_name(s));
  grove__slog(GROVE_LOG_INFO, "telemetry.hook_removed",
              "hook %" PRIu64 " on model %s ('%s') removed", h->id, m->name, h->pattern);
  free(h->pattern);
  grove__tel_free_names(h->modules, h->nmodules);
  free(h);
  send_packed(r, msg);
}

static void handle_list(srv_req *r) {
  srv_server *srv = r->srv;
  srv_telemetry *tel = srv->telemetry;
  const char *model =
      r->msg->list_hooks && r->msg->list_hooks->model ? r->msg->list_hooks->model : "";
  srv_model *only = NULL;
  if (*model && !(only = grove__registry_find(srv, model))) {
    char names[512];
    grove__registry_names(srv, names, sizeof names);
    grove__rpc_reply_error(r, GROVE_E_NOT_FOUND, "model '%s' is not served here (models: %s)",
                           model, names);
    return;
  }
  Grove__ListHooksReply lr = GROVE__LIST_HOOKS_REPLY__INIT;
  Grove__Reply rep = GROVE__REPLY__INIT;
  rep.body_case = GROVE__REPLY__BODY_LIST_HOOKS;
  rep.list_hooks = &lr;
  if (!tel) {
    send_packed(r, pack_reply(r, &rep));
    return;
  }
  pthread_mutex_lock(&tel->mu);
  size_t n = 0;
  for (size_t i = 0; i < tel->nhooks; i++) n += !only || tel->hooks[i]->model == only->index;
  info_tmp *tmp = n ? calloc(n, sizeof *tmp) : NULL;
  Grove__HookInfo **ptrs = n ? calloc(n, sizeof *ptrs) : NULL;
  nng_msg *msg = NULL;
  bool ok = !n || (tmp && ptrs);
  if (ok) {
    size_t k = 0;
    for (size_t i = 0; i < tel->nhooks; i++) {
      if (only && tel->hooks[i]->model != only->index) continue;
      fill_info(tel, tel->hooks[i], &tmp[k]);
      ptrs[k] = &tmp[k].info;
      k++;
    }
    lr.n_hooks = n;
    lr.hooks = ptrs;
    msg = pack_reply(r, &rep);
  }
  pthread_mutex_unlock(&tel->mu);
  free(tmp);
  free(ptrs);
  send_packed(r, msg);
}

void grove__telemetry_handle(srv_req *r) {
  switch (r->msg->body_case) {
    case GROVE__REQUEST__BODY_REGISTER_HOOK:
      handle_register(r);
      return;
    case GROVE__REQUEST__BODY_REMOVE_HOOK:
      handle_remove(r);
      return;
    case GROVE__REQUEST__BODY_LIST_HOOKS:
      handle_list(r);
      return;
    default:
      grove__rpc_reply_error(r, GROVE_E_INTERNAL, "not a hook RPC");
      return;
  }
}

/* ================================================================ metrics */

void grove__telemetry_metrics(srv_server *srv, srv_text *b) {
  srv_telemetry *tel = srv->telemetry;
  char lab[512];
  grove__text_printf(b,
                     "# HELP grove_hooks Forward hooks registered, by model.\n"
                     "# TYPE grove_hooks gauge\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_hooks{model=\"%s\"} %d\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       tel ? atomic_load(&tel->model_hooks[i]) : 0);
  grove__text_printf(b,
                     "# HELP grove_hook_events_published_total Hook events sent on the PUB socket, "
                     "by model.\n# TYPE grove_hook_events_published_total counter\n");
  for (size_t i = 0; i < srv->nmodels; i++)
    grove__text_printf(b, "grove_hook_events_published_total{model=\"%s\"} %" PRIu64 "\n",
                       grove__prom_label(srv->models[i].name, lab, sizeof lab),
                       tel ? (uint64_t)atomic_load(&tel->published[i]) : 0);
  grove__text_printf(
      b,
      "# HELP grove_hook_events_dropped_total Hook events lost: reason=\"queue\" before "
      "the socket (the publisher fell behind), reason=\"subscriber\" at least this many "
      "not delivered to slow subscribers (summed over subscribers).\n"
      "# TYPE grove_hook_events_dropped_total counter\n");
  grove__text_printf(b, "grove_hook_events_dropped_total{reason=\"queue\"} %" PRIu64 "\n",
                     tel ? (uint64_t)atomic_load(&tel->dropped_queue) : 0);
  grove__text_printf(b, "grove_hook_events_dropped_total{reason=\"subscriber\"} %" PRIu64 "\n",
                     tel ? (uint64_t)atomic_load(&tel->dropped_subscriber) : 0);
  grove__text_printf(b,
                     "# HELP grove_hook_subscribers Connections to the PUB socket.\n"
                     "# TYPE grove_hook_subscribers gauge\ngrove_hook_subscribers %" PRId64 "\n",
                     tel ? (int64_t)atomic_load(&tel->subscribers) : 0);
}

grove_status grove__telemetry_rpc_start(srv_server *srv, grove_err *err) {
  (void)err;
  static const int bodies[] = {GROVE__REQUEST__BODY_REGISTER_HOOK, GROVE__REQUEST__BODY_REMOVE_HOOK,
                               GROVE__REQUEST__BODY_LIST_HOOKS};
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    grove__rpc_set_handler(srv, bodies[i], grove__telemetry_handle, false);
  grove__metrics_add_family(srv, grove__telemetry_metrics);
  return GROVE_OK;
}
