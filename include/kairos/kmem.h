/* SPDX-License-Identifier: MIT */
/* kmem: free a struct's owned buffers in one call, so that each module's
 * _free() names what it owns instead of repeating free() a field a line. */
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
