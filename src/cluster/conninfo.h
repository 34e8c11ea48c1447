/* SPDX-License-Identifier: MIT */
/* A libpq connection string given on a command line (kairosd --init-db,
 * kairosctl wal dump|verify --db), where every user of the host can read it
 * in /proc/PID/cmdline: never with a password.  Only with -Dpostgres. */
#pragma once

#include <stddef.h>

/* The connection string that arg stands for: "@PATH" the contents of the
 * file PATH (a regular file, at most 64 KiB, trailing white space
 * removed; it may hold a password), any other text the string itself,
 * refused if it holds a password (password=..., or a URI's user:password@).
 * "" leaves every setting to libpq's environment (PGHOST, PGDATABASE,
 * PGUSER, PGPASSFILE, PGPASSWORD, PGSERVICE, ...), as do the settings a
 * string leaves out.  Returns 0 with *ret_conninfo (owned), -EINVAL with
 * why (a password on the command line, a string libpq cannot parse, an
 * empty or non-regular file), -errno if PATH cannot be read (why says so
 * too), -ENOMEM. */
int conninfo_from_arg(const char *arg, char **ret_conninfo, char *why, size_t why_len);
