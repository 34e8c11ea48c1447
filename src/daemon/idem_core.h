/* SPDX-License-Identifier: MIT */
/* idem_core: the idempotency service's state and what its parts share
 * (docs/design.md §11): the log's flushes and durability, the calls and
 * their answers, the claims of callers.  For the idem_*.c files and the
 * drivers of tool-call claims (toolclaims.h) only: other modules use
 * idem_service.h. */
#pragma once

#include <sodium.h>

#include "idem_service.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"
#include "toolclaims.h"

#define B64 sodium_base64_VARIANT_ORIGINAL
/* The tool name of tool-write entries (tool-begin may not use kairos.*). */
#define WRITE_TOOL "kairos.write"
#define INTERRUPT_REASON "the caller's connection closed before tool-finish"
#define STOP_REASON "kairosd stopped while the caller ran the tool"

struct waiter {
        struct waiter *next;
        uint64_t lsn;
        void (*done)(struct waiter *w, int err);
};

/* A tool-begin claim, held by its owner (idem_service.h). */
struct idem_claim {
        const void *owner_id;
        void *hold;                        /* the owner's handle; NULL once released */
        void (*release)(void *hold);
        struct idem_service *svc;
        struct idem_claim *prev, *next;
        char key[IDEM_FULL_KEY_SIZE];
        /* cluster mode: claimed in the database for this step's mandate at
         * epoch (0: in the local store) */
        int64_t epoch;
        char mandate[IDEM_OWNER_ID_MAX + 1];
        /* not a tool call: ties a streamed tool write to its connection
         * (idem_write.h), found by no key; gone runs instead of the
         * interruption when the connection goes */
        struct write_op *stream;
        void (*gone)(struct idem_claim *c);
        /* a tool run leading process group group of its own (0: none):
         * forgotten by svc->tool_group when the claim ends */
        pid_t group;
};

struct idem_service {
        struct daemon *d;
        struct idem_store *store;
        struct idem_log *log;
        char *dir;
        struct serialq log_q;      /* load, appends + fdatasync, compaction: in order */
        struct serialq write_q;    /* tool-write: path checks and file writes */
        void (*loaded_cb)(struct daemon *d);
        bool loaded;
        int load_error;
        struct idem_load_info info;
        bool busy;                 /* a log job in flight */
        struct waiter *waiters;
        struct idem_claim *claims;
        uint64_t flushes;          /* fdatasync calls of the log (copied after each job) */
        uint64_t compactions;
        uint64_t compact_not_before; /* log records: retry a failed compaction later */
        int64_t clock_offset_ms;   /* test hook */
        struct write_roots *roots; /* WriteRoots= opened; NULL until the first tool write */
        unsigned beneath_flags;    /* BENEATH_NO_OPENAT2 (test hook) */
        idem_step_lookup_fn step_of; /* attributes a call to a running step */
        idem_tool_group_fn tool_group; /* tool calls in a process group of their own */
        struct write_roots *settle_roots; /* WriteRoots= for settling writes at load */
        json_t *settled;           /* what the load settled: [{key,path,outcome,why}] */
        int crash_at;              /* test hook: SIGKILL inside a tool write (1 before its
                                    * rename, 2 after it) */
};

static inline struct idem_service *SVC(struct daemon *d)
{
        return d->idem;
}

/* the clock of the store (with the test hook's offset), formatting */
int64_t idem_core_now_ms(void *ctx);
json_t *idem_core_ms_json(int64_t ms);
json_t *idem_core_b64_json(const void *data, size_t len);
/* Decode base64 text; -EINVAL if malformed. */
int idem_core_b64_decode(const char *s, unsigned char **out, size_t *len);
void idem_core_sha256_hex(const void *data, size_t len, char out[IDEM_SHA256_HEX + 1]);

/* the log: start the next log job if none runs */
void idem_core_kick(struct idem_service *svc);
/* Call w->done once every record up to lsn is durable (at once if it is). */
void idem_core_wait_durable(struct idem_service *svc, struct waiter *w, uint64_t lsn,
                            void (*done)(struct waiter *w, int err));

/* calls and their answers: exactly one per call, which frees it */
struct idem_call *idem_core_call_dup(const struct idem_call *in);
void idem_core_ok(struct idem_call *call, json_t *result);
void idem_core_error_detail(struct idem_call *call, const char *code, json_t *detail,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define idem_core_error(call, code, ...) idem_core_error_detail(call, code, NULL, __VA_ARGS__)
/* The copy of a call to the loaded store, with its required string
 * arguments in order (pairs of a name and its const char **, then NULL):
 * NULL when answered already (out of memory, the store is not loaded, an
 * argument missing or not a string). */
struct idem_call *idem_core_open(const struct idem_call *in, ...);
/* A string argument: NULL when absent (*failed: answered bad_argument). */
const char *idem_core_arg_string(struct idem_call *call, const char *name, bool required,
                                 bool *failed);
/* The store is not loaded: answered. */
bool idem_core_unavailable(struct idem_call *call);
/* A store error of a mutation. */
void idem_core_store_error(struct idem_call *call, int r);
/* The answer to a begin that found an entry (v: the store's view). */
void idem_core_existing(struct idem_call *call, enum idem_outcome o, const struct idem_view *v,
                        const char *given_fp);

/* The result an operator's resolve --done leaves for a call (what a
 * duplicate is answered with): a tool write's claim w, else a tool run's
 * exit status 0 and no output; "completed_by" names uid and reason.
 * NULL: out of memory. */
char *idem_core_done_payload(const struct idem_write_claim *w, uid_t uid, const char *reason,
                             const char *how);

/* claims of callers */
void idem_core_claim_free(struct idem_claim *c);
/* The client of call (its SO_PEERCRED pid and start time); false: gone. */
bool idem_core_client(const struct idem_call *call, struct idem_client *ret);
/* c becomes the claim of call's connection; false: the caller is gone. */
bool idem_core_claim_adopt(struct idem_service *svc, struct idem_claim *c, struct idem_call *call);
struct idem_claim *idem_core_claim_find(struct idem_service *svc, const char *key);

/* The step a call comes from (false: from no step), as JSON. */
bool idem_core_step(const struct idem_call *call, struct idem_step_owner *ret);
json_t *idem_core_step_json(const struct idem_step_owner *o);
/* The epoch of the call's step (0: none); false after answering a fenced
 * or bad call. */
bool idem_core_epoch(struct idem_call *call, const struct idem_step_owner *step,
                     int64_t *ret_epoch);
