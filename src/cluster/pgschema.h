/* SPDX-License-Identifier: MIT */
/* The versioned PostgreSQL schema of cluster mode (docs/design.md §14). */
#pragma once

#include <stddef.h>

struct pgschema_migration {
        int version;             /* 1, 2, ... in order, no gaps */
        const char *description;
        const char *sql;         /* one or more statements */
};

extern const struct pgschema_migration pgschema_migrations[];
extern const size_t pgschema_nmigrations;

/* The version this build creates and understands. */
#define PGSCHEMA_VERSION 7
