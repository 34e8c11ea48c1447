/* SPDX-License-Identifier: MIT */
/* creds: the user handlers run as (HandlerUser=) and the capabilities
 * kairosd keeps for it.
 *
 * Handlers that run as kairosd's own user own what kairosd owns: their
 * cgroup's limit files, kairosd's cgroup, its state, kairosd itself.  With
 * HandlerUser= they run as another user, which owns none of it; kairosd then
 * needs CAP_SETUID and CAP_SETGID (to switch in the child before exec) and
 * CAP_KILL (to signal their process groups), and keeps no other capability.
 * See kairosd(8), HANDLERS, and docs/design.md. */
#ifndef KAIROS_DAEMON_CREDS_H
#define KAIROS_DAEMON_CREDS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define CREDS_MAX_GROUPS 64

struct handler_user {
        bool set;                     /* false: handlers run as kairosd's user */
        uid_t uid;
        gid_t gid;
        gid_t groups[CREDS_MAX_GROUPS]; /* supplementary groups (the user's) */
        size_t ngroups;
        char *name;                   /* owned */
        char *home;                   /* owned: the handlers' default working directory */
};

/* Resolve name (HandlerUser=; NULL: none, *ret unset) and make sure kairosd
 * may run handlers as it: it must exist, be neither root nor kairosd's own
 * user, and kairosd must hold CAP_SETUID, CAP_SETGID and CAP_KILL (raised
 * into its effective set; every other capability is dropped).  Without
 * name, the capabilities kairosd does not need are dropped too (an ambient
 * or inheritable one would otherwise reach the handlers).  0, or a negative
 * errno with why filled (a start error). */
int creds_setup(const char *name, struct handler_user *ret, char *why, size_t why_len);

void handler_user_clear(struct handler_user *u);

#endif
