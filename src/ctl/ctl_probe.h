/* SPDX-License-Identifier: MIT */
/* kairosctl recover --dry-run --probe: a step's Probe= run offline. */
#pragma once

#include "kairos/config.h"
#include "kairos/fold.h"
#include "kairos/probeout.h"

/* An interrupted call's own check (kairosctl tool run --check). */
struct ctl_check_call {
        const char *key;    /* "<tool>:<key>" */
        const char *tool;
        const char *check;  /* {"cmd":[...],"argv":[...]} */
};

/* Run schedule sc's probe for step_id of f — or, call non-NULL, that
 * call's check (its environment and stdin as kairosd gives them) — and
 * judge it (*ret: release with probe_word_clear).  -ENOENT: no such open
 * step or no Probe=; -errno. */
int ctl_probe_run(const struct config *cfg, const struct config_schedule *sc,
                  const struct fold *f, const char *step_id, const struct ctl_check_call *call,
                  struct probe_word *ret);
