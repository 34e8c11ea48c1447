/* SPDX-License-Identifier: MIT */
/* idem_service: the idempotency store behind the control socket, its start,
 * load, reload and end.  See idem_service.h; the calls are answered by
 * idem_run.c (tool run), idem_write.c (tool write) and idem_admin.c (idem
 * stats, get, forget), over idem_core.c. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_write.h"
#include "kairos/beneath.h"
#include "log.h"

void idem_service_set_step_lookup(struct daemon *d, idem_step_lookup_fn fn)
{
        if (SVC(d))
                SVC(d)->step_of = fn;
}

void idem_service_set_tool_groups(struct daemon *d, idem_tool_group_fn fn)
{
        if (SVC(d))
                SVC(d)->tool_group = fn;
}

/* The step a call comes from: the running step whose handler's process
 * group the caller (its SO_PEERCRED pid) is in.  Never from the request
 * itself: a caller cannot claim to be another step.  false: from no step. */

static void load_work(void *arg)
{
        struct idem_service *svc = arg;
        svc->load_error = idem_log_open(svc->dir, NULL, svc->store, &svc->log, &svc->info);
        if (svc->load_error == 0 && !svc->info.corrupt && svc->settle_roots)
                idem_write_settle(svc);
}

static void load_done(void *arg)
{
        struct idem_service *svc = arg;
        const struct idem_load_info *in = &svc->info;
        if (svc->load_error < 0) {
                log_error("the idempotency store cannot be loaded from %s: %s; tool run and "
                          "tool write are refused until this is fixed and kairosd restarted",
                          svc->dir, strerror(-svc->load_error));
                idem_store_free(svc->store);
                svc->store = NULL;
                svc->log = NULL;
        } else {
                svc->loaded = true;
                svc->flushes = idem_log_flush_count(svc->log);
                if (in->torn_repaired)
                        log_warning("idempotency log %s: torn tail of %zu bytes repaired (kept "
                                    "in %s)",
                                    idem_log_path(svc->log), in->torn_bytes, in->torn_path);
                if (in->corrupt)
                        log_error("idempotency log %s is corrupt at line %zu (byte %zu: %s; %zu "
                                  "bad lines): the store is quarantined, lookups only",
                                  idem_log_path(svc->log), in->bad_line, in->bad_offset,
                                  in->bad_reason, in->bad_lines);
                log_info("idempotency store: %zu entries loaded from %s (%zu records, %zu "
                         "interrupted, %zu expired)",
                         in->entries, idem_log_path(svc->log), in->records, in->interrupted,
                         in->expired);
                size_t settled = 0, i;
                json_t *it;
                json_array_foreach(svc->settled, i, it) {
                        const char *outcome = json_string_value(json_object_get(it, "outcome"));
                        if (strcmp(outcome, "left_interrupted") != 0)
                                settled++;
                        log_notice("tool write %s (%s) interrupted by the crash: %s — %s",
                                   json_string_value(json_object_get(it, "path")),
                                   json_string_value(json_object_get(it, "key")),
                                   strcmp(outcome, "completed") == 0
                                           ? "completed from the file"
                                   : strcmp(outcome, "dropped") == 0
                                           ? "dropped, a retry writes it"
                                           : "left interrupted for review",
                                   json_string_value(json_object_get(it, "why")));
                }
                if (in->interrupted > settled)
                        log_warning("%zu idempotency key%s came back interrupted (their "
                                    "callers were running when kairosd stopped): review them "
                                    "with kairosctl idem get KEY",
                                    in->interrupted - settled,
                                    in->interrupted - settled == 1 ? "" : "s");
        }
        json_decref(svc->settled);
        svc->settled = NULL;
        idem_write_roots_unref(svc->settle_roots);
        svc->settle_roots = NULL;
        void (*cb)(struct daemon *d) = svc->loaded_cb;
        svc->loaded_cb = NULL;
        if (cb)
                cb(svc->d);
        idem_core_kick(svc);
}

int idem_service_start(struct daemon *d, void (*loaded)(struct daemon *d))
{
        struct idem_service *svc = calloc(1, sizeof(*svc));
        if (!svc)
                return -ENOMEM;
        svc->d = d;
        svc->loaded_cb = loaded;
        serialq_init(&svc->log_q, d->loop, &d->jobs);
        serialq_init(&svc->write_q, d->loop, &d->jobs);
#ifdef KAIROS_TEST_HOOKS
        /* walk below WriteRoots= as where the kernel has no openat2 */
        if (getenv("KAIROS_TEST_NO_OPENAT2"))
                svc->beneath_flags = BENEATH_NO_OPENAT2;
        /* die by SIGKILL inside every tool write: before its rename, or after
         * it and before the finish record */
        const char *crash = getenv("KAIROS_TEST_WRITE_CRASH");
        if (crash)
                svc->crash_at = strcmp(crash, "before_rename") == 0  ? 1
                                : strcmp(crash, "after_rename") == 0 ? 2
                                                                     : 0;
#endif
        struct idem_options opt = { .ttl_sec = (int64_t)d->cfg->idem_ttl_sec,
                                    .capacity = d->cfg->idem_max_entries,
                                    .now_ms = idem_core_now_ms,
                                    .clock_ctx = svc };
        int r;
        if (asprintf(&svc->dir, "%s/idem", d->cfg->state_directory) < 0) {
                svc->dir = NULL;
                r = -ENOMEM;
                goto fail;
        }
        if ((r = idem_store_new(&opt, &svc->store)) < 0)
                goto fail;
        if (!(svc->settle_roots = idem_write_roots_new(d->cfg))) {
                r = -ENOMEM;
                goto fail;
        }
        d->idem = svc;
        if ((r = serialq_submit(&svc->log_q, load_work, load_done, svc)) < 0) {
                d->idem = NULL;
                goto fail;
        }
        return 0;
fail:
        idem_write_roots_unref(svc->settle_roots);
        idem_store_free(svc->store);
        free(svc->dir);
        free(svc);
        return r;
}

void idem_service_reload(struct daemon *d, const struct config *cfg)
{
        if (!SVC(d))
                return;
        /* WriteRoots= are opened again at the next tool write */
        idem_write_roots_unref(SVC(d)->roots);
        SVC(d)->roots = NULL;
        if (cfg->idem_ttl_sec != d->cfg->idem_ttl_sec ||
            cfg->idem_max_entries != d->cfg->idem_max_entries)
                log_warning("reload: [Idempotency] TTLSec= and MaxEntries= changes take effect "
                            "at the next restart");
}

void idem_service_free(struct daemon *d)
{
        struct idem_service *svc = SVC(d);
        if (!svc)
                return;
        while (svc->claims)
                idem_core_claim_free(svc->claims);
        idem_write_roots_unref(svc->roots);
        idem_write_roots_unref(svc->settle_roots);
        json_decref(svc->settled);
        idem_log_close(svc->log);
        idem_store_free(svc->store);
        free(svc->dir);
        free(svc);
        d->idem = NULL;
}

