/* SPDX-License-Identifier: MIT */
#include "kairos/strmap.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct slot {
        char *key;       /* NULL = empty, TOMBSTONE = deleted */
        void *value;
        uint64_t hash;
};

static char tombstone;
#define TOMBSTONE (&tombstone)

struct strmap {
        struct slot *slots;
        size_t cap;      /* power of two */
        size_t used;     /* live keys */
        size_t filled;   /* live + tombstones */
};

static uint64_t hash_str(const char *s)
{
        uint64_t h = 1469598103934665603ULL; /* FNV-1a */
        for (; *s; s++) {
                h ^= (unsigned char)*s;
                h *= 1099511628211ULL;
        }
        return h;
}

struct strmap *strmap_new(void)
{
        return calloc(1, sizeof(struct strmap));
}

void strmap_free_with(struct strmap *m, void (*free_value)(void *value))
{
        if (!m)
                return;
        for (size_t i = 0; i < m->cap; i++)
                if (m->slots[i].key && m->slots[i].key != TOMBSTONE) {
                        if (free_value)
                                free_value(m->slots[i].value);
                        free(m->slots[i].key);
                }
        free(m->slots);
        free(m);
}

void strmap_free(struct strmap *m)
{
        strmap_free_with(m, NULL);
}

static struct slot *find(const struct strmap *m, const char *key, uint64_t h)
{
        if (m->cap == 0)
                return NULL;
        size_t mask = m->cap - 1;
        for (size_t i = h & mask, n = 0; n < m->cap; i = (i + 1) & mask, n++) {
                struct slot *s = &m->slots[i];
                if (!s->key)
                        return NULL;
                if (s->key != TOMBSTONE && s->hash == h && strcmp(s->key, key) == 0)
                        return s;
        }
        return NULL;
}

static int rehash(struct strmap *m, size_t cap)
{
        struct slot *slots = calloc(cap, sizeof(*slots));
        if (!slots)
                return -ENOMEM;
        for (size_t i = 0; i < m->cap; i++) {
                struct slot *s = &m->slots[i];
                if (!s->key || s->key == TOMBSTONE)
                        continue;
                size_t j = s->hash & (cap - 1);
                while (slots[j].key)
                        j = (j + 1) & (cap - 1);
                slots[j] = *s;
        }
        free(m->slots);
        m->slots = slots;
        m->cap = cap;
        m->filled = m->used;
        return 0;
}

static int grow(struct strmap *m)
{
        size_t cap = m->cap ? m->cap * 2 : 16;
        if (m->used * 2 < m->cap)
                cap = m->cap; /* mostly tombstones: rehash in place size */
        return rehash(m, cap);
}

int strmap_reserve(struct strmap *m, size_t n)
{
        size_t cap = m->cap ? m->cap : 16;
        while ((m->used + n + 1) * 4 > cap * 3) {
                if (cap > SIZE_MAX / 2 / sizeof(struct slot))
                        return -ENOMEM;
                cap *= 2;
        }
        if (cap == m->cap && (m->filled + n + 1) * 4 <= cap * 3)
                return 0;
        return rehash(m, cap); /* (or the tombstones out at the same size) */
}

int strmap_put(struct strmap *m, const char *key, void *value)
{
        uint64_t h = hash_str(key);
        struct slot *s = find(m, key, h);
        if (s) {
                s->value = value;
                return 0;
        }
        if ((m->filled + 1) * 4 > m->cap * 3) {
                int r = grow(m);
                if (r < 0)
                        return r;
        }
        char *k = strdup(key);
        if (!k)
                return -ENOMEM;
        size_t mask = m->cap - 1;
        size_t i = h & mask;
        while (m->slots[i].key && m->slots[i].key != TOMBSTONE)
                i = (i + 1) & mask;
        if (!m->slots[i].key)
                m->filled++;
        m->slots[i] = (struct slot){ k, value, h };
        m->used++;
        return 0;
}

void *strmap_get(const struct strmap *m, const char *key)
{
        struct slot *s = find(m, key, hash_str(key));
        return s ? s->value : NULL;
}

void *strmap_remove(struct strmap *m, const char *key)
{
        struct slot *s = find(m, key, hash_str(key));
        if (!s)
                return NULL;
        void *v = s->value;
        free(s->key);
        s->key = TOMBSTONE;
        s->value = NULL;
        m->used--;
        return v;
}

size_t strmap_size(const struct strmap *m)
{
        return m->used;
}

int strmap_next(const struct strmap *m, size_t *pos, const char **key, void **value)
{
        for (; *pos < m->cap; (*pos)++) {
                struct slot *s = &m->slots[*pos];
                if (s->key && s->key != TOMBSTONE) {
                        *key = s->key;
                        *value = s->value;
                        (*pos)++;
                        return 0;
                }
        }
        return -ENOENT;
}
