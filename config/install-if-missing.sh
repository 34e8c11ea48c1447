#!/bin/sh
# SPDX-License-Identifier: MIT
# meson install script: install SRC as DEST (under $DESTDIR) with MODE,
# unless DEST already exists -- an admin's configuration is never replaced.
#   install-if-missing.sh SRC DEST MODE
set -eu
src=$1 dest=${DESTDIR:-}$2 mode=$3
if [ -e "$dest" ] || [ -L "$dest" ]; then
        echo "kept existing $dest (the example is in the share directory)"
        exit 0
fi
mkdir -p "$(dirname "$dest")"
install -m "$mode" "$src" "$dest"
echo "installed $dest"
