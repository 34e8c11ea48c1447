/* SPDX-License-Identifier: MIT */
/* kairosctl recover --dry-run --probe: a step's Probe= run offline. */
#pragma once

#include "kairos/config.h"
#include "kairos/fold.h"
#include "kairos/probeout.h"

/* Run schedule sc's probe for step_id of f and judge it (*ret: release with
 * probe_word_clear).  -ENOENT: no such open step or no Probe=; -errno. */
int ctl_probe_run(const struct config *cfg, const struct config_schedule *sc,
                  const struct fold *f, const char *step_id, struct probe_word *ret);
