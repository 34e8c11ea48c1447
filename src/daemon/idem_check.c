/* SPDX-License-Identifier: MIT */
/* idem_check: what recovery asks of an interrupted call that carries its
 * own check (kairosctl tool run --check; docs/design.md §8): the call and
 * its check, and the call settled by the check's word (idem_service.h). */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_core.h"
#include "log.h"

struct find_ctx {
        const char *mandate, *step;
        struct idem_check_call *ret;
        int error;
};

static int find_checked(const struct idem_view *v, void *arg)
{
        struct find_ctx *c = arg;
        if (!v->owner || !v->check ||
            (v->state != IDEM_ST_INTERRUPTED && v->state != IDEM_ST_PROCESSING) ||
            strcmp(v->owner->mandate, c->mandate) != 0 || strcmp(v->owner->step, c->step) != 0)
                return 0;
        /* the oldest first: the order the calls were made in */
        if (c->ret->check && (v->created_ms > c->ret->created_ms ||
                              (v->created_ms == c->ret->created_ms &&
                               strcmp(v->key, c->ret->key) > 0)))
                return 0;
        char *dup = strdup(v->check);
        if (!dup)
                return c->error = -ENOMEM;
        free(c->ret->check);
        c->ret->check = dup;
        c->ret->created_ms = v->created_ms;
        c->ret->interrupted = v->state == IDEM_ST_INTERRUPTED;
        snprintf(c->ret->key, sizeof c->ret->key, "%s", v->key);
        snprintf(c->ret->tool, sizeof c->ret->tool, "%s", v->tool);
        return 0;
}

int idem_service_step_check(struct daemon *d, const char *mandate_id, const char *step_id,
                            struct idem_check_call *ret)
{
        struct idem_service *svc = SVC(d);
        *ret = (struct idem_check_call){ 0 };
        if (!svc || !svc->loaded || !svc->store)
                return 0;
        struct find_ctx c = { .mandate = mandate_id, .step = step_id, .ret = ret };
        int r = idem_foreach(svc->store, find_checked, &c);
        if (r < 0 || c.error < 0) {
                idem_check_call_release(ret);
                return r < 0 ? r : c.error;
        }
        return ret->check ? 1 : 0;
}

void idem_check_call_release(struct idem_check_call *c)
{
        if (!c)
                return;
        free(c->check);
        c->check = NULL;
}

struct open_ctx {
        const char *mandate, *step;
};

static int is_open_of(const struct idem_view *v, void *arg)
{
        struct open_ctx *c = arg;
        return v->owner &&
               (v->state == IDEM_ST_INTERRUPTED || v->state == IDEM_ST_PROCESSING) &&
               strcmp(v->owner->mandate, c->mandate) == 0 &&
               strcmp(v->owner->step, c->step) == 0;
}

bool idem_service_step_may_own_open(struct daemon *d, const char *mandate_id,
                                    const char *step_id)
{
        struct idem_service *svc = SVC(d);
        /* a driver that keeps claims elsewhere settles them itself */
        if (d->toolclaims->settle_step)
                return true;
        if (!svc || !svc->loaded || !svc->store)
                return false;
        struct open_ctx c = { .mandate = mandate_id, .step = step_id };
        return idem_foreach(svc->store, is_open_of, &c) > 0;
}

struct check_settle_op {
        struct waiter w;
        void (*cb)(void *ctx, int err);
        void *ctx;
};

static void check_settled(struct waiter *w, int err)
{
        struct check_settle_op *op = (struct check_settle_op *)w;
        op->cb(op->ctx, err);
        free(op);
}

void idem_service_settle_check(struct daemon *d, const char *key, bool done,
                               const char *result_json, const char *why,
                               void (*cb)(void *ctx, int err), void *ctx)
{
        struct idem_service *svc = SVC(d);
        struct check_settle_op *op = calloc(1, sizeof(*op));
        char *text = NULL;
        uint64_t lsn = 0;
        int r = 0;
        if (!op) {
                cb(ctx, -ENOMEM);
                return;
        }
        op->cb = cb;
        op->ctx = ctx;
        if (!svc || !svc->loaded || !svc->store) {
                r = -EAGAIN;
                goto fail;
        }
        if (done) {
                /* what a duplicate replays: a run that succeeded and said
                 * nothing, and where its result came from */
                json_t *res = NULL;
                if (result_json)
                        res = json_loads(result_json, JSON_DECODE_ANY, NULL);
                json_t *pl = json_pack("{s:i, s:s, s:s, s:s, s:o}", "exit_status", 0, "stdout",
                                       "", "stderr", "", "settled", "by its check", "check_result",
                                       res ? res : json_null());
                text = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                json_decref(pl);
                r = text ? idem_settle_complete(svc->store, key, text, strlen(text), &lsn)
                         : -ENOMEM;
        } else {
                r = idem_settle_abandon(svc->store, key, why, &lsn);
        }
        free(text);
        if (r < 0)
                goto fail;
        idem_core_kick(svc);
        idem_core_wait_durable(svc, &op->w, lsn, check_settled);
        return;
fail:
        free(op);
        cb(ctx, r);
}
