#!/usr/bin/env bash
# Resolve the "native-frame" lines of segv_backtrace.c (read from stdin) with addr2line: function and
# file:line per frame (static and inlined code included when the object has symbols or debug info).
set -uo pipefail
re='^native-frame #([0-9]+) [^ ]+ ([^ ]+)\+(0x[0-9a-f]+)'
while IFS= read -r line; do
  echo "$line"
  if [[ $line =~ $re ]]; then
    obj=${BASH_REMATCH[2]}; off=${BASH_REMATCH[3]}
    # return addresses point after the call: resolve the byte before
    prev=$(printf '0x%x' $((off - 1)))
    [ -f "$obj" ] && command -v addr2line >/dev/null && addr2line -f -C -i -e "$obj" "$prev" 2>/dev/null | sed 's/^/        /'
  fi
done
