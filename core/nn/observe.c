/* observe.c: the per-call observer of a forward (grove_observer, module.h)
 * and module-path patterns (grove_module_pattern_*), with which a caller
 * picks the modules to watch out of named_modules.
 *
 * grove_module_forward asks, for each module it calls while an observer is
 * set, whether the observer watches that module.  The answer is a binary
 * search over the observer's sorted module pointers: no allocation, no lock,
 * and O(log n) for n watched modules (an observer on every module of a
 * thousand-module tree costs ten comparisons per call).
 *
 * Patterns are matched by dynamic programming over (token, character):
 * linear in their product, without recursion, so that a pattern from a
 * request cannot blow up the time or the stack. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "grove/module.h"

#define PATTERN_MAX 512
#define PATH_MAX_LEN 4096

long grove_observer_find(const grove_observer *o, const grove_module *m) {
  if (!o || o->n == 0) return -1;
  uintptr_t key = (uintptr_t)m;
  size_t lo = 0, hi = o->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    uintptr_t v = (uintptr_t)o->modules[mid];
    if (v == key) return (long)mid;
    if (v < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

/* ================================================================ patterns */

enum { T_LIT, T_ONE, T_STAR, T_DSTAR, T_DSTAR_DOT, T_CLASS };

typedef struct gtok {
  unsigned char type;
  char c;          /* T_LIT */
  bool neg;        /* T_CLASS: [!...] */
  const char *set; /* T_CLASS: the class's text between [ and ] */
  size_t setlen;
} gtok;

static bool is_glob(const char *p) {
  return strpbrk(p, "*?[\\") != NULL;
}

/* Splits p into tokens; returns the count, or -1 with *why set. */
static int tokenize(const char *p, gtok *t, size_t cap, const char **why) {
  size_t n = 0, len = strlen(p);
  if (len > PATTERN_MAX) {
    *why = "longer than 512 characters";
    return -1;
  }
  for (size_t i = 0; i < len;) {
    if (n == cap) {
      *why = "too many tokens";
      return -1;
    }
    gtok *k = &t[n++];
    memset(k, 0, sizeof *k);
    char c = p[i];
    if (c == '*') {
      if (p[i + 1] == '*') {
        /* "**." at the start or after a '.' may also match nothing. */
        bool at_component = i == 0 || p[i - 1] == '.';
        if (at_component && p[i + 2] == '.') {
          k->type = T_DSTAR_DOT;
          i += 3;
        } else {
          k->type = T_DSTAR;
          i += 2;
        }
        while (p[i] == '*') i++; /* "***" is "**" */
      } else {
        k->type = T_STAR;
        i++;
      }
    } else if (c == '?') {
      k->type = T_ONE;
      i++;
    } else if (c == '\\') {
      if (!p[i + 1]) {
        *why = "ends in a lone '\\'";
        return -1;
      }
      k->type = T_LIT;
      k->c = p[i + 1];
      i += 2;
    } else if (c == '[') {
      size_t j = i + 1;
      k->type = T_CLASS;
      if (p[j] == '!' || p[j] == '^') {
        k->neg = true;
        j++;
      }
      size_t start = j;
      if (p[j] == ']') j++; /* "[]a]": a leading ']' is a member */
      while (p[j] && p[j] != ']') j++;
      if (!p[j]) {
        *why = "has a '[' without its ']'";
        return -1;
      }
      k->set = p + start;
      k->setlen = j - start;
      i = j + 1;
    } else {
      k->type = T_LIT;
      k->c = c;
      i++;
    }
  }
  return (int)n;
}

grove_status grove_module_pattern_check(const char *pattern, grove_err *err) {
  if (!pattern) return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "pattern is NULL");
  gtok local[PATTERN_MAX];
  const char *why = NULL;
  if (tokenize(pattern, local, PATTERN_MAX, &why) < 0)
    return grove_err_set(err, GROVE_E_INVALID_ARGUMENT, "pattern '%.80s' %s", pattern, why);
  return GROVE_OK;
}

static bool class_has(const gtok *k, char c) {
  bool in = false;
  for (size_t i = 0; i < k->setlen; i++) {
    char a = k->set[i];
    if (i + 2 < k->setlen && k->set[i + 1] == '-') {
      char b = k->set[i + 2];
      if ((unsigned char)c >= (unsigned char)a && (unsigned char)c <= (unsigned char)b) in = true;
      i += 2;
    } else if (a == c) {
      in = true;
    }
  }
  return in != k->neg;
}

static bool glob_match(const char *pattern, const char *name) {
  gtok toks[PATTERN_MAX];
  const char *why;
  int nt = tokenize(pattern, toks, PATTERN_MAX, &why);
  size_t ns = strlen(name);
  if (nt < 0 || ns >= PATH_MAX_LEN) return false;
  /* cur[j]: the tokens so far match name[0..j). */
  static _Thread_local bool a[PATH_MAX_LEN + 1], b[PATH_MAX_LEN + 1];
  bool *cur = a, *nxt = b;
  memset(cur, 0, ns + 1);
  cur[0] = true;
  for (int i = 0; i < nt; i++) {
    const gtok *k = &toks[i];
    memset(nxt, 0, ns + 1);
    switch (k->type) {
      case T_LIT:
      case T_ONE:
      case T_CLASS:
        for (size_t j = 0; j < ns; j++) {
          if (!cur[j]) continue;
          char c = name[j];
          bool ok =
              k->type == T_LIT ? c == k->c : c != '.' && (k->type == T_ONE || class_has(k, c));
          if (ok) nxt[j + 1] = true;
        }
        break;
      case T_STAR:
        for (size_t j = 0; j <= ns; j++)
          nxt[j] = cur[j] || (j > 0 && nxt[j - 1] && name[j - 1] != '.');
        break;
      case T_DSTAR:
        for (size_t j = 0; j <= ns; j++) nxt[j] = cur[j] || (j > 0 && nxt[j - 1]);
        break;
      case T_DSTAR_DOT: {
        /* nothing, or any run that ends in '.' */
        bool seen = false; /* some cur[m] with m < j */
        for (size_t j = 0; j <= ns; j++) {
          nxt[j] = cur[j] || (j > 0 && seen && name[j - 1] == '.');
          if (cur[j]) seen = true;
        }
        break;
      }
    }
    bool *t = cur;
    cur = nxt;
    nxt = t;
  }
  return cur[ns];
}

bool grove_module_pattern_match(const char *pattern, const char *path) {
  if (!pattern || !path) return false;
  if (!is_glob(pattern)) return strcmp(pattern, path) == 0;
  /* A glob never names the root ("" in named_modules): a caller wants the
   * modules inside, and names the root by the exact pattern "". */
  return *path && glob_match(pattern, path);
}
