#!/bin/sh
# test_cli_docs.sh KILN DOC - docs/cli.md and every subcommand's --help say
# the same options (issue 41): each option a command's --help names is
# documented in that command's sections of DOC (a "## kiln CMD ..." heading,
# or a heading naming `kiln CMD`) or in the common options' table at its top,
# and each option a section names is one its command's --help names. A
# mismatch is printed as "CMD: --option ..." and fails.
set -eu
KILN=$1 DOC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-test-cli-docs-XXXXXX")
trap 'rm -rf "$T"' EXIT
opts() { grep -oE -- '--[a-z][a-z0-9-]*[a-z0-9]' | sort -u; }

# the common options: the table between the top and the first "## " heading
awk '/^## /{exit} /^\| `--/' "$DOC" | opts > "$T/common"
[ -s "$T/common" ] || { echo "no common options' table at the top of $DOC"; exit 1; }

bad=0
for cmd in info forward generate cache compile package quality encode decode encode-image tokenize make-model demo; do
    "$KILN" $cmd --help > "$T/help" 2>&1 || { echo "$cmd: --help failed"; bad=1; continue; }
    opts < "$T/help" > "$T/h"
    # the command's sections: from a heading that names it to the next heading
    # (examples in fenced code blocks left out: they run other commands)
    awk -v c="$cmd" '
        /^```/ { code = !code; next }
        code { next }
        /^## / { on = (index($0, "## kiln " c " ") == 1 || $0 == "## kiln " c || index($0, "`kiln " c " ") > 0) ; next }
        on' "$DOC" > "$T/sec"
    [ -s "$T/sec" ] || { echo "$cmd: no section in $DOC (a heading '## kiln $cmd ...')"; bad=1; continue; }
    # the heading lines too: their synopsis names options
    grep -E "^## (kiln $cmd( |\$)|.*\`kiln $cmd )" "$DOC" >> "$T/sec" || true
    opts < "$T/sec" > "$T/d"
    missing=$(comm -23 "$T/h" "$T/d" | comm -23 - "$T/common" | tr '\n' ' ')
    stale=$(comm -13 "$T/h" "$T/d" | tr '\n' ' ')
    if [ -n "$missing" ]; then echo "$cmd: --help names options $DOC does not document: $missing"; bad=1; fi
    if [ -n "$stale" ]; then echo "$cmd: $DOC names options kiln $cmd --help does not: $stale"; bad=1; fi
done
[ $bad -eq 0 ] && echo "test_cli_docs: every subcommand's --help and $DOC name the same options"
exit $bad
