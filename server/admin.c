/* admin.c: the admin plane (docs/operations.md, "Security").
 *
 * groved serves two planes, as TorchServe splits its inference and
 * management APIs: the data plane (--listen) answers predict, status and
 * model metadata; the admin plane (--admin-listen, default
 * tcp://127.0.0.1:7703, GROVE_DEFAULT_ADMIN_URL in grove/client.h; local
 * only) answers reload, export, hooks and training, and status and metadata
 * too.  Each plane is a rep socket of its own (rpc.c opens both and
 * marks each context with its plane), so which plane a request came on is a
 * fact of the socket, not something the request could claim.
 *
 * On the admin plane, with --admin-token-file, every request must carry the
 * token (Request.admin_token), compared in constant time
 * (grove__secret_equal).  The token is never logged and no message names it.
 *
 * Files an admin RPC names (reload's checkpoint and model_dir, promote's
 * path, the training optimizer files) must resolve inside the model's
 * directory or a --checkpoint-dir; a path outside is refused before anything
 * opens it, with one message whatever the file is (missing, unreadable, a
 * secret), so the refusal reveals nothing about it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "internal.h" /* grove__secret_equal */
#include "server.h"

/* The longest token read from --admin-token-file. */
#define TOKEN_MAX 4096

typedef struct srv_admin_plane {
  char *token; /* NULL: no token asked */
  size_t token_len;
  char *ckpt_dirs[SRV_MAX_URLS]; /* realpath of each --checkpoint-dir */
  size_t nckpt;
  char *urls[SRV_MAX_URLS]; /* the admin URLs listened on */
  size_t nurls;
  char where[1024]; /* "tcp://127.0.0.1:7703" or "none", for messages */
} srv_admin_plane;

/* ------------------------------------------------------------ start */

static grove_status read_token(srv_admin_plane *p, const char *file, grove_err *err) {
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--admin-token-file %s: %s", file,
                         strerror(errno));
  struct stat st;
  if (fstat(fd, &st) == 0 && (st.st_mode & 0077))
    grove__slog(GROVE_LOG_WARN, "admin.token_mode",
                "--admin-token-file %s can be read by other users (mode %03o); chmod 600 it", file,
                (unsigned)(st.st_mode & 0777));
  char *buf = malloc(TOKEN_MAX + 1);
  if (!buf) {
    close(fd);
    return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  }
  size_t len = 0;
  for (;;) {
    ssize_t n = read(fd, buf + len, TOKEN_MAX + 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
    if (len > TOKEN_MAX) break;
  }
  close(fd);
  /* One line: a trailing newline (echo, an editor, a Kubernetes Secret made
   * from a file) is not part of the token. */
  while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                 buf[len - 1] == '\t'))
    len--;
  grove_status s = GROVE_OK;
  if (len > TOKEN_MAX)
    s = grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--admin-token-file %s: longer than %d bytes",
                      file, TOKEN_MAX);
  else if (len == 0)
    s = grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--admin-token-file %s is empty", file);
  else if (memchr(buf, '\n', len) || memchr(buf, '\0', len))
    s = grove_err_set(err, GROVE_E_INVALID_ARGUMENT,
                      "--admin-token-file %s: the token is one line of text", file);
  if (s) {
    explicit_bzero(buf, TOKEN_MAX + 1);
    free(buf);
    return s;
  }
  buf[len] = '\0';
  p->token = buf;
  p->token_len = len;
  return GROVE_OK;
}

grove_status grove__admin_plane_init(srv_server *srv, grove_err *err) {
  srv_admin_plane *p = calloc(1, sizeof *p);
  if (!p) return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
  srv->plane = p;
  grove__rpc_set_gate(srv, grove__admin_gate);
  snprintf(p->where, sizeof p->where, "none");
  const srv_config *cfg = &srv->cfg;
  if (cfg->admin_token_file) {
    grove_status s = read_token(p, cfg->admin_token_file, err);
    if (s) return s;
  }
  for (size_t i = 0; i < cfg->ncheckpoint_dirs; i++) {
    const char *d = cfg->checkpoint_dirs[i];
    char *rp = realpath(d, NULL);
    struct stat st;
    if (!rp || stat(rp, &st) != 0 || !S_ISDIR(st.st_mode)) {
      int e = rp ? ENOTDIR : errno;
      free(rp);
      return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "--checkpoint-dir %s: %s", d,
                           strerror(e));
    }
    p->ckpt_dirs[p->nckpt++] = rp;
  }
  return GROVE_OK;
}

void grove__admin_plane_free(srv_server *srv) {
  srv_admin_plane *p = srv->plane;
  if (!p) return;
  if (p->token) {
    explicit_bzero(p->token, p->token_len);
    free(p->token);
  }
  for (size_t i = 0; i < p->nckpt; i++) free(p->ckpt_dirs[i]);
  for (size_t i = 0; i < p->nurls; i++) free(p->urls[i]);
  free(p);
  srv->plane = NULL;
}

grove_status grove__admin_plane_listen(srv_server *srv, grove_err *err) {
  srv_admin_plane *p = srv->plane;
  size_t used = 0;
  if (srv->cfg.nadmin_listen) {
    /* The admin plane's connections have a cap of their own (conns.c), so
     * that a flood of data connections never locks the operator out. */
    grove_status cs = grove__conns_watch(
        srv, srv->admin_sock, "admin", grove__conns_default_cap(srv, false), true, NULL, NULL, err);
    if (cs) return cs;
  }
  for (size_t i = 0; i < srv->cfg.nadmin_listen; i++) {
    const char *url = srv->cfg.admin_listen[i];
    /* Unlike the default --pub, the default admin address is not best
     * effort: with a second groved on the machine, its reloads and exports
     * would reach the first one, which holds the address.  Refusing to start
     * makes the operator name one (or none). */
    int rv = nng_listen(srv->admin_sock, url, NULL, 0);
    if (rv)
      return grove_err_set(err, GROVE_E_IO, "cannot listen on %s %s: %s%s",
                           srv->cfg.admin_default ? "the default admin address" : "--admin-listen",
                           url, nng_strerror(rv),
                           srv->cfg.admin_default
                               ? " (another groved may hold it: give this one --admin-listen "
                                 "URL, or --admin-listen none)"
                               : "");
    if (!(p->urls[p->nurls] = strdup(url)))
      return grove_err_set(err, GROVE_E_NOMEM, "out of memory");
    p->nurls++;
    int w = snprintf(p->where + used, sizeof p->where - used, "%s%s", used ? ", " : "", url);
    if (w > 0 && (size_t)w < sizeof p->where - used) used += (size_t)w;
    grove__slog(GROVE_LOG_INFO, "server.admin_listen",
                "admin plane (reload, export, hooks, training) on %s%s", url,
                p->token ? ", token required" : "");
  }
  return GROVE_OK;
}

char **grove__admin_urls(srv_server *srv, size_t *n) {
  *n = srv->plane ? srv->plane->nurls : 0;
  return *n ? srv->plane->urls : NULL;
}

/* ------------------------------------------------------------ the gate */

/* The model an admin request names, for its path checks; NULL when it names
 * none (the handler then answers NOT_FOUND itself). */
static const char *request_model(const Grove__Request *q) {
  switch (q->body_case) {
    case GROVE__REQUEST__BODY_RELOAD:
      return q->reload->model;
    case GROVE__REQUEST__BODY_PROMOTE:
      return q->promote->model;
    case GROVE__REQUEST__BODY_START_TRAINING:
      return q->start_training->model;
    case GROVE__REQUEST__BODY_STOP_TRAINING:
      return q->stop_training->model;
    default:
      return NULL;
  }
}

static const char *rpc_name(Grove__Request__BodyCase c) {
  switch (c) {
    case GROVE__REQUEST__BODY_RELOAD:
      return "Reload";
    case GROVE__REQUEST__BODY_EXPORT_STATE_DICT:
      return "ExportStateDict";
    case GROVE__REQUEST__BODY_REGISTER_HOOK:
      return "RegisterHook";
    case GROVE__REQUEST__BODY_REMOVE_HOOK:
      return "RemoveHook";
    case GROVE__REQUEST__BODY_LIST_HOOKS:
      return "ListHooks";
    case GROVE__REQUEST__BODY_START_TRAINING:
      return "StartTraining";
    case GROVE__REQUEST__BODY_TRAIN_STEP:
      return "TrainStep";
    case GROVE__REQUEST__BODY_EVALUATE:
      return "Evaluate";
    case GROVE__REQUEST__BODY_PROMOTE:
      return "Promote";
    case GROVE__REQUEST__BODY_STOP_TRAINING:
      return "StopTraining";
    default:
      return NULL;
  }
}

/* The paths an admin request names, checked before any handler opens one. */
static grove_status check_paths(srv_req *r, grove_err *err) {
  const Grove__Request *q = r->msg;
  const char *name = request_model(q);
  srv_model *m = name ? grove__registry_find(r->srv, name) : NULL;
  if (!m) return GROVE_OK;
  grove_status s = GROVE_OK;
  switch (q->body_case) {
    case GROVE__REQUEST__BODY_RELOAD:
      if (q->reload->checkpoint && *q->reload->checkpoint)
        s = grove__admin_path_check(r->srv, m, "reload's checkpoint", q->reload->checkpoint, err);
      if (!s && q->reload->model_dir && *q->reload->model_dir)
        s = grove__admin_path_check(r->srv, m, "reload's model_dir", q->reload->model_dir, err);
      return s;
    case GROVE__REQUEST__BODY_PROMOTE:
      /* "" is a new file in groved's own temporary directory. */
      if (q->promote->path && *q->promote->path)
        s = grove__admin_path_check(r->srv, m, "promote's path", q->promote->path, err);
      return s;
    case GROVE__REQUEST__BODY_START_TRAINING:
      if (q->start_training->optimizer_state && *q->start_training->optimizer_state)
        s = grove__admin_path_check(r->srv, m, "the optimizer state to resume from",
                                    q->start_training->optimizer_state, err);
      return s;
    case GROVE__REQUEST__BODY_STOP_TRAINING:
      if (q->stop_training->optimizer_state && *q->stop_training->optimizer_state)
        s = grove__admin_path_check(r->srv, m, "stop's optimizer_state file",
                                    q->stop_training->optimizer_state, err);
      return s;
    default:
      return GROVE_OK;
  }
}

static void data_urls(const srv_server *srv, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < srv->cfg.nlisten; i++) {
    int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", srv->cfg.listen[i]);
    if (w < 0 || (size_t)w >= n - used) break;
    used += (size_t)w;
  }
}

bool grove__admin_gate(srv_req *r) {
  srv_server *srv = r->srv;
  srv_admin_plane *p = srv->plane;
  const Grove__Request *q = r->msg;
  const char *admin_rpc = rpc_name(q->body_case);
  if (!r->admin_plane) {
    if (!admin_rpc) return true;
    grove__rpc_reply_error(r, GROVE_E_PERMISSION_DENIED,
                           "%s is an admin RPC: groved serves it on its admin listener (%s; "
                           "groved --admin-listen, grove --admin URL or $GROVE_ADMIN), not on "
                           "the data listener",
                           admin_rpc, p->where);
    return false;
  }
  if (q->body_case == GROVE__REQUEST__BODY_PREDICT) {
    char urls[512];
    data_urls(srv, urls, sizeof urls);
    grove__rpc_reply_error(r, GROVE_E_PERMISSION_DENIED,
                           "predict is served on groved's data listener (%s; groved --listen), "
                           "not on the admin listener",
                           urls);
    return false;
  }
  if (!admin_rpc) return true; /* status and metadata: on both planes */
  if (p->token) {
    const char *given = q->admin_token ? q->admin_token : "";
    if (!grove__secret_equal(p->token, p->token_len, given, strlen(given))) {
      /* Neither token appears in the reply or the log. */
      grove__slog(GROVE_LOG_WARN, "admin.unauthenticated", "%s refused: %s admin token", admin_rpc,
                  *given ? "a wrong" : "no");
      grove__rpc_reply_error(r, GROVE_E_UNAUTHENTICATED,
                             "%s refused: this groved's admin plane wants its token "
                             "(groved --admin-token-file; the client's $GROVE_ADMIN_TOKEN or "
                             "--token-file), and the request carries %s",
                             admin_rpc, *given ? "another" : "none");
      return false;
    }
  }
  grove_err err = {0};
  if (check_paths(r, &err)) {
    grove__rpc_reply_error(r, err.code, "%s: %s", admin_rpc, grove_err_msg(&err));
    return false;
  }
  return true;
}

/* ------------------------------------------------------------ paths */

/* Whether the resolved path lies strictly below the resolved dir. */
static bool below(const char *path, const char *dir) {
  size_t n = strlen(dir);
  if (n == 1 && dir[0] == '/') return path[0] == '/' && path[1] != '\0';
  return strncmp(path, dir, n) == 0 && path[n] == '/' && path[n + 1] != '\0';
}

/* path resolved: its realpath when something is there (a symlink is
 * followed, and a dangling one does not resolve); else the realpath of its
 * directory and its last name, which is what a file created there will be.
 * NULL when it does not resolve. */
static char *resolve(const char *path) {
  struct stat st;
  if (lstat(path, &st) == 0) return realpath(path, NULL);
  if (errno != ENOENT) return NULL;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) return NULL;
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return NULL;
  char *rdir = realpath(dir, NULL);
  free(dir);
  if (!rdir) return NULL;
  size_t n = strlen(rdir) + 1 + strlen(base) + 1;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%s%s%s", rdir, strcmp(rdir, "/") ? "/" : "", base);
  free(rdir);
  return out;
}

grove_status grove__admin_path_check(srv_server *srv, const srv_model *m, const char *what,
                                     const char *path, grove_err *err) {
  srv_admin_plane *p = srv->plane;
  if (strlen(path) >= PATH_MAX)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "%s: a path of %d bytes or more", what,
                         PATH_MAX);
  /* The model's directories: the one it was configured with, and the one it
   * serves now (a reload with model_dir moves it). */
  const char *mdirs[2] = {m->dir, NULL};
  srv_version *v = grove__model_acquire((srv_model *)m);
  if (v && v->model->dir && strcmp(v->model->dir, m->dir) != 0) mdirs[1] = v->model->dir;
  char *rmdirs[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++)
    if (mdirs[i]) rmdirs[i] = realpath(mdirs[i], NULL);
  char *rp = resolve(path);
  bool ok = false;
  for (int i = 0; rp && i < 2 && !ok; i++) ok = rmdirs[i] && below(rp, rmdirs[i]);
  for (size_t i = 0; rp && i < p->nckpt && !ok; i++) ok = below(rp, p->ckpt_dirs[i]);
  grove_status s = GROVE_OK;
  if (!ok) {
    char allowed[1536];
    size_t used = 0;
    allowed[0] = '\0';
    for (int i = 0; i < 2; i++) {
      if (!mdirs[i]) continue;
      int w = snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "",
                       rmdirs[i] ? rmdirs[i] : mdirs[i]);
      if (w > 0 && (size_t)w < sizeof allowed - used) used += (size_t)w;
    }
    for (size_t i = 0; i < p->nckpt; i++) {
      int w = snprintf(allowed + used, sizeof allowed - used, ", %s", p->ckpt_dirs[i]);
      if (w > 0 && (size_t)w < sizeof allowed - used) used += (size_t)w;
    }
    /* The same words whether the file exists, is unreadable or is a secret:
     * nothing about it is revealed. */
    s = grove_err_set(err, GROVE_E_PERMISSION_DENIED,
                      "%s '%s' is outside the directories groved lets model '%s' use (its "
                      "model directory and each --checkpoint-dir): %s",
                      what, path, m->name, allowed);
  }
  free(rp);
  free(rmdirs[0]);
  free(rmdirs[1]);
  grove__version_release(v);
  return s;
}
