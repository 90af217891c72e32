/* cli_tensor.h: tensors as the grove commands print, convert and make them,
 * the same for a model run in this process (client/grove.c: predict
 * --local, bench --local) and one served by groved (cli_remote.c):
 *
 *   - an output printed as "NAME DTYPE SHAPE" and its first rows;
 *   - an input converted to the model's dtype only when no value changes;
 *   - bench's inputs: a batch of fixed-seed random floats (integers 0).
 *
 * Main thread only (the printing writes to stdout). */
#ifndef GROVE_CLI_TENSOR_H
#define GROVE_CLI_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "grove/grove.h"

/* Prints "NAME DTYPE SHAPE" on stdout, then the first values of the first
 * rows (docs/cli.md): a row is an index of dimension 0 (the batch), its
 * values the rest, flattened.  t may be strided; it stays the caller's. */
void grove__cli_print_tensor(const char *name, const grove_tensor *t);

/* *out becomes a new tensor (the caller's to release) holding src in dtype
 * want, when no element changes; otherwise GROVE_E_DTYPE (GROVE_E_NOMEM)
 * and err says which element would, naming path (the file src came from)
 * and iname (the model input).  Floats never become integers: integer
 * inputs are indices, and a float file for them is almost always the wrong
 * file.  src stays the caller's. */
grove_status grove__cli_convert(const grove_tensor *src, grove_dtype want, const char *path,
                                const char *iname, grove_tensor **out, grove_err *err);

/* bench's first state for grove__cli_bench_input: every run, local or
 * against groved, computes on the same numbers. */
#define GROVE__CLI_BENCH_SEED 0x9E3779B97F4A7C15ull

/* A new tensor (the caller's) for model input s at batch rows: dimensions
 * the model leaves free besides the batch are 16; floats are uniform in
 * [-1, 1) from *state (xorshift64*, advanced), integers 0, so that any
 * Embedding takes them.  Prints "input NAME: DTYPE SHAPE" on stdout.
 * NULL with err set when it cannot be made. */
grove_tensor *grove__cli_bench_input(const grove_io_spec *s, long long batch, uint64_t *state,
                                     grove_err *err);

/* predict's INPUT arguments (docs/cli.md): FILE.npy, one per model input in
 * the model's order, or NAME=FILE.npy naming the model input (any order),
 * for models that take several (token ids, an attention mask, initial
 * states).  An argument is NAME=FILE when it has a '=' with no '/' before
 * it; then file points after the '=' (into arg).  name is written with the
 * NUL-terminated NAME ("" when positional), at most n bytes. */
const char *grove__cli_input_file(const char *arg, char *name, size_t n);
/* Matches args[0..nargs) (as above) to the model's inputs specs[0..nspecs):
 * order[i] is the index in args of model input i.  All named or all
 * positional; every name one of the model's, once; every input given.
 * 0, or EXIT_REFUSED after the message naming the model (model) and what
 * did not match ("model m has no input 'msk' (its inputs: ids, mask)"). */
int grove__cli_order_inputs(const char *model, const char *const *args, size_t nargs,
                            const grove_io_spec *specs, size_t nspecs, size_t *order);

#endif
