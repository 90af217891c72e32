/* cli_hooks.c: the grove CLI's forward-hook telemetry commands, on
 * libgrove-client (grove_client_*_hook, grove_watch_*).
 *
 *   grove [--server URL] hook add MODEL PATTERN [--stats LIST] [--every N]
 *                                 [--sample RATE] [--kind forward|forward_pre]
 *   grove [--server URL] hook ls [MODEL] [--json]
 *   grove [--server URL] hook rm ID
 *   grove [--pub URL] watch [MODEL[:PATTERN]] [--count N] [--seconds S] [--json]
 *
 * Same conventions as cli_remote.c (docs/cli.md): options anywhere after the
 * command as `--name value` or `--name=value`, `--` ends them; "grove:
 * <reason>" on stderr; exit 0 ok, 1 the server said no, 2 usage, 3 cannot
 * reach the server.  watch draws a table refreshed in place only when
 * stdout is a terminal; otherwise (and with --json) it prints one line per
 * event, flushed at once, so that a pipe sees each event as it comes. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_hooks.h"
#include "cli_remote.h"
#include "grove/client.h"
#include "grove/grove.h"

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

#define DEFAULT_SERVER "tcp://127.0.0.1:7700"
#define DEFAULT_PUB "tcp://127.0.0.1:7702"
#define MAX_ARGS 64
#define MAX_URLS 16
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

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("grove: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return code;
}

static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "grove %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nTry 'grove %s --help'.\n", cmd);
  va_end(ap);
  return EXIT_USAGE;
}

static int call_failed(grove_status s, const grove_err *err) {
  bool local = grove_client_failed_locally(s, err);
  int code = local && (s == GROVE_E_UNAVAILABLE || s == GROVE_E_DEADLINE_EXCEEDED)
                 ? EXIT_UNREACHABLE
                 : EXIT_REFUSED;
  if (local) return fail(code, "%s", grove_err_msg(err) + strlen("grove client: "));
  return fail(code, "%s: %s", grove_status_name(s), grove_err_msg(err));
}

typedef struct opt_def {
  const char *name;
  bool has_value;
} opt_def;

typedef struct parsed {
  int npos;
  const char *pos[MAX_ARGS];
  const char *val[16]; /* per def: the value ("" for a flag), NULL when absent */
} parsed;

/* --name value, --name=value, -h; 0 or EXIT_USAGE (message printed). */
static int parse_args(const char *cmd, int argc, char **argv, const opt_def *defs, parsed *p) {
  memset(p, 0, sizeof *p);
  bool only_pos = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || a[1] == 0) {
      if (p->npos == MAX_ARGS) return usage_error(cmd, "too many arguments");
      p->pos[p->npos++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    const char *name = a[1] == '-' ? a + 2 : strcmp(a, "-h") == 0 ? "help" : NULL;
    if (!name) return usage_error(cmd, "unknown option '%s'", a);
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int d = -1;
    for (int k = 0; defs[k].name; k++)
      if (strlen(defs[k].name) == len && strncmp(defs[k].name, name, len) == 0) d = k;
    if (d < 0) return usage_error(cmd, "unknown option '%s'", a);
    if (p->val[d]) return usage_error(cmd, "option '--%s' given twice", defs[d].name);
    if (!defs[d].has_value) {
      if (eq) return usage_error(cmd, "option '--%s' takes no value", defs[d].name);
      p->val[d] = "";
    } else if (eq) {
      p->val[d] = eq + 1;
    } else {
      if (i + 1 == argc) return usage_error(cmd, "option '%s' needs a value", a);
      p->val[d] = argv[++i];
    }
  }
  return 0;
}

static bool parse_u64(const char *s, unsigned long long lo, unsigned long long hi,
                      unsigned long long *out) {
  if (!s || !*s || *s == '-') return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static bool parse_double(const char *s, double *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

static int connect_to(const char *server_url, int timeout_ms, grove_client **out) {
  const char *spec = server_url;
  if (!spec || !*spec) spec = getenv("GROVE_SERVER");
  if (!spec || !*spec) spec = DEFAULT_SERVER;
  char buf[2048];
  snprintf(buf, sizeof buf, "%s", spec);
  const char *urls[MAX_URLS];
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < MAX_URLS;
       tok = strtok_r(NULL, ",", &save))
    if (*tok) urls[n++] = tok;
  if (n == 0) return fail(EXIT_USAGE, "--server: no URL in '%s'", spec);
  grove_client_opts o = {.default_timeout_ms = timeout_ms};
  grove_err err = {0};
  grove_status s = grove_client_open(urls, n, &o, out, &err);
  if (s) return call_failed(s, &err);
  return 0;
}

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
      if (np == 2 || np > 3 || (np >= 1 && !parse_u64(parts[0], 1, 1024, &bins)) ||
          (np == 3 && (!parse_double(parts[1], &lo) || !parse_double(parts[2], &hi) || lo >= hi)))
        return usage_error("hook",
                           "--stats: '%s' is not histogram[:BINS[:MIN:MAX]] (BINS 1 to "
                           "1024, MIN < MAX)",
                           list);
      spec->histogram_bins = (uint32_t)bins;
      spec->histogram_min = lo;
      spec->histogram_max = hi;
      continue;
    }
    return usage_error("hook",
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

static int hook_add(grove_client *c, const parsed *p, int timeout) {
  enum { O_STATS = 2, O_EVERY, O_SAMPLE, O_KIND };
  if (p->npos != 3)
    return usage_error("hook", p->npos < 3 ? "add needs a MODEL and a PATTERN"
                                           : "add takes a MODEL and a PATTERN only");
  grove_hook_spec spec = {.model = p->pos[1], .pattern = p->pos[2]};
  grove_err err = {0};
  if (grove_module_pattern_check(spec.pattern, &err))
    return usage_error("hook", "%s", grove_err_msg(&err));
  int rc;
  if (p->val[O_STATS] && (rc = parse_stats(p->val[O_STATS], &spec))) return rc;
  unsigned long long every = 1;
  if (p->val[O_EVERY] && !parse_u64(p->val[O_EVERY], 1, 1000000, &every))
    return usage_error("hook", "--every wants batches from 1 to 1000000, not '%s'",
                       p->val[O_EVERY]);
  spec.every = (uint32_t)every;
  double rate = 1.0;
  if (p->val[O_SAMPLE] && (!parse_double(p->val[O_SAMPLE], &rate) || rate <= 0 || rate > 1))
    return usage_error("hook", "--sample wants a fraction in (0, 1], not '%s'", p->val[O_SAMPLE]);
  spec.sample_rate = rate;
  const char *k = p->val[O_KIND];
  if (k && strcmp(k, "forward") && strcmp(k, "forward_pre") && strcmp(k, "pre"))
    return usage_error("hook", "--kind wants forward or forward_pre, not '%s'", k);
  spec.kind = k && strcmp(k, "forward") ? GROVE_HOOK_FORWARD_PRE : GROVE_HOOK_FORWARD;
  uint64_t id = 0;
  grove_hook_info *info = NULL;
  grove_status s = grove_client_register_hook(c, &spec, timeout, &id, &info, &err);
  if (s) return call_failed(s, &err);
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

static int hook_ls(grove_client *c, const parsed *p, int timeout, bool json) {
  if (p->npos > 2) return usage_error("hook", "ls takes at most a MODEL");
  grove_hook_info *hooks = NULL;
  size_t n = 0;
  grove_err err = {0};
  grove_status s =
      grove_client_list_hooks(c, p->npos == 2 ? p->pos[1] : NULL, timeout, &hooks, &n, &err);
  if (s) return call_failed(s, &err);
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

static int hook_rm(grove_client *c, const parsed *p, int timeout) {
  if (p->npos != 2) return usage_error("hook", "rm needs exactly one hook ID");
  unsigned long long id;
  if (!parse_u64(p->pos[1], 1, UINT64_MAX, &id))
    return usage_error("hook", "rm wants a hook id (a positive integer), not '%s'", p->pos[1]);
  grove_hook_info *h = NULL;
  grove_err err = {0};
  grove_status s = grove_client_remove_hook(c, id, timeout, &h, &err);
  if (s) return call_failed(s, &err);
  printf("removed hook %" PRIu64 " (model %s, %s '%s')\n", h->id, h->model, kind_name(h->kind),
         h->pattern);
  grove_hook_info_free(h);
  return EXIT_OK;
}

int grove__cli_hook(const char *server_url, int argc, char **argv) {
  static const opt_def defs[] = {{"help", false}, {"timeout-ms", true}, {"stats", true},
                                 {"every", true}, {"sample", true},     {"kind", true},
                                 {"json", false}, {NULL, false}};
  parsed p;
  int rc = parse_args("hook", argc, argv, defs, &p);
  if (rc) return rc;
  if (p.val[0]) {
    fputs(hook_help, stdout);
    return EXIT_OK;
  }
  if (p.npos == 0) return usage_error("hook", "needs add, ls or rm");
  const char *sub = p.pos[0];
  bool add = strcmp(sub, "add") == 0, ls = strcmp(sub, "ls") == 0 || strcmp(sub, "list") == 0,
       rm = strcmp(sub, "rm") == 0 || strcmp(sub, "remove") == 0;
  if (!add && !ls && !rm) return usage_error("hook", "unknown subcommand '%s' (add, ls, rm)", sub);
  if (!add && (p.val[2] || p.val[3] || p.val[4] || p.val[5]))
    return usage_error("hook", "--stats, --every, --sample and --kind go with hook add");
  if (!ls && p.val[6]) return usage_error("hook", "--json goes with hook ls");
  unsigned long long timeout = 10000;
  if (p.val[1] && !parse_u64(p.val[1], 1, 86400000, &timeout))
    return usage_error("hook", "--timeout-ms wants milliseconds, not '%s'", p.val[1]);
  grove_client *c = NULL;
  if ((rc = connect_to(server_url, (int)timeout, &c))) return rc;
  rc = add  ? hook_add(c, &p, (int)timeout)
       : ls ? hook_ls(c, &p, (int)timeout, p.val[6] != NULL)
            : hook_rm(c, &p, (int)timeout);
  grove_client_close(c);
  return rc;
}

/* ============================================================ watch */

static const char *pub_url;

void grove_cli_remote_set_pub(const char *url) {
  pub_url = url;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
  t->rows[i].at = now_s();
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
  double now = now_s();
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
  static const opt_def defs[] = {
      {"help", false}, {"count", true}, {"seconds", true}, {"json", false}, {NULL, false}};
  parsed p;
  int rc = parse_args("watch", argc, argv, defs, &p);
  if (rc) return rc;
  if (p.val[0]) {
    fputs(watch_help, stdout);
    return EXIT_OK;
  }
  if (p.npos > 1) return usage_error("watch", "unexpected argument '%s'", p.pos[1]);
  unsigned long long count = 0;
  if (p.val[1] && !parse_u64(p.val[1], 1, UINT64_MAX, &count))
    return usage_error("watch", "--count wants a positive integer, not '%s'", p.val[1]);
  double seconds = 0;
  if (p.val[2] && (!parse_double(p.val[2], &seconds) || seconds <= 0 || seconds > 1e7))
    return usage_error("watch", "--seconds wants a positive number, not '%s'", p.val[2]);
  bool json = p.val[3] != NULL;

  /* MODEL[:PATTERN]: an exact path is one subscription; a glob subscribes
   * to the model and filters here, as groved resolves patterns. */
  char model[512] = "", pattern[512] = "";
  bool has_model = p.npos == 1, has_pattern = false;
  if (has_model) {
    const char *colon = strchr(p.pos[0], ':');
    size_t ml = colon ? (size_t)(colon - p.pos[0]) : strlen(p.pos[0]);
    if (ml == 0 || ml >= sizeof model)
      return usage_error("watch", "'%s' is not MODEL or MODEL:PATTERN", p.pos[0]);
    memcpy(model, p.pos[0], ml);
    if (colon) {
      has_pattern = true;
      snprintf(pattern, sizeof pattern, "%s", colon + 1);
      grove_err perr = {0};
      if (grove_module_pattern_check(pattern, &perr))
        return usage_error("watch", "%s", grove_err_msg(&perr));
    }
  }
  bool glob = has_pattern && strpbrk(pattern, "*?[\\") != NULL;
  const char *url = pub_url && *pub_url ? pub_url : getenv("GROVE_PUB");
  if (!url || !*url) url = DEFAULT_PUB;
  grove_watch *w = NULL;
  grove_err err = {0};
  grove_status s = grove_watch_open(url, has_model ? model : NULL,
                                    has_pattern && !glob ? pattern : NULL, &w, &err);
  if (s) return call_failed(s, &err);

  bool tty = !json && isatty(STDOUT_FILENO);
  static table t; /* large; one watch per process */
  memset(&t, 0, sizeof t);
  double end = seconds > 0 ? now_s() + seconds : 0, last_draw = 0;
  uint64_t got = 0;
  rc = EXIT_OK;
  if (tty) table_draw(&t, url);
  for (;;) {
    double now = now_s();
    if (end && now >= end) break;
    /* Short waits keep the table's ages moving and --seconds exact. */
    int wait_ms = 250;
    if (end && (end - now) * 1000 < wait_ms) wait_ms = (int)((end - now) * 1000) + 1;
    grove_hook_event ev;
    s = grove_watch_next(w, wait_ms, &ev, &err);
    if (s == GROVE_E_DEADLINE_EXCEEDED || s == GROVE_E_FORMAT) {
      if (tty && now_s() - last_draw > 0.25) {
        table_draw(&t, url);
        last_draw = now_s();
      }
      continue;
    }
    if (s) {
      rc = call_failed(s, &err);
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
      if (now_s() - last_draw > 0.1 || (count && got >= count)) {
        table_draw(&t, url);
        last_draw = now_s();
      }
    }
    grove_hook_event_fini(&ev);
    if (count && got >= count) break;
  }
  if (rc == EXIT_OK && count && got < count)
    rc = fail(EXIT_REFUSED, "%" PRIu64 " of %llu events came within %g s", got, count, seconds);
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
