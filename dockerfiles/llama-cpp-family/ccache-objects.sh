#!/bin/sh
# ccache-objects.sh FROM TO: copy a ccache directory's objects, the regular files under its one-hex-digit
# directories (results, manifests and their stats: all that ccache keeps there), from FROM into TO.
# Nothing else is copied: not a ccache.conf at the top (some settings run commands; the build pins its
# own with CCACHE_CONFIGPATH besides), not a link (it could point anywhere in the build's container),
# not a device or a FIFO. FROM may come from outside the build (`moe-stack build --ccache-dir DIR`).
set -eu
from=$1
to=$2
mkdir -p "$to"
cd "$from"
for dir in 0 1 2 3 4 5 6 7 8 9 a b c d e f; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then
    # find doesn't follow links (-P): a linked directory inside is not walked, a linked file not copied.
    find "$dir" -type f -exec cp --parents --preserve=timestamps -t "$to" {} +
  fi
done
