/* bench/sp_load.c: a load generator for groved's data plane that is not
 * libgrove-client (bench/server_bench.sh's "sp" rows).
 *
 *   sp_load URL MODEL ROW_FLOATS CONNECTIONS DEPTH SECONDS
 *
 * URL is tcp://HOST:PORT or ipc:///PATH.  Opens CONNECTIONS connections and
 * keeps DEPTH predicts in flight on each (CONNECTIONS x DEPTH in flight in
 * all), each one row of ROW_FLOATS float32 values (shape [1, ROW_FLOATS])
 * for MODEL.  One thread, epoll, non-blocking sockets: what it costs per
 * request is a write, a read and a protobuf-c decode of the reply, so what
 * it measures is groved's capacity more than the client's (`grove bench`
 * runs NNG req0, with NNG's own threads on the client side).
 *
 * The wire is NNG's SP protocol written by hand, as groved's sp.c reads it
 * (req0 0x30 against rep0 0x31): the 8-byte handshake each way, then
 * messages framed by a 64-bit big-endian length (IPC: a type byte 1
 * before it), a request beginning with its 32-bit request id (high bit
 * set), echoed at the start of the reply.  The Request is encoded once
 * with protobuf-c; each send only changes the SP request id, which says
 * which slot (and send time) the reply belongs to.
 *
 * After a warm-up of min(SECONDS / 5, 0.5 s) it counts answers for SECONDS
 * and prints, like `grove bench`, one last line
 * "samples_per_s=X p50_ms=X p99_ms=X errors=N" (a reply whose status is
 * not OK is an error, not a sample; the first is printed to stderr). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bench_time.h"

#include "grove.pb-c.h"

typedef struct conn {
  int fd;
  bool ipc, shook, out_armed; /* out_armed: registered for EPOLLOUT */
  uint8_t *out; /* bytes to write */
  size_t out_len, out_off, out_cap;
  uint8_t *in; /* bytes read, not yet parsed */
  size_t in_len, in_cap;
  int base; /* its slots: base .. base + depth - 1 */
} conn;

static uint8_t *body; /* the encoded Request */
static size_t body_len;
static double *t_sent; /* per slot */
static uint32_t *gen;  /* per slot: the generation in its id */
static int depth;

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void put(conn *c, const void *p, size_t n) {
  if (c->out_len + n > c->out_cap) {
    while (c->out_len + n > c->out_cap) c->out_cap = c->out_cap ? c->out_cap * 2 : 1 << 16;
    if (!(c->out = realloc(c->out, c->out_cap))) die("realloc");
  }
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
}

/* Queues the request of slot s (ids: high bit, 15 bits of generation, 16 of
 * slot). */
static void send_req(conn *c, int s) {
  uint8_t head[13];
  size_t hl = 0;
  uint64_t len = 4 + body_len;
  if (c->ipc) head[hl++] = 1;
  for (int i = 7; i >= 0; i--) head[hl++] = (uint8_t)(len >> (8 * i));
  gen[s] = (gen[s] + 1) & 0x7fff;
  uint32_t id = 0x80000000u | gen[s] << 16 | (uint32_t)s;
  for (int i = 3; i >= 0; i--) head[hl++] = (uint8_t)(id >> (8 * i));
  put(c, head, hl);
  put(c, body, body_len);
  t_sent[s] = bench_now();
}

static void flush(conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
    if (w < 0) {
      if (errno == EAGAIN) return;
      die("write");
    }
    c->out_off += (size_t)w;
  }
  c->out_off = c->out_len = 0;
}

static int dial(const char *url, bool *ipc) {
  if (strncmp(url, "ipc://", 6) == 0) {
    *ipc = true;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(url + 6) >= sizeof sa.sun_path) {
      fprintf(stderr, "sp_load: ipc path too long: %s\n", url + 6);
      exit(2);
    }
    strcpy(sa.sun_path, url + 6);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) die("connect");
    return fd;
  }
  if (strncmp(url, "tcp://", 6) != 0) {
    fprintf(stderr, "sp_load: URL must be tcp://HOST:PORT or ipc:///PATH: %s\n", url);
    exit(2);
  }
  *ipc = false;
  char host[256];
  snprintf(host, sizeof host, "%s", url + 6);
  char *colon = strrchr(host, ':');
  if (!colon) {
    fprintf(stderr, "sp_load: no port in %s\n", url);
    exit(2);
  }
  *colon = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
  if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) die("getaddrinfo");
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) die("connect");
  freeaddrinfo(ai);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: sp_load URL MODEL ROW_FLOATS CONNECTIONS DEPTH SECONDS\n");
    return 2;
  }
  const char *url = argv[1];
  int64_t cols = atoll(argv[3]);
  int nconn = atoi(argv[4]);
  depth = atoi(argv[5]);
  double seconds = atof(argv[6]);
  if (cols <= 0 || nconn <= 0 || depth <= 0 || (int64_t)nconn * depth > 65536 || seconds <= 0) {
    fprintf(stderr, "sp_load: bad arguments (at most 65536 requests in flight)\n");
    return 2;
  }

  /* The Request, encoded once: one row of seeded values in [-1, 1). */
  float *x = malloc((size_t)cols * sizeof *x);
  uint32_t seed = 1;
  for (int64_t i = 0; i < cols; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
  }
  int64_t shape[2] = {1, cols};
  Grove__Tensor t = GROVE__TENSOR__INIT;
  t.dtype = 0; /* float32 */
  t.n_shape = 2;
  t.shape = shape;
  t.data.data = (uint8_t *)x;
  t.data.len = (size_t)cols * sizeof *x;
  Grove__Tensor *tp = &t;
  Grove__PredictRequest pr = GROVE__PREDICT_REQUEST__INIT;
  pr.model = argv[2];
  pr.n_inputs = 1;
  pr.inputs = &tp;
  Grove__Request rq = GROVE__REQUEST__INIT;
  rq.protocol = GROVE__PROTOCOL_VERSION__PROTOCOL_VERSION;
  rq.body_case = GROVE__REQUEST__BODY_PREDICT;
  rq.predict = &pr;
  body_len = grove__request__get_packed_size(&rq);
  body = malloc(body_len);
  grove__request__pack(&rq, body);

  int slots = nconn * depth;
  t_sent = calloc((size_t)slots, sizeof *t_sent);
  gen = calloc((size_t)slots, sizeof *gen);
  int ep = epoll_create1(0);
  conn *cs = calloc((size_t)nconn, sizeof *cs);
  const uint8_t hs[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
  for (int i = 0; i < nconn; i++) {
    conn *c = &cs[i];
    c->fd = dial(url, &c->ipc);
    if (write(c->fd, hs, 8) != 8) die("write handshake");
    if (fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK) != 0) die("fcntl");
    c->base = i * depth;
    c->in_cap = 1 << 16;
    c->in = malloc(c->in_cap);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
  }

  double warm = seconds / 5 < 0.5 ? seconds / 5 : 0.5;
  double start = bench_now(), t_count = start + warm, t_end = t_count + seconds;
  size_t nlat = 0, cap_lat = 1 << 20, errors = 0;
  double *lat = malloc(cap_lat * sizeof *lat);
  struct epoll_event evs[256];
  while (bench_now() < t_end) {
    int n = epoll_wait(ep, evs, 256, 100);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    for (int k = 0; k < n; k++) {
      conn *c = evs[k].data.ptr;
      if (evs[k].events & EPOLLOUT) flush(c);
      if (!(evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) goto rearm;
      if (c->in_len == c->in_cap && !(c->in = realloc(c->in, c->in_cap *= 2))) die("realloc");
      ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
      if (r == 0) {
        fprintf(stderr, "sp_load: groved closed a connection\n");
        return 1;
      }
      if (r < 0) {
        if (errno == EAGAIN) goto rearm;
        die("read");
      }
      c->in_len += (size_t)r;
      size_t off = 0, hl = c->ipc ? 9 : 8;
      if (!c->shook) {
        if (c->in_len < 8) goto rearm;
        if (c->in[1] != 'S' || c->in[2] != 'P' || c->in[5] != 0x31) {
          fprintf(stderr, "sp_load: the peer is not an SP rep0 socket\n");
          return 1;
        }
        c->shook = true;
        off = 8;
        for (int s = 0; s < depth; s++) send_req(c, c->base + s);
      }
      while (c->in_len - off >= hl) {
        uint64_t len = 0;
        for (size_t i = hl - 8; i < hl; i++) len = len << 8 | c->in[off + i];
        if (len < 4 || len > (1u << 30)) {
          fprintf(stderr, "sp_load: a reply of %llu bytes\n", (unsigned long long)len);
          return 1;
        }
        if (c->in_len - off - hl < len) {
          if (hl + len > c->in_cap) {
            while (hl + len > c->in_cap) c->in_cap *= 2;
            if (!(c->in = realloc(c->in, c->in_cap))) die("realloc");
          }
          break;
        }
        const uint8_t *m = c->in + off + hl;
        uint32_t id = (uint32_t)m[0] << 24 | (uint32_t)m[1] << 16 | (uint32_t)m[2] << 8 | m[3];
        int s = (int)(id & 0xffff);
        if (!(id & 0x80000000u) || s < c->base || s >= c->base + depth ||
            ((id >> 16) & 0x7fff) != gen[s]) {
          fprintf(stderr, "sp_load: a reply with an unknown request id 0x%08x\n", id);
          return 1;
        }
        double t1 = bench_now();
        Grove__Reply *rep = grove__reply__unpack(NULL, (size_t)len - 4, m + 4);
        if (!rep || rep->status != 0) {
          if (errors++ == 0)
            fprintf(stderr, "sp_load: reply status %d: %s\n", rep ? rep->status : -1,
                    rep && rep->message ? rep->message : "(undecodable)");
        } else if (t1 >= t_count && t1 < t_end) {
          if (nlat == cap_lat && !(lat = realloc(lat, (cap_lat *= 2) * sizeof *lat)))
            die("realloc");
          lat[nlat++] = t1 - t_sent[s];
        }
        if (rep) grove__reply__free_unpacked(rep, NULL);
        off += hl + (size_t)len;
        send_req(c, s);
      }
      memmove(c->in, c->in + off, c->in_len - off);
      c->in_len -= off;
      flush(c);
    rearm:;
      /* Asked to write only while something is left to write. */
      bool want_out = c->out_len > c->out_off;
      if (want_out != c->out_armed) {
        struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->out_armed = want_out;
      }
    }
  }
  qsort(lat, nlat, sizeof *lat, bench_cmp_double);
  double p50 = nlat ? lat[nlat / 2] * 1e3 : 0, p99 = nlat ? lat[(size_t)(nlat * 0.99)] * 1e3 : 0;
  printf("samples_per_s=%.1f p50_ms=%.3f p99_ms=%.3f errors=%zu\n", (double)nlat / seconds, p50,
         p99, errors);
  return errors ? 1 : 0;
}
