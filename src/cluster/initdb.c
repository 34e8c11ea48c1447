/* SPDX-License-Identifier: MIT */
/* kairosd --init-db CONNINFO: create or migrate cluster mode's PostgreSQL
 * schema (docs/design.md §14), idempotently.  Runs before any event loop
 * exists, so blocking on the database is fine here.  The postgres driver's
 * init_db (driver.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_postgres.h"
#include "conninfo.h"
#include "pgschema.h"
#include "pgstore.h"

int pgd_init_db(const char *arg)
{
        struct pgstore *s = NULL;
        char err[512];
        char *conninfo = NULL;
        /* "@FILE", never a password on the command line (conninfo.h) */
        int r = conninfo_from_arg(arg, &conninfo, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "kairosd: --init-db: %s\n", err[0] ? err : strerror(-r));
                return r == -EINVAL && arg[0] != '@' ? 64 : 1;
        }
        r = pgstore_connect(conninfo, &s, err, sizeof err);
        free(conninfo);
        if (r < 0) {
                fprintf(stderr, "kairosd: --init-db: cannot connect: %s\n",
                        err[0] ? err : strerror(-r));
                return 1;
        }
        int from = 0, to = 0;
        r = pgstore_migrate(s, &from, &to);
        if (r < 0) {
                fprintf(stderr, "kairosd: --init-db: %s\n", pgstore_error(s));
                pgstore_close(s);
                return 1;
        }
        pgstore_close(s);
        if (from == to)
                printf("kairos schema: up to date at version %d\n", to);
        else if (from == 0)
                printf("kairos schema: created at version %d\n", to);
        else
                printf("kairos schema: migrated from version %d to %d\n", from, to);
        return 0;
}
