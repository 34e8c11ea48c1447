#!/bin/sh
# SPDX-License-Identifier: MIT
# Demo observe phase: look at the world.  Reads its JSON document on stdin
# (unused here), prints a small JSON result: how many reports this mandate has
# already written to the outbox, and the host's uptime.
set -eu
cat >/dev/null
outbox=${DEMO_OUTBOX:-outbox}
mkdir -p "$outbox"
# Reports are named after the act step's idem key: <mandate>_act_NNN.
reports=$(ls "$outbox" | grep -c "^${KAIROS_MANDATE_ID}_act_" || true)
uptime_s=$(cut -d. -f1 /proc/uptime)
printf '{"cycle":%s,"reports":%s,"uptime_s":%s}\n' "$KAIROS_CYCLE" "$reports" "$uptime_s"
