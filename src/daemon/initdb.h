/* SPDX-License-Identifier: MIT */
/* kairosd --init-db: create or migrate cluster mode's PostgreSQL schema. */
#pragma once

/* arg: a connection string without a password, or "@FILE" (conninfo.h).
 * Returns the exit status: 0; 1 (cannot read FILE, connect or migrate) or
 * 64 (a password on the command line, a string libpq cannot read), with
 * the reason on standard error. */
int initdb_main(const char *arg);
