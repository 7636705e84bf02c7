#!/usr/bin/env bash
# One home for each model family's names (docs/ARCHITECTURE.md): SD3's weight
# names and symbols appear in src/arch/sd3/ only; the rest of kiln reads them
# through the architecture table. Fails naming each line that has one.
#   scripts/check-names.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
pattern='transformer_blocks|context_embedder|pos_embed\.|time_text_embed|joint_blocks|norm1_context|x_embedder|\bh_tok\b|\bw_tok\b|\bctx_len\b'
hits=$(grep -rnE "$pattern" src include --include='*.c' --include='*.h' | grep -v '^src/arch/sd3/' || true)
if [ -n "$hits" ]; then
    echo "check-names: SD3 names outside src/arch/sd3/ (read them through the architecture table):"
    echo "$hits"
    exit 1
fi
echo "check-names: SD3's names live in src/arch/sd3/ only"
