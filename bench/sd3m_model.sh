# sd3m_model.sh - sourced by the backbone benchmarks: the SD3-medium-block
# model (seeded bf16 weights) with $LAYERS layers and its inputs file for a
# ${LATENT}x${LATENT} latent and $CONTEXT context tokens. Sets DIR and IN.
KILN=${KILN:-$PWD/build/kiln}
DIR=build/bench-backbone/sd3m-${LAYERS}l
mkdir -p "$DIR"
cat > "$DIR/config.json" <<JSON
{"_class_name":"SD3Transformer2DModel","sample_size":128,"patch_size":2,"in_channels":16,"out_channels":16,
 "num_layers":$LAYERS,"attention_head_dim":64,"num_attention_heads":24,"joint_attention_dim":4096,
 "caption_projection_dim":1536,"pooled_projection_dim":2048,"pos_embed_max_size":192,"dual_attention_layers":[],"qk_norm":null}
JSON
[ -f "$DIR/model/config.json" ] || $KILN make-model "$DIR/model" --config "$DIR/config.json" --weights bf16 >/dev/null
IN="$DIR/in-${LATENT}-${CONTEXT}.safetensors"
[ -f "$IN" ] || $KILN make-model "$DIR/model" --force --config "$DIR/config.json" --weights bf16 \
   --inputs "$IN" --latent ${LATENT}x${LATENT} --context $CONTEXT >/dev/null
