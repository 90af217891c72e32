/* bench/oip_load.c: a small HTTP/1.1 load generator for groved's Open
 * Inference Protocol endpoint (bench/server_bench.sh's OIP rows).
 *
 *   oip_load HOST PORT PATH BODY_FILE JSON_LEN CONNECTIONS SECONDS
 *
 * Opens CONNECTIONS keep-alive connections and keeps one request in flight
 * on each (so CONNECTIONS in flight, as `grove bench --concurrency` keeps
 * that many NNG requests), each a POST of BODY_FILE's bytes; JSON_LEN > 0
 * sends "Inference-Header-Content-Length: JSON_LEN" (binary tensor data).
 * One thread, epoll.  After a warm-up of min(SECONDS / 5, 0.5 s) it counts
 * answers for SECONDS and prints, like `grove bench`, one last line
 * "samples_per_s=X p50_ms=X p99_ms=X errors=N" (an answer other than 200 is
 * an error, not a sample; one is printed to stderr).
 *
 * No Grove code: it speaks plain HTTP, as any OIP client does. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_time.h"

typedef struct conn {
  int fd;
  size_t sent;   /* bytes of the request written */
  char *in;      /* the answer being read */
  size_t in_len, in_cap;
  double t0;     /* when the request went out */
} conn;

static char *req;
static size_t req_len;

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* Bytes of a complete answer at the start of c->in, or 0 while incomplete;
 * *status its status code. */
static size_t complete(const conn *c, int *status) {
  const char *p = c->in, *end = memmem(p, c->in_len, "\r\n\r\n", 4);
  if (!end) return 0;
  size_t head = (size_t)(end - p) + 4;
  const char *cl = memmem(p, head, "Content-Length:", 15);
  size_t len = cl ? strtoull(cl + 15, NULL, 10) : 0;
  if (c->in_len < head + len) return 0;
  *status = atoi(p + 9);
  return head + len;
}

int main(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: oip_load HOST PORT PATH BODY_FILE JSON_LEN CONNECTIONS SECONDS\n");
    return 2;
  }
  const char *host = argv[1], *port = argv[2], *path = argv[3];
  long json_len = atol(argv[5]);
  int nconn = atoi(argv[6]);
  double seconds = atof(argv[7]);
  FILE *f = fopen(argv[4], "rb");
  if (!f) die(argv[4]);
  fseek(f, 0, SEEK_END);
  long blen = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *body = malloc((size_t)blen);
  if (!body || fread(body, 1, (size_t)blen, f) != (size_t)blen) die("read");
  fclose(f);
  char head[512];
  int hl = snprintf(head, sizeof head,
                    "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %ld\r\n",
                    path, host, json_len > 0 ? "application/octet-stream" : "application/json",
                    blen);
  if (json_len > 0)
    hl += snprintf(head + hl, sizeof head - (size_t)hl, "Inference-Header-Content-Length: %ld\r\n",
                   json_len);
  hl += snprintf(head + hl, sizeof head - (size_t)hl, "\r\n");
  req_len = (size_t)hl + (size_t)blen;
  req = malloc(req_len);
  memcpy(req, head, (size_t)hl);
  memcpy(req + hl, body, (size_t)blen);

  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
  if (getaddrinfo(host, port, &hints, &ai) != 0) die("getaddrinfo");
  int ep = epoll_create1(0);
  conn *cs = calloc((size_t)nconn, sizeof *cs);
  for (int i = 0; i < nconn; i++) {
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    cs[i].fd = fd;
    cs[i].in_cap = 1 << 16;
    cs[i].in = malloc(cs[i].in_cap);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = &cs[i]};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    cs[i].t0 = bench_now();
  }
  freeaddrinfo(ai);

  double warm = seconds / 5 < 0.5 ? seconds / 5 : 0.5;
  double start = bench_now(), t_count = start + warm, t_end = t_count + seconds;
  size_t nlat = 0, cap_lat = 1 << 20, errors = 0;
  double *lat = malloc(cap_lat * sizeof *lat);

  struct epoll_event evs[256];
  for (;;) {
    double t = bench_now();
    if (t >= t_end) break;
    int n = epoll_wait(ep, evs, 256, 100);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    for (int k = 0; k < n; k++) {
      conn *c = evs[k].data.ptr;
      if ((evs[k].events & EPOLLOUT) && c->sent < req_len) {
        ssize_t w = write(c->fd, req + c->sent, req_len - c->sent);
        if (w < 0 && errno != EAGAIN) die("write");
        if (w > 0) c->sent += (size_t)w;
        if (c->sent == req_len) {
          struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
      }
      if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (c->in_len == c->in_cap) {
          c->in_cap *= 2;
          c->in = realloc(c->in, c->in_cap);
        }
        ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (r == 0) {
          fprintf(stderr, "oip_load: groved closed a connection\n");
          return 1;
        }
        if (r < 0 && errno != EAGAIN) die("read");
        if (r > 0) c->in_len += (size_t)r;
        int status = 0;
        size_t used = complete(c, &status);
        if (!used) continue;
        double t1 = bench_now();
        if (status != 200) {
          if (errors++ == 0)
            fprintf(stderr, "oip_load: answer %d: %.*s\n", status, (int)(used < 400 ? used : 400),
                    c->in);
        } else if (t1 >= t_count && t1 < t_end) {
          if (nlat == cap_lat) lat = realloc(lat, (cap_lat *= 2) * sizeof *lat);
          lat[nlat++] = t1 - c->t0;
        }
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        c->sent = 0;
        c->t0 = t1;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
      }
    }
  }
  qsort(lat, nlat, sizeof *lat, bench_cmp_double);
  double p50 = nlat ? lat[nlat / 2] * 1e3 : 0, p99 = nlat ? lat[(size_t)(nlat * 0.99)] * 1e3 : 0;
  printf("samples_per_s=%.1f p50_ms=%.3f p99_ms=%.3f errors=%zu\n", (double)nlat / seconds, p50,
         p99, errors);
  return errors ? 1 : 0;
}
