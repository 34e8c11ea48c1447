/* SPDX-License-Identifier: MIT */
/* creds: see creds.h. */
#include "creds.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CAP_BIT(c) (UINT64_C(1) << (c))
#define HANDLER_CAPS (CAP_BIT(CAP_SETUID) | CAP_BIT(CAP_SETGID) | CAP_BIT(CAP_KILL))

struct caps {
        uint64_t eff, perm, inh;
};

static int caps_get(struct caps *ret)
{
        struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
        struct __user_cap_data_struct d[2];
        memset(d, 0, sizeof d);
        if (syscall(SYS_capget, &h, d) < 0)
                return -errno;
        ret->eff = d[0].effective | (uint64_t)d[1].effective << 32;
        ret->perm = d[0].permitted | (uint64_t)d[1].permitted << 32;
        ret->inh = d[0].inheritable | (uint64_t)d[1].inheritable << 32;
        return 0;
}

static int caps_set(const struct caps *c)
{
        struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
        struct __user_cap_data_struct d[2] = {
                { (uint32_t)c->eff, (uint32_t)c->perm, (uint32_t)c->inh },
                { (uint32_t)(c->eff >> 32), (uint32_t)(c->perm >> 32), (uint32_t)(c->inh >> 32) },
        };
        return syscall(SYS_capset, &h, d) < 0 ? -errno : 0;
}

void handler_user_clear(struct handler_user *u)
{
        free(u->name);
        free(u->home);
        memset(u, 0, sizeof(*u));
}

static int lookup(const char *name, struct handler_user *u, char *why, size_t why_len)
{
        errno = 0;
        struct passwd *pw = getpwnam(name);
        if (!pw) {
                int e = errno ? errno : ENOENT;
                snprintf(why, why_len, "HandlerUser=%s: %s", name,
                         e == ENOENT ? "no such user" : strerror(e));
                return -e;
        }
        if (pw->pw_uid == 0 || pw->pw_uid == geteuid()) {
                snprintf(why, why_len, "HandlerUser=%s is %s: handlers would own kairosd's "
                         "cgroups and files (a user of their own, e.g. kairos-handler)",
                         name, pw->pw_uid == 0 ? "root" : "kairosd's own user");
                return -EINVAL;
        }
        u->uid = pw->pw_uid;
        u->gid = pw->pw_gid;
        u->name = strdup(name);
        u->home = strdup(pw->pw_dir && *pw->pw_dir ? pw->pw_dir : "/");
        if (!u->name || !u->home)
                return -ENOMEM;
        int n = CREDS_MAX_GROUPS;
        if (getgrouplist(name, pw->pw_gid, u->groups, &n) < 0) {
                snprintf(why, why_len, "HandlerUser=%s: member of more than %d groups", name,
                         CREDS_MAX_GROUPS);
                return -E2BIG;
        }
        u->ngroups = (size_t)n;
        u->set = true;
        return 0;
}

int creds_setup(const char *name, struct handler_user *ret, char *why, size_t why_len)
{
        memset(ret, 0, sizeof(*ret));
        /* nothing kairosd starts gets a capability through exec */
        (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        struct caps c = { 0, 0, 0 };
        int r = caps_get(&c);
        if (r < 0) {
                snprintf(why, why_len, "capget: %s", strerror(-r));
                return r;
        }
        if (!name) {
                /* root keeps its capabilities (handlers as root get them
                 * anyway); anyone else needs none */
                if (geteuid() != 0 && (c.perm | c.inh))
                        (void)caps_set(&(struct caps){ 0, 0, 0 });
                return 0;
        }
        if ((r = lookup(name, ret, why, why_len)) < 0) {
                handler_user_clear(ret);
                return r;
        }
        uint64_t missing = HANDLER_CAPS & ~c.perm;
        if (missing) {
                snprintf(why, why_len,
                         "HandlerUser=%s needs the capabilities%s%s%s, which kairosd lacks "
                         "(under systemd: AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL "
                         "and the same in CapabilityBoundingSet=, as the shipped unit has)",
                         name, missing & CAP_BIT(CAP_SETUID) ? " CAP_SETUID" : "",
                         missing & CAP_BIT(CAP_SETGID) ? " CAP_SETGID" : "",
                         missing & CAP_BIT(CAP_KILL) ? " CAP_KILL" : "");
                handler_user_clear(ret);
                return -EPERM;
        }
        struct caps want = { HANDLER_CAPS, HANDLER_CAPS, 0 };
        if (geteuid() == 0)
                want = (struct caps){ c.perm, c.perm, 0 };
        if ((r = caps_set(&want)) < 0) {
                snprintf(why, why_len, "HandlerUser=%s: capset: %s", name, strerror(-r));
                handler_user_clear(ret);
                return r;
        }
        return 0;
}
