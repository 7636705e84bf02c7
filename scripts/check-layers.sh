#!/usr/bin/env bash
# The layers of src/ (docs/ARCHITECTURE.md): a module may include its own
# headers and those of modules on a lower level, never one on its level or
# above. Fails, naming the file and the include, when one does; a module not
# in the table fails too (add it where it belongs).
#   scripts/check-layers.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
declare -A level=(
    [base]=0
    [tensor]=1
    [format]=2 [dist]=2 [kernels]=2
    [cache]=3 [graph]=3
    [compile]=4
    [arch]=5
    [model]=6
    [pipeline]=7 [sample]=7
    [cli]=8
)
bad=0
for dir in src/*/; do
    m=$(basename "$dir")
    if [ -z "${level[$m]+x}" ]; then
        echo "check-layers: src/$m is in no layer (add it to scripts/check-layers.sh and docs/ARCHITECTURE.md)"
        bad=1
        continue
    fi
    while IFS=: read -r file inc; do
        dep=${inc%%/*}
        [ "$dep" = "$m" ] && continue
        if [ -z "${level[$dep]+x}" ]; then
            echo "check-layers: $file includes \"$inc\" from src/$dep, which is in no layer"
            bad=1
        elif [ "${level[$dep]}" -ge "${level[$m]}" ]; then
            echo "check-layers: $file (src/$m, layer ${level[$m]}) includes \"$inc\" (src/$dep, layer ${level[$dep]})"
            bad=1
        fi
    done < <(grep -rHo '^#include "[a-z_0-9]*/[^"]*"' "$dir" | sed 's/:#include "/:/; s/"$//')
done
# the kernels of one CPU class do not include another class's (kernels/cpu)
for f in src/kernels/cpu/*f16*; do
    if grep -q '#include "kernels/cpu/[a-z_]*amx' "$f"; then
        echo "check-layers: $f (fp16 kernels) includes the AMX kernels' header"
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "check-layers: every include goes down a layer"
exit $bad
