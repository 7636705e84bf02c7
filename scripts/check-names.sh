#!/usr/bin/env bash
# One home for each model family's names (docs/ARCHITECTURE.md): the
# diffusers transformers' weight names and symbols (SD3's, which Flux shares)
# appear in src/arch/sd3/ and src/arch/flux/ only; the rest of kiln reads
# them through the architecture table. Fails naming each line that has one.
#   scripts/check-names.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
pattern='transformer_blocks|context_embedder|pos_embed\.|time_text_embed|joint_blocks|norm1_context|x_embedder|\bh_tok\b|\bw_tok\b|\bctx_len\b'
hits=$(grep -rnE "$pattern" src include --include='*.c' --include='*.h' | grep -vE '^src/arch/(sd3|flux)/' || true)
if [ -n "$hits" ]; then
    echo "check-names: transformer names outside src/arch/sd3/ and src/arch/flux/ (read them through the architecture table):"
    echo "$hits"
    exit 1
fi
echo "check-names: the transformers' names live in src/arch/sd3/ and src/arch/flux/ only"
