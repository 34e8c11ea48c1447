/* SPDX-License-Identifier: MIT */
/* strmap: string → pointer hash map (open addressing, linear probing).
 * Keys are copied; values are borrowed. */
#pragma once

#include <stddef.h>

struct strmap;

struct strmap *strmap_new(void);
void strmap_free(struct strmap *m);
/* strmap_free after free_value(value) of every entry. */
void strmap_free_with(struct strmap *m, void (*free_value)(void *value));
/* Insert or replace.  -ENOMEM. */
int strmap_put(struct strmap *m, const char *key, void *value);
/* Room for n more keys without a rehash (one table, not a doubling per
 * power of two on the way).  -ENOMEM (the map unchanged). */
int strmap_reserve(struct strmap *m, size_t n);
void *strmap_get(const struct strmap *m, const char *key);
/* Remove; returns the value that was there (or NULL). */
void *strmap_remove(struct strmap *m, const char *key);
size_t strmap_size(const struct strmap *m);

/* Iterate: *pos starts at 0; returns 0 and fills key/value, -ENOENT at the end.
 * The map must not change during an iteration. */
int strmap_next(const struct strmap *m, size_t *pos, const char **key, void **value);
