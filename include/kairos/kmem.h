/* SPDX-License-Identifier: MIT */
/* kmem: free a struct's owned buffers in one call (each module's _free()
 * names what it owns instead of a free() a line), and an enum's name from
 * one table instead of a switch a name. */
#pragma once

#include <stddef.h>
#include <stdlib.h>

static inline void kmem_free_each(const void *const *p, size_t n)
{
        for (size_t i = 0; i < n; i++)
                free((void *)p[i]);
}

/* FREE_ALL(a, b, c): free(a); free(b); free(c); (NULL is fine). */
#define FREE_ALL(...) \
        kmem_free_each((const void *const[]){ __VA_ARGS__ }, \
                       sizeof((const void *const[]){ __VA_ARGS__ }) / sizeof(const void *))

/* An enum's name from a table indexed by its values: dflt for a value the
 * table does not name. */
#define ENUM_NAME(names, v, dflt)                                                              \
        ((size_t)(v) < sizeof(names) / sizeof((names)[0]) && (names)[(size_t)(v)]            \
                 ? (names)[(size_t)(v)]                                                        \
                 : (dflt))

/* Free the first n strings of v, then v (v may be NULL). */
static inline void kmem_free_strv(char **v, size_t n)
{
        for (size_t i = 0; v && i < n; i++)
                free(v[i]);
        free(v);
}
