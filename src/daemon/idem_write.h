/* SPDX-License-Identifier: MIT */
/* idem_write: tool-write, kairosctl tool write (docs/design.md §11), and the
 * settling of the writes a crash interrupted.  For idem_service.c and the
 * drivers of tool-call claims (toolclaims.h). */
#pragma once

#include "idem_core.h"

struct config;
struct write_roots;

struct write_op {
        struct waiter w;
        struct idem_service *svc;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        char fp[CANON_HASH_STRLEN];
        char *explicit_key;
        char *path;              /* as given */
        struct write_roots *roots; /* WriteRoots= when the request came */
        unsigned beneath_flags;
        unsigned char *content;
        size_t len;
        char sha[IDEM_SHA256_HEX + 1]; /* of content */
        /* results of the pool jobs */
        int dfd;                 /* the verified directory, or -1 */
        char *base;              /* the file name in it */
        char *shown;             /* the path as reported: root + '/' + the rest */
        const char *code;        /* refused: error code */
        char msg[2048];
        bool renamed;            /* the file may have been replaced */
        uint64_t lsn;
        /* cluster mode: claimed in the database for this step's mandate at
         * epoch (0: in the local store) */
        int64_t epoch;
        char mandate[IDEM_OWNER_ID_MAX + 1];
        /* a streamed write (tool-write with args.stream): the content goes
         * into a temporary file in the verified directory as it comes,
         * hashed on the way; the key is claimed once it is all there */
        struct idem_claim *stream; /* ties the stream to its connection */
        int tmp_fd;              /* -1 */
        char *tmp;               /* the temporary file in dfd until renamed or removed */
        crypto_hash_sha256_state hash;
        unsigned char *chunk;    /* the chunk being written (pool) */
        size_t chunk_len;
        int chunk_err;           /* errno of the pool job */
        bool busy;               /* a pool job of the stream in flight */
        bool gone;               /* its connection went meanwhile */
        struct idem_call *refused; /* answered (code, msg) once its temporary is gone */
};


/* WriteRoots= of cfg, nothing opened yet (loop); dropped by the last user. */
struct write_roots *idem_write_roots_new(const struct config *cfg);
void idem_write_roots_unref(struct write_roots *rs);
/* Pool, at load: settle the writes a crash interrupted (svc->settle_roots). */
void idem_write_settle(struct idem_service *svc);

/* Frees op; a temporary file it left is removed on write_q first. */
void idem_write_op_free(struct write_op *op);
/* op is refused: code and message */
void idem_write_refuse(struct write_op *op, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
void idem_write_reply(struct write_op *op, bool cached);
/* A duplicate of a write: answered as the first time (op freed). */
void idem_write_existing(struct write_op *op, enum idem_outcome o, const struct idem_view *v);
/* write_q: the write itself (pool), then its outcome recorded (loop). */
void idem_write_work(void *arg);
void idem_write_done(void *arg);
