/* check_rnn.c: RNN, LSTM, GRU and EmbeddingBag against PyTorch, plus their
 * errors.
 *
 * Parity: tests/fixtures_gen/rnn.py writes rnn_<case>.safetensors (state_dict
 * under "w.", inputs in0.., torch's outputs out0.. flattened: output, h_n
 * [, c_n]) and rnn_<case>.json (the exporter's model.json object).  Each
 * case is built from the JSON, loaded strictly (torch's keys and shapes) and
 * compared with torch (rtol 1e-4, atol 1e-5), twice on one arena (the
 * second forward must not grow it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "layers_internal.h"
#include "testutil.h"

#define RTOL 1e-4
#define ATOL 1e-5

static const char *const cases[] = {
    "rnn_tanh",          "rnn_relu_bf_h0",      "rnn_bi_unbatched_h0", "lstm_1",
    "lstm_bi2_bf_h0",    "lstm_proj2",          "lstm_proj_bi_bf_h0",  "lstm_nobias_b1",
    "lstm_unbatched",    "lstm_big_bf",         "lstm_bf_b1",          "gru_1",
    "gru_bi3_bf_h0",     "gru_nobias_b1",       "gru_big",             "bag_sum_offsets_psw",
    "bag_mean_2d",       "bag_max_last",        "bag_mean_pad",        "bag_sum_2d_psw",
    "bag_mean_offsets",
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

typedef struct fixture {
  grove_state_dict *file, *weights;
  grove_values in;
  grove_tensor *want[GROVE_MAX_VALUES];
  int nwant;
  grove_model *model;
} fixture;

static void fixture_load(fixture *fx, const char *name) {
  grove_err err = {0};
  char fname[256];
  snprintf(fname, sizeof fname, "rnn_%s.safetensors", name);
  ck_assert_ok(grove_safetensors_read(grove_fixture(fname), &fx->file, &err), &err);
  fx->weights = grove_test_sd_under(fx->file, "w.");
  fx->in.n = 0;
  fx->nwant = 0;
  for (int i = 0; i < GROVE_MAX_VALUES; i++) {
    char key[16];
    snprintf(key, sizeof key, "in%d", i);
    grove_tensor *t = grove_sd_get(fx->file, key);
    if (t) fx->in.v[fx->in.n++] = *t;
    snprintf(key, sizeof key, "out%d", i);
    if ((t = grove_sd_get(fx->file, key))) fx->want[fx->nwant++] = t;
  }
  ck_assert_int_gt(fx->in.n, 0);
  ck_assert_int_gt(fx->nwant, 0);
  snprintf(fname, sizeof fname, "rnn_%s.json", name);
  char *json = grove_test_read_file(grove_fixture(fname), NULL);
  ck_assert_ptr_nonnull(json);
  size_t n = strlen(json) + 256;
  char *doc = malloc(n);
  snprintf(doc, n,
           "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
           "\"float32\", \"shape\": [-1]}], \"module\": %s}",
           json);
  free(json);
  ck_assert_ok(grove_model_from_spec(doc, "rnn.json", &fx->model, &err), &err);
  free(doc);
  ck_assert_ok(grove_module_load_state_dict(fx->model->root, fx->weights, NULL, NULL, &err), &err);
}

static void fixture_fini(fixture *fx) {
  grove_model_free(fx->model);
  grove_sd_free(fx->weights);
  grove_sd_free(fx->file);
}

static void assert_close(const char *what, int k, const grove_tensor *got,
                         const grove_tensor *want) {
  char a[128], b[128];
  ck_assert_msg(grove_tensor_same_shape(got, want), "%s out%d: shape %s, torch %s", what, k,
                grove_shape_str(got->ndim, got->shape, a, sizeof a),
                grove_shape_str(want->ndim, want->shape, b, sizeof b));
  ck_assert(grove_tensor_is_contiguous(got));
  const float *g = got->data, *w = want->data;
  long bad = grove_test_allclose(g, w, (size_t)grove_tensor_numel(want), RTOL, ATOL);
  ck_assert_msg(bad < 0, "%s out%d: element %ld is %.9g, torch says %.9g", what, k, bad,
                bad >= 0 ? g[bad] : 0.0, bad >= 0 ? w[bad] : 0.0);
}

START_TEST(test_parity) {
  const char *name = cases[_i];
  fixture fx = {0};
  grove_err err = {0};
  fixture_load(&fx, name);
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = &err};
  for (int pass = 0; pass < 2; pass++) {
    grove_values out = {0};
    size_t grows = grove_arena_grow_count(arena);
    ck_assert_ok(grove_module_forward(fx.model->root, &f, &fx.in, &out), &err);
    if (pass == 1) ck_assert_uint_eq(grove_arena_grow_count(arena), grows);
    ck_assert_int_eq(out.n, fx.nwant);
    for (int k = 0; k < out.n; k++) assert_close(name, k, &out.v[k], fx.want[k]);
    grove_arena_reset(arena);
  }
  grove_arena_free(arena);
  fixture_fini(&fx);
}
END_TEST

/* The same bits on one compute thread and on two: the input products are
 * split by rows, a time step by column blocks, each computed whole on one
 * thread with the same arithmetic. */
START_TEST(test_threads_bitwise) {
  static const char *const names[] = {"lstm_big_bf", "gru_big", "lstm_proj2"};
  for (int c = 0; c < 3; c++) {
    fixture fx = {0};
    grove_err err = {0};
    fixture_load(&fx, names[c]);
    grove_arena *a1 = grove_arena_new(0), *a2 = grove_arena_new(0);
    grove_fwd f1 = {.arena = a1, .err = &err}, f2 = {.arena = a2, .err = &err};
    grove_values o1 = {0}, o2 = {0};
    grove_set_compute_threads(1);
    ck_assert_ok(grove_module_forward(fx.model->root, &f1, &fx.in, &o1), &err);
    grove_set_compute_threads(2);
    ck_assert_ok(grove_module_forward(fx.model->root, &f2, &fx.in, &o2), &err);
    grove_set_compute_threads(1);
    ck_assert_int_eq(o1.n, o2.n);
    for (int k = 0; k < o1.n; k++) {
      assert_close(names[c], k, &o2.v[k], fx.want[k]);
      ck_assert_msg(memcmp(o1.v[k].data, o2.v[k].data, grove_tensor_nbytes(&o1.v[k])) == 0,
                    "%s out%d differs between 1 and 2 compute threads", names[c], k);
    }
    grove_arena_free(a1);
    grove_arena_free(a2);
    fixture_fini(&fx);
  }
}
END_TEST

static grove_status forward_err(const grove_module *m, const grove_tensor *xs, int n, grove_err *err) {
  grove_arena *arena = grove_arena_new(0);
  grove_fwd f = {.arena = arena, .err = err};
  grove_values in = {.n = n}, out = {0};
  for (int i = 0; i < n; i++) in.v[i] = xs[i];
  grove_status s = grove_module_forward(m, &f, &in, &out);
  grove_arena_free(arena);
  return s;
}

/* Bad requests are clear errors naming what was wrong, never a crash. */
START_TEST(test_rnn_errors) {
  grove_err err = {0};
  grove_module *m = NULL;
  grove_rnn_opts o = {.mode = "LSTM", .input_size = 4, .hidden_size = 6, .num_layers = 2,
                      .bias = true, .batch_first = true};
  ck_assert_ok(grove_rnn_new(&o, &m, &err), &err);
  grove_module_eval(m);
  float buf[2 * 3 * 5] = {0};
  int64_t xs[3] = {2, 3, 5};
  grove_tensor x[3];
  grove_tensor_init(&x[0], GROVE_F32, 3, xs, buf);
  ck_assert_int_eq(forward_err(m, x, 1, &err), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "input_size. Expected 4, got 5"));
  xs[2] = 4;
  grove_tensor_init(&x[0], GROVE_F32, 3, xs, buf);
  int64_t hs[3] = {2, 3, 6};  /* should be [2 layers, batch 2, 6] */
  float hb[2 * 3 * 6] = {0};
  grove_tensor_init(&x[1], GROVE_F32, 3, hs, hb);
  grove_tensor_init(&x[2], GROVE_F32, 3, hs, hb);
  ck_assert_int_eq(forward_err(m, x, 3, &err), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "h0 of shape [2, 2, 6]"));
  ck_assert_int_eq(forward_err(m, x, 2, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "(h0, c0)"));
  int64_t zs[3] = {2, 0, 4};
  grove_tensor_init(&x[0], GROVE_F32, 3, zs, buf);
  ck_assert_int_eq(forward_err(m, x, 1, &err), GROVE_E_SHAPE);
  grove_module_release(m);

  o = (grove_rnn_opts){.mode = "GRU", .input_size = 4, .hidden_size = 6, .proj_size = 2,
                       .num_layers = 1};
  ck_assert_int_eq(grove_rnn_new(&o, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "proj_size"));
  o = (grove_rnn_opts){.mode = "LSTM", .input_size = 4, .hidden_size = 6, .proj_size = 6,
                       .num_layers = 1};
  ck_assert_int_eq(grove_rnn_new(&o, &m, &err), GROVE_E_INVALID_ARGUMENT);
}
END_TEST

/* torch's state_dict keys, in torch's order. */
START_TEST(test_rnn_keys) {
  grove_err err = {0};
  grove_module *m = NULL;
  grove_rnn_opts o = {.mode = "LSTM", .input_size = 4, .hidden_size = 6, .num_layers = 2,
                      .proj_size = 3, .bias = true, .bidirectional = true};
  ck_assert_ok(grove_rnn_new(&o, &m, &err), &err);
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  static const char *const want[] = {
      "weight_ih_l0",         "weight_hh_l0",         "bias_ih_l0",         "bias_hh_l0",
      "weight_hr_l0",         "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse",
      "bias_hh_l0_reverse",   "weight_hr_l0_reverse", "weight_ih_l1",       "weight_hh_l1",
      "bias_ih_l1",           "bias_hh_l1",           "weight_hr_l1",       "weight_ih_l1_reverse",
      "weight_hh_l1_reverse", "bias_ih_l1_reverse",   "bias_hh_l1_reverse", "weight_hr_l1_reverse"};
  ck_assert_uint_eq(grove_sd_count(sd), sizeof want / sizeof want[0]);
  for (size_t i = 0; i < grove_sd_count(sd); i++) ck_assert_str_eq(grove_sd_key(sd, i), want[i]);
  /* layer 1 reads both directions' projected outputs: [4 * 6, 2 * 3] */
  grove_tensor *t = grove_sd_get(sd, "weight_ih_l1");
  ck_assert_int_eq(t->shape[0], 24);
  ck_assert_int_eq(t->shape[1], 6);
  ck_assert_int_eq(grove_sd_get(sd, "weight_hh_l0")->shape[1], 3);
  grove_sd_free(sd);
  grove_module_release(m);
}
END_TEST

/* The cells: torch's names (no _l0), their state checks, their
 * constructor's limits. */
START_TEST(test_cells) {
  grove_err err = {0};
  grove_module *m = NULL;
  grove_rnn_opts o = {.mode = "LSTM",
                      .input_size = 4,
                      .hidden_size = 6,
                      .num_layers = 1,
                      .bias = true,
                      .cell = true};
  ck_assert_ok(grove_rnn_new(&o, &m, &err), &err);
  ck_assert_str_eq(grove_module_type_name(m), "LSTMCell");
  grove_state_dict *sd = grove_sd_new();
  ck_assert_ok(grove_module_state_dict(m, NULL, sd, &err), &err);
  static const char *const want[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
  ck_assert_uint_eq(grove_sd_count(sd), 4);
  for (size_t i = 0; i < 4; i++) ck_assert_str_eq(grove_sd_key(sd, i), want[i]);
  ck_assert_int_eq(grove_sd_get(sd, "weight_ih")->shape[0], 24);
  grove_sd_free(sd);
  grove_module_eval(m);
  float buf[3 * 6] = {0};
  int64_t xs[2] = {3, 4}, hs[2] = {2, 6}, x3[3] = {1, 3, 4};
  grove_tensor x[3];
  grove_tensor_init(&x[0], GROVE_F32, 2, xs, buf);
  grove_tensor_init(&x[1], GROVE_F32, 2, hs, buf);
  grove_tensor_init(&x[2], GROVE_F32, 2, hs, buf);
  ck_assert_int_eq(forward_err(m, x, 3, &err), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "LSTMCell: h must be float32 [B, 6]"));
  ck_assert_int_eq(forward_err(m, x, 2, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "(h, c)"));
  grove_tensor_init(&x[0], GROVE_F32, 3, x3, buf);
  ck_assert_int_eq(forward_err(m, x, 1, &err), GROVE_E_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.msg, "Expected input to be 1D or 2D, got 3D"));
  grove_module_release(m);
  o.num_layers = 2;
  ck_assert_int_eq(grove_rnn_new(&o, &m, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "LSTMCell: a cell has one layer"));
}
END_TEST

START_TEST(test_bag_errors) {
  grove_err err = {0};
  grove_module *m = NULL;
  ck_assert_ok(grove_embedding_bag_new(10, 3, "mean", false, -1, &m, &err), &err);
  int64_t ids[4] = {1, 2, 10, 3}, offs[2] = {0, 2}, bad_offs[2] = {0, 5};
  int64_t n4 = 4, n2 = 2;
  grove_tensor x[3];
  grove_tensor_init(&x[0], GROVE_I64, 1, &n4, ids);
  grove_tensor_init(&x[1], GROVE_I64, 1, &n2, offs);
  ck_assert_int_eq(forward_err(m, x, 2, &err), GROVE_E_RANGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "index 10 (at flat position 2"));
  ids[2] = 4;
  grove_tensor_init(&x[1], GROVE_I64, 1, &n2, bad_offs);
  ck_assert_int_eq(forward_err(m, x, 2, &err), GROVE_E_RANGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "offsets[1] is 5"));
  ck_assert_int_eq(forward_err(m, x, 1, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "offsets"));
  float w[4] = {1, 1, 1, 1};
  grove_tensor_init(&x[1], GROVE_I64, 1, &n2, offs);
  grove_tensor_init(&x[2], GROVE_F32, 1, &n4, w);
  ck_assert_int_eq(forward_err(m, x, 3, &err), GROVE_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "only supported for mode='sum'"));
  grove_module_release(m);
  ck_assert_int_eq(grove_embedding_bag_new(10, 3, "median", false, -1, &m, &err),
                   GROVE_E_INVALID_ARGUMENT);
}
END_TEST

/* The training replica has no backward for these: it refuses them by path
 * and type, and the serving tree is unaffected. */
START_TEST(test_training_refuses) {
  static const char *const specs[] = {
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
      "\"float32\", \"shape\": [-1, -1, 3]}], \"module\": {\"type\": \"Sequential\", "
      "\"children\": [{\"type\": \"LSTM\", \"input_size\": 3, \"hidden_size\": 4, "
      "\"batch_first\": true}]}}",
      "{\"format\": \"grove.model/1\", \"inputs\": [{\"name\": \"x\", \"dtype\": "
      "\"int64\", \"shape\": [-1, -1]}], \"module\": {\"type\": \"EmbeddingBag\", "
      "\"num_embeddings\": 5, \"embedding_dim\": 2}}",
  };
  static const char *const want[] = {"'0' (LSTM) is not a module type Grove can train",
                                     "(EmbeddingBag) is not a module type Grove can train"};
  for (int i = 0; i < 2; i++) {
    grove_err err = {0};
    grove_replica *r = NULL;
    ck_assert_int_eq(grove_replica_new(specs[i], "m.json", NULL, NULL, &r, &err),
                     GROVE_E_UNSUPPORTED);
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(err.msg, want[i]), "%s", err.msg);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("rnn");
  TCase *tc = tcase_create("rnn");
  tcase_add_loop_test(tc, test_parity, 0, NCASES);
  tcase_add_test(tc, test_threads_bitwise);
  tcase_add_test(tc, test_rnn_errors);
  tcase_add_test(tc, test_rnn_keys);
  tcase_add_test(tc, test_cells);
  tcase_add_test(tc, test_bag_errors);
  tcase_add_test(tc, test_training_refuses);
  suite_add_tcase(s, tc);
  return s;
}

GROVE_TEST_MAIN(suite)
