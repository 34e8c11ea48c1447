/* SPDX-License-Identifier: MIT */
/* runenv: the environment every handler, hook and probe gets besides its
 * own variables.  Found once at start (getpwuid may ask NSS, which can
 * block). */
#pragma once

#include <sys/types.h>

/* Find HOME and USER of uid (the handlers' user), kairosctl next to kairosd
 * or on PATH, and PATH with kairosctl's directory first; logs what it could
 * not find. */
void runenv_init(uid_t uid);
/* PATH, HOME, USER and KAIROSCTL (HOME, USER, KAIROSCTL may be NULL:
 * unknown).  Borrowed, valid until exit. */
void runenv_get(const char **ret_path, const char **ret_home, const char **ret_user,
                const char **ret_kairosctl);
/* A handler's, hook's or probe's environment: PATH, LANG, HOME, USER,
 * LOGNAME and KAIROSCTL (those known), then kv's NAME, VALUE pairs (NULL
 * values left out), then extra's nextra NAME=VALUE strings.  NULL-terminated
 * and the array and its strings one allocation: free() it; NULL when out
 * of memory. */
char **runenv_build(const char *const (*kv)[2], size_t nkv, char *const *extra, size_t nextra);

/* runenv_build with what a step's handler and its probe both get
 * (KAIROS_MANDATE_ID ... KAIROS_CONTROL_SOCKET: runenv.c) before more's
 * nmore (at most 4) pairs. */
struct runenv_step {
        const char *mandate_id, *plan_id, *step_id;
        int phase;                    /* enum planner_phase */
        long long cycle;
        const char *idem_key, *schedule, *fired_at, *goal; /* goal NULL: the schedule's name */
        unsigned attempt;
        const char *control_socket;
};
char **runenv_build_step(const struct runenv_step *s, const char *const (*more)[2], size_t nmore,
                         char *const *extra, size_t nextra);

/* A handler's, hook's or probe's command line split into *ret_argv (left
 * NULL on an error it was given NULL), its $NAME and ${NAME} expanded from
 * env (config_expand_command).  -EINVAL with why filled, also for a command
 * name that comes out empty; -ENOMEM. */
int runenv_command(const char *cmdline, char *const *env, char ***ret_argv, char *why,
                   size_t why_len);
