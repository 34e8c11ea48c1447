#!/bin/sh
# SPDX-License-Identifier: MIT
# Demo orient phase: make sense of the observation.  Takes the observe result
# from its stdin document ("results":{"observe":{...}}) and works out how many
# reports are still missing (the goal is two per mandate).
set -eu
doc=$(cat)
reports=$(printf '%s' "$doc" | sed -n 's/.*"observe": *{[^}]*"reports": *\([0-9]*\).*/\1/p')
reports=${reports:-0}
want=2
missing=$((want - reports))
[ "$missing" -ge 0 ] || missing=0
printf '{"missing":%s,"reports":%s,"want":%s}\n' "$missing" "$reports" "$want"
