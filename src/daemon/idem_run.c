/* SPDX-License-Identifier: MIT */
/* idem_run: tool-begin and tool-finish, the calls of kairosctl tool run
 * (idem_service.h). */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_core.h"
#include "log.h"
#include "toolhold.h"
#include "kairos/kmem.h"

/* ---- tool-begin / tool-finish ---- */

struct begin_op {
        struct waiter w;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        char fp[CANON_HASH_STRLEN];
        char tool[IDEM_TOOL_MAX + 1];
        bool own_group;           /* the caller may lead a process group of its own */
        json_int_t grace_sec;
};

static void begin_durable(struct waiter *w, int err)
{
        struct begin_op *op = (struct begin_op *)w;
        json_t *res = err ? NULL
                          : json_pack("{s:s, s:s, s:s, s:s}", "outcome", "proceed", "key",
                                      op->key, "tool", op->tool, "fingerprint", op->fp);
        /* docs/design.md §10: the call outlives a kairosd that dies */
        if (res && op->own_group) {
                json_object_set_new(res, "own_group", json_true());
                json_object_set_new(res, "grace_sec", json_integer(op->grace_sec));
        }
        if (err)
                idem_core_store_error(op->call, err);
        else
                idem_core_ok(op->call, res);
        free(op);
}

/* The request's identity: tool, key or input, fingerprint.  Replies and
 * returns false on a bad argument. */
static bool parse_identity(struct idem_call *call, const char *tool, const char *key,
                           char full[IDEM_FULL_KEY_SIZE], char fp[CANON_HASH_STRLEN])
{
        bool failed;
        const char *given_fp = idem_core_arg_string(call, "fingerprint", false, &failed);
        if (failed)
                return false;
        json_t *input = json_object_get(call->args, "input");
        char *text = NULL;
        if (input)
                text = json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY);
        else if (!given_fp && !key) {
                idem_core_error(call, "bad_argument",
                                    "give args.key or args.input (for a content key)");
                return false;
        }
        struct idem_request ir = { .tool = tool,
                                   .key = key,
                                   .input_json = text ? text : "null",
                                   .input_len = text ? strlen(text) : 4,
                                   .fingerprint = given_fp };
        int r = idem_make_key(&ir, full, fp);
        free(text);
        if (r < 0) {
                idem_core_error(call, "bad_argument",
                                    "bad identity: the tool must be 1..64 of [A-Za-z0-9_.-], the "
                                    "key 1..512 bytes of UTF-8 without control characters, not "
                                    "starting with 'content:', a fingerprint 'sha256-<64 hex>'");
                return false;
        }
        return true;
}

/* args.check {"cmd":[WORD...]} (kairosctl tool run --check), kept with
 * the call's args.input.argv as the entry's check (idem.h); *ret NULL
 * without one.  Replies and returns false on a bad argument. */
static bool parse_check(struct idem_call *call, char **ret)
{
        *ret = NULL;
        json_t *chk = json_object_get(call->args, "check");
        if (!chk || json_is_null(chk))
                return true;
        json_t *cmd = json_object_get(chk, "cmd");
        json_t *argv = json_object_get(json_object_get(call->args, "input"), "argv");
        if (!json_is_object(chk) || !json_is_array(cmd)) {
                idem_core_error(call, "bad_argument", "args.check: must be {\"cmd\":[WORD...]}");
                return false;
        }
        json_t *all = json_pack("{s:O, s:O}", "cmd", cmd, "argv",
                                json_is_array(argv) ? argv : json_array());
        char *text = all ? json_dumps(all, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(all);
        int r = text ? idem_check_normalize(text, strlen(text), ret) : -ENOMEM;
        free(text);
        if (r == -EINVAL) {
                idem_core_error(call, "bad_argument",
                                "args.check.cmd: 1..%u non-empty words, at most %u bytes with "
                                "the call's argv",
                                IDEM_CHECK_WORDS, IDEM_CHECK_MAX);
                return false;
        }
        if (r < 0) {
                idem_core_error(call, "internal", "out of memory");
                return false;
        }
        return true;
}

void idem_tool_begin(const struct idem_call *in)
{
        const char *tool;
        bool failed;
        struct idem_call *call = idem_core_open(in, "tool", &tool, NULL);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        const char *key = idem_core_arg_string(call, "key", false, &failed);
        if (failed)
                return;
        if (strncmp(tool, "kairos.", 7) == 0) {
                idem_core_error(call, "bad_argument",
                                    "args.tool: names starting with 'kairos.' are reserved");
                return;
        }
        struct begin_op *op = calloc(1, sizeof(*op));
        struct idem_claim *c = calloc(1, sizeof(*c));
        char *check = NULL;
        if (!op || !c) {
                free(op);
                free(c);
                idem_core_error(call, "internal", "out of memory");
                return;
        }
        if (!parse_identity(call, tool, key, op->key, op->fp) || !parse_check(call, &check))
                goto out;
        snprintf(op->tool, sizeof op->tool, "%s", tool);
        struct idem_step_owner step;
        bool owned = idem_core_step(call, &step);
        int64_t epoch;
        if (!idem_core_epoch(call, owned ? &step : NULL, &epoch))
                goto out;
        /* a step's call at an epoch: the driver's claim (toolclaims.h) */
        if (owned && epoch > 0 &&
            call->d->toolclaims->begin(call, op->key, op->tool, op->fp, &step, epoch))
                goto out;
        /* a step's call in the local store: its client is recorded, so that
         * a kairosd started again can wait for it (toolhold.h) */
        struct idem_client client;
        bool have_client = owned && idem_core_client(call, &client);
        struct idem_request ir = { .tool = tool, .key = key, .fingerprint = op->fp,
                                   .owner = owned ? &step : NULL, .check = check,
                                   .client = have_client ? &client : NULL };
        struct idem_view v;
        uint64_t lsn = 0;
        int r = idem_begin(svc->store, &ir, &v, &lsn);
        if (r < 0) {
                idem_core_store_error(call, r);
                goto out;
        }
        if (r != IDEM_PROCEED) {
                idem_core_existing(call, (enum idem_outcome)r, &v, op->fp);
                goto out;
        }
        /* The claim is this connection's from now on.  The caller leads a
         * process group of its own for the call once told to: the handler's
         * kills reach it, the keeper's does not (runner.h). */
        snprintf(c->key, sizeof c->key, "%s", op->key);
        if (have_client && svc->tool_group && svc->tool_group(call->d, call->pid, true) == 0) {
                c->group = call->pid;
                op->own_group = true;
                op->grace_sec = (json_int_t)call->d->cfg->tool_grace_sec;
        }
        (void)idem_core_claim_adopt(svc, c, call); /* (closed at once if the caller is gone) */
        c = NULL;
        op->call = call;
        idem_core_wait_durable(svc, &op->w, lsn, begin_durable);
        free(check);
        return;
out:
        FREE_ALL(op, c, check);
}

struct finish_op {
        struct waiter w;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        bool failed;
        bool late;                               /* after a kairosd restart */
        char mandate[IDEM_OWNER_ID_MAX + 1];     /* ... its owner ("" none) */
};

static void finish_durable(struct waiter *w, int err)
{
        struct finish_op *op = (struct finish_op *)w;
        struct daemon *d = op->call->d;
        if (err) {
                idem_core_store_error(op->call, err);
                free(op);
                return;
        }
        json_t *res = json_pack("{s:s, s:s, s:b}", "key", op->key, "outcome",
                                op->failed ? "failed" : "completed", "durable", 1);
        if (res && op->late)
                json_object_set_new(res, "finished_after_restart", json_true());
        idem_core_ok(op->call, res);
        if (op->late) {
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "IDEM_KEY", op->key }),
                          "tool call %s finished after kairosd restarted (its command ran to "
                          "the end meanwhile): recorded %s",
                          op->key, op->failed ? "failed" : "completed");
                if (op->mandate[0])
                        toolhold_finished(d, op->mandate);
        }
        free(op);
}

/* A base64 argument, validated; returns false after replying. */
static bool arg_b64(struct idem_call *call, const char *name, const char **out)
{
        bool failed;
        const char *s = idem_core_arg_string(call, name, false, &failed);
        if (failed)
                return false;
        unsigned char *bin;
        size_t n;
        int r = idem_core_b64_decode(s ? s : "", &bin, &n);
        if (r < 0) {
                idem_core_error(call, "bad_argument", "args.%s: %s", name,
                                    r == -EINVAL ? "not base64" : "out of memory");
                return false;
        }
        free(bin);
        *out = s ? s : "";
        return true;
}

/* The payload of a finish: exit status, stdout, stderr (base64), and
 * finished_after_restart for a late one.  NULL: out of memory. */
static char *finish_payload(json_int_t es, const char *out, const char *err, bool late)
{
        json_t *payload = json_pack("{s:I, s:s, s:s}", "exit_status", es, "stdout", out,
                                    "stderr", err);
        if (payload && late)
                json_object_set_new(payload, "finished_after_restart", json_true());
        char *text = payload ? json_dumps(payload, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(payload);
        return text;
}

/* tool-finish {"late":true, "fingerprint"} of a call a kairosd crash left
 * interrupted, from the client that claimed it (the same pid and start
 * time), whose command ran to the end meanwhile (docs/design.md §11). */
static void finish_late(struct idem_call *call, const char *key, json_int_t es,
                        const char *out, const char *err, const char *eclass, const char *emsg)
{
        struct idem_service *svc = SVC(call->d);
        bool failed;
        const char *fp = idem_core_arg_string(call, "fingerprint", true, &failed);
        if (failed)
                return;
        struct idem_view v;
        struct idem_client me;
        int r = idem_get(svc->store, key, &v);
        if (r < 0 || v.state != IDEM_ST_INTERRUPTED) {
                idem_core_error(call, "conflict",
                                "key %s is %s: only a call a kairosd crash left interrupted can "
                                "be finished late",
                                key, r < 0 ? "not in the store" : idem_state_name(v.state));
                return;
        }
        if (v.client.pid <= 0 || !idem_core_client(call, &me) || me.pid != v.client.pid ||
            me.start != v.client.start) {
                idem_core_error(call, "conflict",
                                "key %s was claimed by another process: only the tool run that "
                                "claimed it can finish it",
                                key);
                return;
        }
        struct finish_op *op = calloc(1, sizeof(*op));
        char *text = finish_payload(es, out, err, true);
        if (!op || !text) {
                free(op);
                free(text);
                idem_core_error(call, "internal", "out of memory");
                return;
        }
        if (v.owner)
                snprintf(op->mandate, sizeof op->mandate, "%s", v.owner->mandate);
        uint64_t lsn = 0;
        r = idem_finish_late(svc->store, key, fp, eclass, emsg ? emsg : "", text, strlen(text),
                             &lsn);
        free(text);
        if (r < 0) {
                free(op);
                if (r == -EPERM)
                        idem_core_error(call, "mismatch",
                                        "args.fingerprint: not the input key %s was claimed "
                                        "with", key);
                else if (r == -EINVAL)
                        idem_core_error(call, "bad_argument",
                                        "args.error_class: 1..64 of [A-Za-z0-9_.-]");
                else
                        idem_core_store_error(call, r);
                return;
        }
        op->call = call;
        op->failed = eclass != NULL;
        op->late = true;
        snprintf(op->key, sizeof op->key, "%s", key);
        idem_core_wait_durable(svc, &op->w, lsn, finish_durable);
}

void idem_tool_finish(const struct idem_call *in)
{
        const char *key;
        bool failed;
        struct idem_call *call = idem_core_open(in, "key", &key, NULL);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        json_t *es = json_object_get(call->args, "exit_status");
        if (!json_is_integer(es) || json_integer_value(es) < 0 ||
            json_integer_value(es) > 255) {
                idem_core_error(call, "bad_argument", "args.exit_status: must be 0..255");
                return;
        }
        const char *out, *err;
        if (!arg_b64(call, "stdout", &out) || !arg_b64(call, "stderr", &err))
                return;
        const char *eclass = idem_core_arg_string(call, "error_class", false, &failed);
        if (failed)
                return;
        const char *emsg = idem_core_arg_string(call, "error_msg", false, &failed);
        if (failed)
                return;
        struct idem_claim *c = idem_core_claim_find(svc, key);
        if ((!c || !c->owner_id || c->owner_id != call->owner.id) &&
            json_is_true(json_object_get(call->args, "late"))) {
                finish_late(call, key, json_integer_value(es), out, err, eclass, emsg);
                return;
        }
        if (!c || !c->owner_id || c->owner_id != call->owner.id) {
                idem_core_error(call, "conflict",
                                    "key %s is not claimed on this connection: send tool-begin "
                                    "first (on the same connection)",
                                    key);
                return;
        }
        if (call->d->toolclaims->finish(call, c, json_integer_value(es), out, err, eclass,
                                        emsg))
                return;
        char *text = finish_payload(json_integer_value(es), out, err, false);
        struct finish_op *op = calloc(1, sizeof(*op));
        if (!text || !op) {
                free(text);
                free(op);
                idem_core_error(call, "internal", "out of memory");
                return;
        }
        uint64_t lsn = 0;
        int r;
        if (eclass)
                r = idem_fail(svc->store, key, eclass, emsg ? emsg : "", text, strlen(text),
                              &lsn);
        else
                r = idem_complete(svc->store, key, text, strlen(text), &lsn);
        free(text);
        if (r == -EINVAL) {
                free(op);
                idem_core_error(call, "bad_argument",
                                    "args.error_class: 1..64 of [A-Za-z0-9_.-]");
                return;
        }
        if (r < 0) {
                free(op);
                idem_core_store_error(call, r);
                return;
        }
        idem_core_claim_free(c);
        op->call = call;
        op->failed = eclass != NULL;
        snprintf(op->key, sizeof op->key, "%s", key);
        idem_core_wait_durable(svc, &op->w, lsn, finish_durable);
}
