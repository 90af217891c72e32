/* train_bench.c: training steps per second of a Grove replica, for
 * bench/train_bench.sh (which runs PyTorch on the same model beside it).
 *
 *   train_bench --model DIR --batch B [--seconds S] [--optim sgd|adamw] [--threads T]
 *
 * DIR is a model directory (model.json + weights) with one float32 input
 * [-1, d1, ...] (the reference MLP's [-1, 784], the CNN's [-1, 3, 32, 32]) and
 * one output [-1, C] of logits; each step is
 * zero_grad, forward, CrossEntropyLoss, backward, optimizer step on one
 * fixed random batch (so that only the step is timed).  Prints one JSON line:
 * {"engine": "grove", "batch": B, "steps_per_s": X, "steps_per_cpu_s": Y,
 * "loss_first": .., "loss_last": ..}: Y counts the CPU time of all threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grove/grove.h"
#include "grove/train.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (every thread), which other jobs on a
 * shared host do not inflate the way they do wall time. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s) s[n] = '\0';
  fclose(f);
  return s;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *optim = "sgd";
  int batch = 64, threads = 1;
  double seconds = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
      batch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--optim") && i + 1 < argc)
      optim = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else {
      fprintf(stderr,
              "usage: train_bench --model DIR --batch B [--seconds S] [--optim sgd|adamw] "
              "[--threads T]\n");
      return 2;
    }
  }
  if (!dir || batch < 1) {
    fprintf(stderr, "train_bench: --model DIR and a positive --batch are required\n");
    return 2;
  }
  grove_set_compute_threads(threads);
  grove_err err = {0};
  char path[4096];
  snprintf(path, sizeof path, "%s/model.json", dir);
  char *json = read_text(path);
  if (!json) {
    fprintf(stderr, "train_bench: cannot read %s\n", path);
    return 1;
  }
  /* The weights the directory's model.json names, through grove_model_open. */
  grove_model *served = NULL;
  grove_state_dict *sd = grove_sd_new();
  grove_replica *r = NULL;
  grove_optim *o = NULL;
  int rc = 1;
  if (grove_model_open(dir, NULL, &served, &err) ||
      grove_module_state_dict(served->root, "", sd, &err) ||
      grove_replica_new(json, path, sd, NULL, &r, &err))
    goto fail;
  const grove_model *m = grove_replica_model(r);
  if (m->ninputs != 1 || m->inputs[0].dtype != GROVE_F32 || m->inputs[0].ndim < 2 ||
      m->inputs[0].ndim > GROVE_MAX_DIMS) {
    fprintf(stderr, "train_bench: expected one float32 [-1, d1, ...] input\n");
    goto done;
  }
  /* A sample's shape: the input's, past the batch; fixed sizes only. */
  int64_t xs[GROVE_MAX_DIMS] = {batch}, F = 1;
  for (int d = 1; d < m->inputs[0].ndim; d++) {
    if (m->inputs[0].shape[d] < 1) {
      fprintf(stderr, "train_bench: the input's dimension %d is not fixed\n", d);
      goto done;
    }
    F *= xs[d] = m->inputs[0].shape[d];
  }
  size_t np = grove_replica_num_params(r);
  grove_tensor **params = malloc(np * sizeof *params);
  for (size_t i = 0; i < np; i++) params[i] = grove_replica_param(r, i);
  grove_optim_kind kind = strcmp(optim, "adamw") == 0 ? GROVE_OPTIM_ADAMW : GROVE_OPTIM_SGD;
  grove_optim_hparams h = grove_optim_defaults(kind);
  if (kind == GROVE_OPTIM_SGD) h.lr = 0.01, h.momentum = 0.9;
  grove_status s = grove_optim_new(kind, params, np, NULL, 0, &h, &o, &err);
  free(params);
  if (s) goto fail;

  /* One fixed batch: x ~ U(-1, 1), targets in [0, C). */
  int64_t ts[1] = {batch};
  grove_tensor *x = grove_tensor_new(GROVE_F32, m->inputs[0].ndim, xs, &err);
  grove_tensor *y = grove_tensor_new(GROVE_I64, 1, ts, &err);
  uint64_t seed = 42;
  for (int64_t i = 0; i < batch * F; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    ((float *)x->data)[i] = (float)((seed >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
  }
  /* The number of classes: one forward. */
  grove_values out;
  if ((s = grove_replica_forward(r, x, 1, &out, &err))) goto fail;
  const int64_t C = out.v[0].shape[out.v[0].ndim - 1];
  for (int64_t i = 0; i < batch; i++) ((int64_t *)y->data)[i] = (i * 7) % C;
  grove_loss loss = grove_loss_default(GROVE_LOSS_CROSS_ENTROPY);
  double first = 0, last = 0, norm;
  /* Warm up (the arena reaches its size), then time whole steps. */
  for (int i = 0; i < 3; i++)
    if ((s = grove_replica_train_step(r, o, &loss, x, 1, y, i ? &last : &first, &norm, &err)))
      goto fail;
  long steps = 0;
  double c0 = cpu_now(), t0 = now(), t1 = t0;
  while (t1 - t0 < seconds) {
    if ((s = grove_replica_train_step(r, o, &loss, x, 1, y, &last, &norm, &err))) goto fail;
    steps++;
    t1 = now();
  }
  double c1 = cpu_now();
  printf(
      "{\"engine\": \"grove\", \"batch\": %d, \"optim\": \"%s\", \"threads\": %d, "
      "\"steps_per_s\": %.2f, \"steps_per_cpu_s\": %.2f, \"loss_first\": %.6f, "
      "\"loss_last\": %.6f}\n",
      batch, optim, threads, steps / (t1 - t0), steps / (c1 - c0), first, last);
  rc = 0;
  grove_tensor_release(x);
  grove_tensor_release(y);
  goto done;
fail:
  fprintf(stderr, "train_bench: %s\n", grove_err_msg(&err));
done:
  grove_optim_free(o);
  grove_replica_free(r);
  grove_sd_free(sd);
  grove_model_free(served);
  free(json);
  return rc;
}
