/* SPDX-License-Identifier: MIT */
/* idem_admin: the operator's commands of the idempotency store (kairosctl
 * idem stats, get, forget) and what other modules read of it (idem_service.h). */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_core.h"
#include "kairos/evidence.h"
#include "kairos/showdoc.h"
#include "log.h"

/* ---- operator commands ---- */

int idem_service_evidence_index(struct daemon *d, struct evidence_index **ret)
{
        struct idem_service *svc = SVC(d);
        struct idem_stats st;
        if (!svc || !svc->loaded || !svc->store)
                return evidence_index_unknown(ret);
        idem_stats(svc->store, &st);
        if (st.quarantined || st.error)
                return evidence_index_unknown(ret);
        return evidence_index_build(svc->store, ret);
}

json_t *idem_service_calls_json(struct daemon *d, const char *mandate_id)
{
        struct idem_service *svc = SVC(d);
        if (!svc || !svc->loaded || !svc->store || !mandate_id)
                return NULL;
        /* the store does not change while this runs (loop thread) */
        return showdoc_calls_json(svc->store, mandate_id);
}

int idem_service_stats(struct daemon *d, struct idem_stats *ret_stats)
{
        struct idem_service *svc = SVC(d);
        if (!svc || !svc->store || !svc->loaded)
                return -EAGAIN;
        idem_stats(svc->store, ret_stats);
        return 0;
}

void idem_stats_get(const struct idem_call *in)
{
        struct idem_call *call = idem_core_call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        json_t *roots = json_array();
        for (size_t i = 0; i < call->d->cfg->nwrite_roots; i++)
                json_array_append_new(roots, json_string(call->d->cfg->write_roots[i]));
        if (!svc || !svc->store || !svc->loaded) {
                char why[512];
                snprintf(why, sizeof why, "cannot load %s: %s", svc ? svc->dir : "?",
                         strerror(svc && svc->load_error ? -svc->load_error : EAGAIN));
                idem_core_ok(call, json_pack("{s:b, s:s, s:o}", "available", 0, "error", why,
                                                "write_roots", roots));
                return;
        }
        struct idem_stats st;
        idem_stats(svc->store, &st);
        json_t *res = json_pack(
                "{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                "s:I, s:I, s:I, s:b}",
                "available", 1, "size", (json_int_t)st.size, "capacity",
                (json_int_t)st.capacity, "ttl_sec", (json_int_t)st.ttl_sec, "processing",
                (json_int_t)st.processing, "completed", (json_int_t)st.completed, "failed",
                (json_int_t)st.failed, "interrupted", (json_int_t)st.interrupted, "hits",
                (json_int_t)st.hits, "misses", (json_int_t)st.misses, "conflicts",
                (json_int_t)st.conflicts, "mismatches", (json_int_t)st.mismatches, "evictions",
                (json_int_t)st.evictions, "expirations", (json_int_t)st.expirations,
                "store_full", (json_int_t)st.store_full, "forgets", (json_int_t)st.forgets,
                "log_records", (json_int_t)st.log_records, "lsn", (json_int_t)st.lsn,
                "quarantined", st.quarantined);
        json_object_set_new(res, "durable_lsn", json_integer((json_int_t)st.durable_lsn));
        json_object_set_new(res, "error", st.error ? json_string(strerror(-st.error))
                                                   : json_null());
        json_object_set_new(res, "log_path", json_string(idem_log_path(svc->log)));
        json_object_set_new(res, "log_flushes", json_integer((json_int_t)svc->flushes));
        json_object_set_new(res, "compactions", json_integer((json_int_t)svc->compactions));
        /* tool calls held by their callers (a streamed write is none yet) */
        size_t claims = 0;
        for (struct idem_claim *c = svc->claims; c; c = c->next)
                claims += !c->stream;
        json_object_set_new(res, "claims", json_integer((json_int_t)claims));
        json_object_set_new(res, "write_roots", roots);
        idem_core_ok(call, res);
}

/* The entry named by args.key: the full key "TOOL:KEY", or KEY alone for
 * a tool run ("cmd:KEY") or a tool write ("kairos.write:KEY").  Replies
 * not_found and returns -ENOENT. */
static int find_entry(struct idem_call *call, const char *key, struct idem_view *v,
                      char full[IDEM_FULL_KEY_SIZE])
{
        static const char *const prefixes[] = { "", "cmd:", WRITE_TOOL ":" };
        struct idem_service *svc = SVC(call->d);
        for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
                size_t pl = strlen(prefixes[i]), kl = strlen(key);
                if (pl + kl >= IDEM_FULL_KEY_SIZE)
                        continue;
                memcpy(full, prefixes[i], pl);
                memcpy(full + pl, key, kl + 1);
                if (idem_get(svc->store, full, v) == 0)
                        return 0;
        }
        idem_core_error(call, "not_found",
                            "no idempotency entry %s (nor cmd:%s, " WRITE_TOOL ":%s)", key, key,
                            key);
        return -ENOENT;
}

void idem_get_entry(const struct idem_call *in)
{
        const char *key;
        struct idem_call *call = idem_core_open(in, "key", &key, NULL);
        if (!call)
                return;
        struct idem_view v;
        char full[IDEM_FULL_KEY_SIZE];
        if (find_entry(call, key, &v, full) < 0)
                return;
        json_t *res = json_pack("{s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:o}", "key", v.key, "tool",
                                v.tool, "fingerprint", v.fingerprint, "state",
                                idem_state_name(v.state), "durable", v.durable, "created_at",
                                idem_core_ms_json(v.created_ms), "finished_at", idem_core_ms_json(v.finished_ms),
                                "expires_at", idem_core_ms_json(v.expires_ms));
        if (v.error_class)
                json_object_set_new(res, "error_class", json_string(v.error_class));
        if (v.error_msg)
                json_object_set_new(res, "error_msg", json_string(v.error_msg));
        if (v.reason)
                json_object_set_new(res, "reason", json_string(v.reason));
        json_object_set_new(res, "owner", idem_core_step_json(v.owner));
        if (v.check)
                json_object_set_new(res, "check", json_loads(v.check, 0, NULL));
        if (v.result_len > 0) {
                json_t *pl = json_loadb(v.result, v.result_len, 0, NULL);
                json_object_set_new(res, "result", pl ? pl : json_pack("{s:o}", "result_b64",
                                                                      idem_core_b64_json(v.result,
                                                                               v.result_len)));
        }
        idem_core_ok(call, res);
}

struct forget_op {
        struct waiter w;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        const char *state;
};

static void forget_durable(struct waiter *w, int err)
{
        struct forget_op *op = (struct forget_op *)w;
        if (err)
                idem_core_store_error(op->call, err);
        else
                idem_core_ok(op->call, json_pack("{s:s, s:s, s:b, s:I}", "key", op->key,
                                                    "state", op->state, "forgotten", 1, "uid",
                                                    (json_int_t)op->call->uid));
        free(op);
}

void idem_forget_entry(const struct idem_call *in)
{
        const char *key, *reason;
        struct idem_call *call = idem_core_open(in, "key", &key, "reason", &reason, NULL);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        if (!*reason) {
                idem_core_error(call, "bad_argument", "args.reason: must not be empty");
                return;
        }
        struct idem_view v;
        char full[IDEM_FULL_KEY_SIZE];
        if (find_entry(call, key, &v, full) < 0)
                return;
        struct forget_op *op = calloc(1, sizeof(*op));
        if (!op) {
                idem_core_error(call, "internal", "out of memory");
                return;
        }
        op->state = idem_state_name(v.state);
        uint64_t lsn = 0;
        int r = idem_forget(svc->store, full, (long long)call->uid, reason, &lsn);
        if (r == -EBUSY) {
                free(op);
                idem_core_error(call, "conflict",
                                    "key %s is processing: its caller may still be running "
                                    "the tool; it can be forgotten once it is finished or "
                                    "interrupted",
                                    full);
                return;
        }
        if (r < 0) {
                free(op);
                idem_core_store_error(call, r);
                return;
        }
        char uid[32];
        snprintf(uid, sizeof uid, "%u", (unsigned)call->uid);
        log_event(LOG_NOTICE, MSGID_OPERATOR,
                  LOG_FIELDS({ "IDEM_KEY", full }, { "OPERATOR_UID", uid }),
                  "idempotency key %s (%s) forgotten by uid %s: %s", full, op->state, uid,
                  reason);
        op->call = call;
        snprintf(op->key, sizeof op->key, "%s", full);
        idem_core_wait_durable(svc, &op->w, lsn, forget_durable);
}

/* ---- resolve of a step: its interrupted calls ---- */

struct step_keys {
        const char *mandate, *step;
        json_t *keys;
        int error;
};

static int collect_interrupted(const struct idem_view *v, void *arg)
{
        struct step_keys *c = arg;
        if (!v->owner || v->state != IDEM_ST_INTERRUPTED ||
            strcmp(v->owner->mandate, c->mandate) != 0 || strcmp(v->owner->step, c->step) != 0)
                return 0;
        if (json_array_append_new(c->keys, json_string(v->key)) < 0)
                return c->error = -ENOMEM;
        return 0;
}

struct settle_op {
        struct waiter w;
        struct op_reply to;
        json_t *keys;
};

static void settle_durable(struct waiter *w, int err)
{
        struct settle_op *op = (struct settle_op *)w;
        if (err)
                op_reply_error(&op->to, "io_error",
                               "the idempotency log could not be written: %s", strerror(-err));
        else
                op_reply_ok(&op->to, json_pack("{s:O}", "keys", op->keys ? op->keys
                                                                          : json_null()));
        json_decref(op->keys);
        free(op);
}

void idem_service_settle_step(struct daemon *d, const char *mandate_id, const char *step_id,
                              bool complete, uid_t uid, const char *reason, const char *how,
                              struct op_reply to)
{
        struct idem_service *svc = SVC(d);
        if (d->toolclaims->settle_step &&
            d->toolclaims->settle_step(d, mandate_id, step_id, complete, uid, reason, how, to))
                return;
        if (!svc || !svc->loaded || !svc->store) {
                op_reply_error(&to, "unavailable",
                               "the idempotency store is not loaded: the tool calls of step %s "
                               "cannot be %s; try again once it is",
                               step_id, complete ? "completed" : "released");
                return;
        }
        struct settle_op *op = calloc(1, sizeof(*op));
        struct step_keys c = { .mandate = mandate_id, .step = step_id, .keys = json_array() };
        if (!op || !c.keys || idem_foreach(svc->store, collect_interrupted, &c) < 0 || c.error) {
                free(op);
                json_decref(c.keys);
                op_reply_error(&to, "internal", "out of memory");
                return;
        }
        op->to = to;
        op->keys = json_array();   /* the keys settled (one gone by its TTL meanwhile is not) */
        char why[1200];
        if (how)
                snprintf(why, sizeof why, "%s: %s", how, reason);
        else
                snprintf(why, sizeof why, "kairosctl resolve %s %s --%s: %s", mandate_id,
                         step_id, complete ? "done" : "retry", reason);
        uint64_t lsn = 0, l = 0;
        size_t i;
        json_t *k;
        json_array_foreach(c.keys, i, k) {
                const char *key = json_string_value(k);
                struct idem_view v;
                char *text = NULL;
                int r = idem_get(svc->store, key, &v);
                if (r == -ENOENT)
                        continue;
                bool write = r == 0 && strcmp(v.tool, WRITE_TOOL) == 0 && v.write.path;
                if (r == 0 && complete)
                        r = (text = idem_core_done_payload(write ? &v.write : NULL, uid, reason,
                                                               how))
                                    ? idem_settle_complete(svc->store, key, text, strlen(text),
                                                           &l)
                                    : -ENOMEM;
                else if (r == 0 && how)
                        r = idem_settle_abandon(svc->store, key, why, &l);
                else if (r == 0)
                        r = idem_forget(svc->store, key, (long long)uid, why, &l);
                free(text);
                if (r == 0 && op->keys && json_array_append(op->keys, k) < 0)
                        r = -ENOMEM;
                if (r < 0) {
                        log_error("cannot %s tool call %s of step %s of %s: %s",
                                  complete ? "complete" : "release", key, step_id, mandate_id,
                                  strerror(-r));
                        op_reply_error(&op->to, r == -ENOMEM ? "internal" : "io_error",
                                       "cannot %s tool call %s: %s",
                                       complete ? "complete" : "release", key, strerror(-r));
                        /* those before it are recorded: wait for them, answer nobody */
                        break;
                }
                if (l > lsn)
                        lsn = l;
        }
        json_decref(c.keys);
        if (!op->keys)
                op_reply_error(&op->to, "internal", "out of memory");
        idem_core_kick(svc);
        idem_core_wait_durable(svc, &op->w, lsn, settle_durable);
}

#ifdef KAIROS_TEST_HOOKS
void idem_test_clock(const struct idem_call *in)
{
        struct idem_call *call = idem_core_call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        json_t *v = json_object_get(call->args, "advance_sec");
        if (!svc || !json_is_integer(v) || json_integer_value(v) < 0) {
                idem_core_error(call, "bad_argument",
                                    "args.advance_sec: must be a non-negative integer");
                return;
        }
        svc->clock_offset_ms += (int64_t)json_integer_value(v) * 1000;
        log_warning("test hook: the idempotency store's clock is %lld s ahead",
                    (long long)(svc->clock_offset_ms / 1000));
        idem_core_ok(call, json_pack("{s:I}", "offset_sec",
                                        (json_int_t)(svc->clock_offset_ms / 1000)));
}
#endif
