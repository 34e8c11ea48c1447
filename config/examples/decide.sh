#!/bin/sh
# SPDX-License-Identifier: MIT
# Demo decide phase: choose an action from the orient result
# ("results":{"orient":{...}}): write a report while some are missing.
set -eu
doc=$(cat)
missing=$(printf '%s' "$doc" | sed -n 's/.*"orient": *{[^}]*"missing": *\([0-9]*\).*/\1/p')
if [ "${missing:-0}" -gt 0 ]; then
        printf '{"action":"write_report","missing":%s}\n' "$missing"
else
        printf '{"action":"none","missing":0}\n'
fi
