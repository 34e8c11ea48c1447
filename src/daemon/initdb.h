/* SPDX-License-Identifier: MIT */
/* kairosd --init-db: create or migrate cluster mode's PostgreSQL schema. */
#pragma once

/* Returns the exit status (0, or 1 with the reason on standard error). */
int initdb_main(const char *conninfo);
