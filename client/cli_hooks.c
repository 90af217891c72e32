/* cli_hooks.c: the grove CLI's forward-hook telemetry commands, on
 * libgrove-client (grove_client_*_hook, grove_watch_*).
 *
 *   grove [--admin URL] hook add MODEL PATTERN [--stats LIST] [--every N]
 *                                 [--sample RATE] [--kind forward|forward_pre]
 *   grove [--admin URL] hook ls [MODEL] [--json]
 *   grove [--admin URL] hook rm ID
 *   grove [--pub URL] watch [MODEL[:PATTERN]] [--count N] [--seconds S] [--json]
 *
 * Same conventions as cli_remote.c, from cli_args.c (docs/cli.md): options
 * anywhere after the command as `--name value` or `--name=value` (each at
 * most once), `--` ends them; "grove: <reason>" on stderr; exit 0 ok, 1 the
 * server said no, 2 usage, 3 cannot reach the server.  watch draws a table
 * refreshed in place only when stdout is a terminal; otherwise (and with
 * --json) it prints one line per event, flushed at once, so that a pipe sees
 * each event as it comes. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_args.h"
#include "cli_connect.h"
#include "cli_hooks.h"
#include "cli_remote.h"
#include "grove/client.h"
#include "grove/grove.h"

#define DEFAULT_PUB "tcp://127.0.0.1:7702"
#define DEFAULT_BINS 32
#define DEFAULT_HIST_MIN (-8.0)
#define DEFAULT_HIST_MAX 8.0

static const char hook_help[] =
    "usage: grove hook add MODEL PATTERN [--stats LIST] [--every N] [--sample RATE]\n"
    "                      [--kind forward|forward_pre] [--timeout-ms N]\n"
    "       grove hook ls [MODEL] [--json] [--timeout-ms N]\n"
    "       grove hook rm ID [--timeout-ms N]\n"
    "Forward-hook telemetry (docs/telemetry.md): groved computes statistics of what\n"
    "the modules matching PATTERN compute on live traffic and publishes them on its\n"
    "PUB socket, where `grove watch` shows them.  A hook never changes a prediction.\n"
    "\n"
    "PATTERN is a dotted module path as in named_modules (\"1\", \"encoder.block.0\"; ''\n"
    "is the model itself) or a glob: * one path component, ** any number of them,\n"
    "? one character, [abc] one of a set (\"encoder.layers.*.linear1\", '**').\n"
    "  --stats LIST   basic (always: count, mean, std, min, max, abs_mean,\n"
    "                 zero_fraction, nan and inf counts), histogram[:BINS[:MIN:MAX]]\n"
    "                 (default 32 bins over [-8, 8)), per_feature (mean and std of\n"
    "                 each column of a 2-D tensor); comma-separated\n"
    "  --every N      one event per N observed batches (default 1)\n"
    "  --sample RATE  observe this fraction of batches, (0, 1] (default 1)\n"
    "  --kind K       forward: the module's output (default); forward_pre: its input\n"
    "add prints the new hook's id on stdout (what it matches on stderr); ls lists\n"
    "hooks, what each matches in the serving version, and its event counts; rm\n"
    "removes one.  Exit 0 ok, 1 the server said no, 2 usage, 3 unreachable.\n";

static const char watch_help[] =
    "usage: grove watch [MODEL[:PATTERN]] [--count N] [--seconds S] [--json]\n"
    "Shows the hook events groved publishes (grove --pub URL watch; default\n"
    "$GROVE_PUB, else " DEFAULT_PUB
    "): every model's, MODEL's, or those of\n"
    "the modules of MODEL matching PATTERN (a path or a glob, as in grove hook add).\n"
    "On a terminal: a table of the latest statistics per module, refreshed in place.\n"
    "Otherwise, or with --json: one line per event (--json: one JSON object with\n"
    "model, module, version, hook_id, kind, sequence, batches, rows, count, mean, std,\n"
    "min, max, abs_mean, zero_fraction, nan_count, inf_count, the interval, and the\n"
    "histogram and per-feature statistics when the hook asked for them).\n"
    "  --count N    exit after N events\n"
    "  --seconds S  exit after S seconds (status 1 when --count events did not come)\n"
    "Events are only published while a hook is registered (grove hook add).\n";

/* ============================================================ helpers */

/* JSON string (quotes included) on f. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

/* A JSON number; NaN and infinities (not JSON) as null. */
static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.17g", v);
  else
    fputs("null", f);
}

static const char *kind_name(grove_hook_kind k) {
  return k == GROVE_HOOK_FORWARD_PRE ? "forward_pre" : "forward";
}

/* ============================================================ hook */

/* --stats LIST into spec; 0 or EXIT_USAGE. */
static int parse_stats(const char *list, grove_hook_spec *spec) {
  static const char *const basic[] = {"basic",     "count",         "mean", "std",       "min",
                                      "max",       "abs_mean",      "nan",  "nan_count", "inf",
                                      "inf_count", "zero_fraction", NULL};
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    bool known = false;
    for (int i = 0; basic[i] && !known; i++) known = strcmp(tok, basic[i]) == 0;
    if (known) continue;
    if (strcmp(tok, "per_feature") == 0) {
      spec->per_feature = true;
      continue;
    }
    if (strncmp(tok, "histogram", 9) == 0 && (tok[9] == 0 || tok[9] == ':')) {
      unsigned long long bins = DEFAULT_BINS;
      double lo = DEFAULT_HIST_MIN, hi = DEFAULT_HIST_MAX;
      char *parts[4] = {0};
      int np = 0;
      for (char *s2 = NULL, *t = strtok_r(tok + 9, ":", &s2); t && np < 4;
           t = strtok_r(NULL, ":", &s2))
        parts[np++] = t;
      if (np == 2 || np > 3 || (np >= 1 && !grove__cli_u64(parts[0], 1, 1024, &bins)) ||
          (np == 3 &&
           (!grove__cli_double(parts[1], &lo) || !grove__cli_double(parts[2], &hi) || lo >= hi)))
        return grove__cli_usage("hook",
                                "--stats: '%s' is not histogram[:BINS[:MIN:MAX]] (BINS 1 to "
                                "1024, MIN < MAX)",
                                list);
      spec->histogram_bins = (uint32_t)bins;
      spec->histogram_min = lo;
      spec->histogram_max = hi;
      continue;
    }
    return grove__cli_usage("hook",
                            "--stats: unknown statistic '%s' (basic, histogram[:BINS[:MIN:MAX]], "
                            "per_feature)",
                            tok);
  }
  return 0;
}

static void stats_text(const grove_hook_info *h, char *buf, size_t n) {
  int w = snprintf(buf, n, "basic");
  if (h->histogram_bins && w > 0 && (size_t)w < n)
    w += snprintf(buf + w, n - (size_t)w, ",histogram:%u:%g:%g", h->histogram_bins,
                  h->histogram_min, h->histogram_max);
  if (h->per_feature && w > 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, ",per_feature");
}

static void print_modules(FILE *f, const grove_hook_info *h) {
  for (size_t k = 0; k < h->nmodules; k++)
    fprintf(f, "%s%s", k ? ", " : "", *h->modules[k] ? h->modules[k] : "''");
}

static void hook_json(const grove_hook_info *h) {
  char stats[256];
  stats_text(h, stats, sizeof stats);
  printf("{\"id\":%" PRIu64 ",\"model\":", h->id);
  json_str(stdout, h->model);
  printf(",\"pattern\":");
  json_str(stdout, h->pattern);
  printf(",\"kind\":\"%s\",\"every\":%u,\"sample_rate\":", kind_name(h->kind), h->every);
  json_num(stdout, h->sample_rate);
  printf(",\"stats\":");
  json_str(stdout, stats);
  printf(",\"version\":%" PRId64 ",\"modules\":[", h->version);
  for (size_t k = 0; k < h->nmodules; k++) {
    if (k) putchar(',');
    json_str(stdout, h->modules[k]);
  }
  printf("],\"events_published\":%" PRIu64 ",\"events_dropped\":%" PRIu64 ",\"note\":",
         h->events_published, h->events_dropped);
  json_str(stdout, h->note);
  printf("}\n");
}

/* The options of hook (one table for add, ls and rm). */
enum { H_HELP, H_TIMEOUT, H_STATS, H_EVERY, H_SAMPLE, H_KIND, H_JSON };

static int hook_add(grove_client *c, const grove__cli_args *p, int timeout) {
  if (p->npos != 3)
    return grove__cli_usage("hook", p->npos < 3 ? "add needs a MODEL and a PATTERN"
                                                : "add takes a MODEL and a PATTERN only");
  grove_hook_spec spec = {.model = p->pos[1], .pattern = p->pos[2]};
  grove_err err = {0};
  if (grove_module_pattern_check(spec.pattern, &err))
    return grove__cli_usage("hook", "%s", grove_err_msg(&err));
  int rc;
  if (p->val[H_STATS] && (rc = parse_stats(p->val[H_STATS], &spec))) return rc;
  unsigned long long every = 1;
  if (p->val[H_EVERY] && !grove__cli_u64(p->val[H_EVERY], 1, 1000000, &every))
    return grove__cli_usage("hook", "--every wants batches from 1 to 1000000, not '%s'",
                            p->val[H_EVERY]);
  spec.every = (uint32_t)every;
  double rate = 1.0;
  if (p->val[H_SAMPLE] && (!grove__cli_double(p->val[H_SAMPLE], &rate) || rate <= 0 || rate > 1))
    return grove__cli_usage("hook", "--sample wants a fraction in (0, 1], not '%s'",
                            p->val[H_SAMPLE]);
  spec.sample_rate = rate;
  const char *k = p->val[H_KIND];
  if (k && strcmp(k, "forward") && strcmp(k, "forward_pre") && strcmp(k, "pre"))
    return grove__cli_usage("hook", "--kind wants forward or forward_pre, not '%s'", k);
  spec.kind = k && strcmp(k, "forward") ? GROVE_HOOK_FORWARD_PRE : GROVE_HOOK_FORWARD;
  uint64_t id = 0;
  grove_hook_info *info = NULL;
  grove_status s = grove_client_register_hook(c, &spec, timeout, &id, &info, &err);
  if (s) return grove__cli_call_failed(s, &err, NULL);
  printf("%" PRIu64 "\n", id);
  fflush(stdout);
  fprintf(stderr, "hook %" PRIu64 ": %s '%s' on %s version %" PRId64 " matches %zu module%s: ", id,
          kind_name(info->kind), info->pattern, info->model, info->version, info->nmodules,
          info->nmodules == 1 ? "" : "s");
  print_modules(stderr, info);
  fputc('\n', stderr);
  grove_hook_info_free(info);
  return EXIT_OK;
}

static int hook_ls(grove_client *c, const grove__cli_args *p, int timeout, bool json) {
  if (p->npos > 2) return grove__cli_usage("hook", "ls takes at most a MODEL");
  grove_hook_info *hooks = NULL;
  size_t n = 0;
  grove_err err = {0};
  grove_status s =
      grove_client_list_hooks(c, p->npos == 2 ? p->pos[1] : NULL, timeout, &hooks, &n, &err);
  if (s) return grove__cli_call_failed(s, &err, NULL);
  if (!json && n == 0) printf("no hooks\n");
  for (size_t i = 0; i < n; i++) {
    const grove_hook_info *h = &hooks[i];
    if (json) {
      hook_json(h);
      continue;
    }
    char stats[256];
    stats_text(h, stats, sizeof stats);
    printf("hook %" PRIu64 ": model %s, %s '%s', every %u batch%s", h->id, h->model,
           kind_name(h->kind), h->pattern, h->every, h->every == 1 ? "" : "es");
    if (h->sample_rate > 0 && h->sample_rate < 1) printf(", sample %g", h->sample_rate);
    printf(", stats %s\n", stats);
    if (h->nmodules) {
      printf("  version %" PRId64 ": ", h->version);
      print_modules(stdout, h);
      printf(" (%zu module%s)\n", h->nmodules, h->nmodules == 1 ? "" : "s");
    } else {
      printf("  version %" PRId64 ": MATCHES NOTHING: %s\n", h->version, h->note);
    }
    printf("  events: %" PRIu64 " published, %" PRIu64 " dropped\n", h->events_published,
           h->events_dropped);
  }
  grove_hook_infos_free(hooks, n);
  return EXIT_OK;
}

static int hook_rm(grove_client *c, const grove__cli_args *p, int timeout) {
  if (p->npos != 2) return grove__cli_usage("hook", "rm needs exactly one hook ID");
  unsigned long long id;
  if (!grove__cli_u64(p->pos[1], 1, UINT64_MAX, &id))
    return grove__cli_usage("hook", "rm wants a hook id (a positive integer), not '%s'", p->pos[1]);
  grove_hook_info *h = NULL;
  grove_err err = {0};
  grove_status s = grove_client_remove_hook(c, id, timeout, &h, &err);
  if (s) return grove__cli_call_failed(s, &err, NULL);
  printf("removed hook %" PRIu64 " (model %s, %s '%s')\n", h->id, h->model, kind_name(h->kind),
         h->pattern);
  grove_hook_info_free(h);
  return EXIT_OK;
}

int grove__cli_hook(const char *server_url, int argc, char **argv) {
  static const grove__cli_opt defs[] = {[H_HELP] = {"help", 'h', GROVE__CLI_ONCE},
                                        [H_TIMEOUT] = {"timeout-ms", 0, GROVE__CLI_VALUE_ONCE},
                                        [H_STATS] = {"stats", 0, GROVE__CLI_VALUE_ONCE},
                                        [H_EVERY] = {"every", 0, GROVE__CLI_VALUE_ONCE},
                                        [H_SAMPLE] = {"sample", 0, GROVE__CLI_VALUE_ONCE},
                                        [H_KIND] = {"kind", 0, GROVE__CLI_VALUE_ONCE},
                                        [H_JSON] = {"json", 0, GROVE__CLI_ONCE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("hook", argc, argv, defs, hook_help, &p);
  if (rc >= 0) return rc;
  if (p.npos == 0) return grove__cli_usage("hook", "needs add, ls or rm");
  const char *sub = p.pos[0];
  bool add = strcmp(sub, "add") == 0, ls = strcmp(sub, "ls") == 0 || strcmp(sub, "list") == 0,
       rm = strcmp(sub, "rm") == 0 || strcmp(sub, "remove") == 0;
  if (!add && !ls && !rm)
    return grove__cli_usage("hook", "unknown subcommand '%s' (add, ls, rm)", sub);
  if (!add && (p.val[H_STATS] || p.val[H_EVERY] || p.val[H_SAMPLE] || p.val[H_KIND]))
    return grove__cli_usage("hook", "--stats, --every, --sample and --kind go with hook add");
  if (!ls && p.val[H_JSON]) return grove__cli_usage("hook", "--json goes with hook ls");
  unsigned long long timeout = 10000;
  if (p.val[H_TIMEOUT] && !grove__cli_u64(p.val[H_TIMEOUT], 1, 86400000, &timeout))
    return grove__cli_usage("hook", "--timeout-ms wants milliseconds, not '%s'", p.val[H_TIMEOUT]);
  grove_client *c = NULL;
  if ((rc = grove__cli_connect_admin(server_url, (int)timeout, &c))) return rc;
  rc = add  ? hook_add(c, &p, (int)timeout)
       : ls ? hook_ls(c, &p, (int)timeout, p.val[H_JSON] != NULL)
            : hook_rm(c, &p, (int)timeout);
  grove_client_close(c);
  return rc;
}

/* ============================================================ watch */

static const char *pub_url;

void grove_cli_remote_set_pub(const char *url) {
  pub_url = url;
}

static void event_json(const grove_hook_event *e) {
  printf("{\"model\":");
  json_str(stdout, e->model);
  printf(",\"module\":");
  json_str(stdout, e->module);
  printf(",\"version\":%" PRId64 ",\"hook_id\":%" PRIu64 ",\"kind\":\"%s\",\"sequence\":%" PRIu64
         ",\"worker\":%u,\"batches\":%" PRIu64 ",\"rows\":%" PRIu64 ",\"count\":%" PRIu64,
         e->version, e->hook_id, kind_name(e->kind), e->sequence, e->worker, e->batches, e->rows,
         e->count);
  static const char *const names[] = {"mean", "std", "min", "max", "abs_mean", "zero_fraction"};
  const double vals[] = {e->mean, e->std, e->min, e->max, e->abs_mean, e->zero_fraction};
  for (int i = 0; i < 6; i++) {
    printf(",\"%s\":", names[i]);
    json_num(stdout, vals[i]);
  }
  printf(",\"nan_count\":%" PRIu64 ",\"inf_count\":%" PRIu64 ",\"shape\":[", e->nan_count,
         e->inf_count);
  for (int d = 0; d < e->ndim; d++) printf("%s%" PRId64, d ? "," : "", e->shape[d]);
  printf("],\"start_unix_us\":%" PRId64 ",\"end_unix_us\":%" PRId64, e->start_unix_us,
         e->end_unix_us);
  if (e->nbins) {
    printf(",\"histogram\":{\"min\":");
    json_num(stdout, e->histogram_min);
    printf(",\"max\":");
    json_num(stdout, e->histogram_max);
    printf(",\"below\":%" PRIu64 ",\"above\":%" PRIu64 ",\"counts\":[", e->histogram_below,
           e->histogram_above);
    for (size_t i = 0; i < e->nbins; i++) printf("%s%" PRIu64, i ? "," : "", e->histogram[i]);
    printf("]}");
  }
  if (e->nfeatures) {
    printf(",\"feature_mean\":[");
    for (size_t i = 0; i < e->nfeatures; i++) {
      if (i) putchar(',');
      json_num(stdout, e->feature_mean[i]);
    }
    printf("],\"feature_std\":[");
    for (size_t i = 0; i < e->nfeatures; i++) {
      if (i) putchar(',');
      json_num(stdout, e->feature_std[i]);
    }
    printf("]");
  }
  printf("}\n");
}

static void event_line(const grove_hook_event *e) {
  printf("%s/%s v%" PRId64 " hook %" PRIu64 " %s #%" PRIu64 " batches=%" PRIu64 " rows=%" PRIu64
         " count=%" PRIu64
         " mean=%.6g std=%.6g min=%.6g max=%.6g abs_mean=%.6g zero=%.4f"
         " nan=%" PRIu64 " inf=%" PRIu64 "\n",
         e->model, *e->module ? e->module : "''", e->version, e->hook_id, kind_name(e->kind),
         e->sequence, e->batches, e->rows, e->count, e->mean, e->std, e->min, e->max, e->abs_mean,
         e->zero_fraction, e->nan_count, e->inf_count);
}

/* The terminal table: the latest event of each (model, module, hook). */
enum { TABLE_MAX = 256 };

typedef struct row {
  grove_hook_event ev;
  double at;
  uint64_t events;
} row;

typedef struct table {
  row rows[TABLE_MAX];
  size_t n;
  uint64_t total;
} table;

static void table_put(table *t, grove_hook_event *e) {
  size_t i = 0;
  for (; i < t->n; i++)
    if (t->rows[i].ev.hook_id == e->hook_id && strcmp(t->rows[i].ev.module, e->module) == 0 &&
        strcmp(t->rows[i].ev.model, e->model) == 0)
      break;
  if (i == t->n) {
    if (t->n == TABLE_MAX) {
      grove_hook_event_fini(e);
      return;
    }
    t->n++;
    t->rows[i].events = 0;
  } else {
    grove_hook_event_fini(&t->rows[i].ev);
  }
  t->rows[i].ev = *e;
  memset(e, 0, sizeof *e);
  t->rows[i].at = grove__cli_now_s();
  t->rows[i].events++;
  t->total++;
}

static void table_draw(const table *t, const char *url) {
  /* Home, clear to the end of the screen, then the table: the terminal
   * keeps its scrollback and the table stays in place. */
  printf("\x1b[H\x1b[J");
  printf("grove watch %s: %" PRIu64 " event%s (Ctrl-C stops)\n\n", url, t->total,
         t->total == 1 ? "" : "s");
  printf("%-28s %-11s %4s %5s %8s %11s %11s %11s %11s %11s %6s %5s %5s %5s\n", "MODULE", "KIND",
         "HOOK", "VER", "BATCHES", "MEAN", "STD", "MIN", "MAX", "MEAN|X|", "ZERO%", "NAN", "INF",
         "AGE");
  double now = grove__cli_now_s();
  for (size_t i = 0; i < t->n; i++) {
    const grove_hook_event *e = &t->rows[i].ev;
    char name[64];
    snprintf(name, sizeof name, "%s/%s", e->model, *e->module ? e->module : "''");
    printf("%-28.28s %-11s %4" PRIu64 " %5" PRId64 " %8" PRIu64
           " %11.4g %11.4g %11.4g %11.4g %11.4g %6.1f %5" PRIu64 " %5" PRIu64 " %4.0fs\n",
           name, kind_name(e->kind), e->hook_id, e->version, e->batches, e->mean, e->std, e->min,
           e->max, e->abs_mean, 100.0 * e->zero_fraction, e->nan_count, e->inf_count,
           now - t->rows[i].at);
  }
  fflush(stdout);
}

static void table_fini(table *t) {
  for (size_t i = 0; i < t->n; i++) grove_hook_event_fini(&t->rows[i].ev);
}

int grove__cli_watch(int argc, char **argv) {
  enum { W_HELP, W_COUNT, W_SECONDS, W_JSON };
  static const grove__cli_opt defs[] = {[W_HELP] = {"help", 'h', GROVE__CLI_ONCE},
                                        [W_COUNT] = {"count", 0, GROVE__CLI_VALUE_ONCE},
                                        [W_SECONDS] = {"seconds", 0, GROVE__CLI_VALUE_ONCE},
                                        [W_JSON] = {"json", 0, GROVE__CLI_ONCE},
                                        {NULL}};
  grove__cli_args p;
  int rc = grove__cli_parse("watch", argc, argv, defs, watch_help, &p);
  if (rc >= 0) return rc;
  if (p.npos > 1) return grove__cli_usage("watch", "unexpected argument '%s'", p.pos[1]);
  unsigned long long count = 0;
  if (p.val[W_COUNT] && !grove__cli_u64(p.val[W_COUNT], 1, UINT64_MAX, &count))
    return grove__cli_usage("watch", "--count wants a positive integer, not '%s'", p.val[W_COUNT]);
  double seconds = 0;
  if (p.val[W_SECONDS] &&
      (!grove__cli_double(p.val[W_SECONDS], &seconds) || seconds <= 0 || seconds > 1e7))
    return grove__cli_usage("watch", "--seconds wants a positive number, not '%s'",
                            p.val[W_SECONDS]);
  bool json = p.val[W_JSON] != NULL;

  /* MODEL[:PATTERN]: an exact path is one subscription; a glob subscribes
   * to the model and filters here, as groved resolves patterns. */
  char model[512] = "", pattern[512] = "";
  bool has_model = p.npos == 1, has_pattern = false;
  if (has_model) {
    const char *colon = strchr(p.pos[0], ':');
    size_t ml = colon ? (size_t)(colon - p.pos[0]) : strlen(p.pos[0]);
    if (ml == 0 || ml >= sizeof model)
      return grove__cli_usage("watch", "'%s' is not MODEL or MODEL:PATTERN", p.pos[0]);
    memcpy(model, p.pos[0], ml);
    if (colon) {
      has_pattern = true;
      snprintf(pattern, sizeof pattern, "%s", colon + 1);
      grove_err perr = {0};
      if (grove_module_pattern_check(pattern, &perr))
        return grove__cli_usage("watch", "%s", grove_err_msg(&perr));
    }
  }
  bool glob = has_pattern && strpbrk(pattern, "*?[\\") != NULL;
  const char *url = pub_url && *pub_url ? pub_url : getenv("GROVE_PUB");
  if (!url || !*url) url = DEFAULT_PUB;
  grove_watch *w = NULL;
  grove_err err = {0};
  grove_status s = grove_watch_open(url, has_model ? model : NULL,
                                    has_pattern && !glob ? pattern : NULL, &w, &err);
  if (s) return grove__cli_call_failed(s, &err, NULL);

  bool tty = !json && isatty(STDOUT_FILENO);
  static table t; /* large; one watch per process */
  memset(&t, 0, sizeof t);
  double end = seconds > 0 ? grove__cli_now_s() + seconds : 0, last_draw = 0;
  uint64_t got = 0;
  rc = EXIT_OK;
  if (tty) table_draw(&t, url);
  for (;;) {
    double now = grove__cli_now_s();
    if (end && now >= end) break;
    /* Short waits keep the table's ages moving and --seconds exact. */
    int wait_ms = 250;
    if (end && (end - now) * 1000 < wait_ms) wait_ms = (int)((end - now) * 1000) + 1;
    grove_hook_event ev;
    s = grove_watch_next(w, wait_ms, &ev, &err);
    if (s == GROVE_E_DEADLINE_EXCEEDED || s == GROVE_E_FORMAT) {
      if (tty && grove__cli_now_s() - last_draw > 0.25) {
        table_draw(&t, url);
        last_draw = grove__cli_now_s();
      }
      continue;
    }
    if (s) {
      rc = grove__cli_call_failed(s, &err, NULL);
      break;
    }
    if (glob && !grove_module_pattern_match(pattern, ev.module)) {
      grove_hook_event_fini(&ev);
      continue;
    }
    got++;
    if (json) {
      event_json(&ev);
      fflush(stdout);
    } else if (!tty) {
      event_line(&ev);
      fflush(stdout);
    }
    if (tty) {
      table_put(&t, &ev);
      if (grove__cli_now_s() - last_draw > 0.1 || (count && got >= count)) {
        table_draw(&t, url);
        last_draw = grove__cli_now_s();
      }
    }
    grove_hook_event_fini(&ev);
    if (count && got >= count) break;
  }
  if (rc == EXIT_OK && count && got < count)
    rc = grove__cli_fail(EXIT_REFUSED, "%" PRIu64 " of %llu events came within %g s", got, count,
                         seconds);
  table_fini(&t);
  if (count && got >= count) {
    /* Events may still be arriving, and NNG 1.5.2 can hang closing a SUB
     * socket then (nanomsg/nng#1543).  The process is done: leave the
     * socket to the kernel rather than risk hanging in the close. */
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  grove_watch_close(w);
  return rc;
}
