/* SPDX-License-Identifier: MIT */
/* idem's store as its log (idem_log.c) loads it: the entries and what may
 * be done to them.  Private to idem.c and idem_log.c. */
#pragma once

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/canon.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"
#include "kairos/strmap.h"

#define B64 sodium_base64_VARIANT_ORIGINAL

struct entry {
        struct entry *prev, *next;      /* LRU list: completed/failed only */
        bool in_lru;
        enum idem_state state;
        int64_t created_ms;
        int64_t finished_ms;
        uint64_t lsn;                   /* its last record (0: loaded, durable) */
        unsigned char *result;
        size_t result_len;
        char *error_class;
        char *error_msg;
        char *reason;
        char tool[IDEM_TOOL_MAX + 1];
        char fp[CANON_HASH_STRLEN];     /* "" if unknown (salvaged from a bad line) */
        struct idem_step_owner owner;        /* owner.mandate "" if none */
        char *wpath;                    /* write claim: path, NULL if none */
        char wsha[IDEM_SHA256_HEX + 1];
        uint64_t wbytes;
        char *check;                    /* the call's check (JSON), NULL if none */
        struct idem_client client;      /* client.pid 0 if none */
        char key[];
};

struct idem_store {
        struct strmap *map;
        struct entry *mru, *lru;        /* LRU list ends */
        size_t count[4];
        int64_t ttl_ms;
        int64_t ttl_sec;
        size_t capacity;
        int64_t (*now_ms)(void *ctx);
        void *clock_ctx;
        struct kbuf pending;
        uint64_t lsn;
        uint64_t durable_lsn;
        uint64_t log_records;
        uint64_t hits, misses, conflicts, mismatches, evictions, expirations, full, forgets;
        bool quarantined;
        int error;
        bool loaded;
};

bool idem_valid_name(const char *s, size_t n, size_t max);
bool idem_valid_write_claim(const char *path, size_t path_len, const char *sha, size_t sha_len);
bool idem_valid_fp(const char *fp, size_t n);
bool idem_valid_full_key(const char *k, size_t n, size_t *tool_len);
void idem_entry_set_state(struct idem_store *s, struct entry *e, enum idem_state st);
void idem_entry_clear_payload(struct entry *e);
int idem_entry_add(struct idem_store *s, const char *key, size_t tool_len, const char *fp,
                   int64_t created_ms, struct entry **out);
void idem_entry_drop(struct idem_store *s, struct entry *e);
bool idem_entry_expired(const struct idem_store *s, const struct entry *e, int64_t now);
/* A log record's op for a state ("begin", "complete", "fail", "interrupt"),
 * and back: false for an op that is no state's ("forget" is read apart). */
const char *idem_state_op(enum idem_state st);
bool idem_op_state(const char *op, enum idem_state *ret);
