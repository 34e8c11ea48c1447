#!/bin/sh
# SPDX-License-Identifier: MIT
# Example act with an effect kairos cannot see: appends one message, tagged
# with this step's idem key (KAIROS_IDEM_KEY: the same on every attempt of the
# step), to $OUTBOX/messages.  outbox-probe.sh finds it there after a crash.
set -eu
outbox=${OUTBOX:-outbox}
mkdir -p "$outbox"
printf '%s hello from %s at %s\n' "$KAIROS_IDEM_KEY" "$KAIROS_MANDATE_ID" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$outbox/messages"
sync "$outbox/messages"
printf '{"sent":"%s"}\n' "$KAIROS_IDEM_KEY"
