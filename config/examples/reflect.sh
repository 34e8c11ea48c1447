#!/bin/sh
# SPDX-License-Identifier: MIT
# Demo reflect phase: judge the cycle.  Looks at the orient and act results of
# this cycle; prints {"kairos":{"done":true}} (the mandate ends) once no report
# is missing or after cycle 2, otherwise a summary (the next cycle runs).
set -eu
doc=$(cat)
missing=$(printf '%s' "$doc" | sed -n 's/.*"orient": *{[^}]*"missing": *\([0-9]*\).*/\1/p')
missing=${missing:-0}
act=$(printf '%s' "$doc" | sed -n 's/.*"act": *{ *"\([a-z_]*\)".*/\1/p')
case $act in
wrote|already_written) missing=$((missing - 1)) ;;
esac
if [ "$missing" -le 0 ] || [ "$KAIROS_CYCLE" -ge 2 ]; then
        printf '{"kairos":{"done":true},"missing":%s}\n' "$missing"
else
        printf '{"missing":%s}\n' "$missing"
fi
