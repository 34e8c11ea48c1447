#!/bin/sh
# SPDX-License-Identifier: MIT
# Example probe for outbox-act.sh: is the message of this step (its idem key,
# KAIROS_IDEM_KEY) in $OUTBOX/messages?  Only looks.  Prints
# {"state":"done","result":...} if it is, {"state":"not_started"} if not; a
# failure (exit status 2) when the outbox cannot be read, so that an operator
# decides rather than kairos guessing.
set -eu
outbox=${OUTBOX:-outbox}
cat >/dev/null # the step's document (unused here)
if [ ! -e "$outbox/messages" ]; then
        printf '{"state":"not_started"}\n'
        exit 0
fi
if [ ! -r "$outbox/messages" ]; then
        echo "cannot read $outbox/messages" >&2
        exit 2
fi
if grep -q "^$KAIROS_IDEM_KEY " "$outbox/messages"; then
        printf '{"state":"done","result":{"sent":"%s","found_by":"probe"}}\n' "$KAIROS_IDEM_KEY"
else
        printf '{"state":"not_started"}\n'
fi
