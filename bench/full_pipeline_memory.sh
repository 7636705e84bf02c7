#!/usr/bin/env bash
# bench/full_pipeline_memory.sh - a full-size SD3.5-medium-shaped pipeline in bounded memory:
# every component at its real size with seeded weights (kiln make-model from each config:
# CLIP-L, CLIP-G 32 layers, T5-XXL 24 layers, the SD3.5-medium transformer's 24 blocks with dual
# attention in 0-12, SD3's VAE; 16 GB of bf16), the tiny pipeline's tokenizers, scheduler and
# model_index.json. Measures the peak RSS and wall time of converting it into the cache and of
# one `kiln generate` on the caches with and without --low-memory (which must give the same PNG).
# Needs kiln built (make build), /usr/bin/time (apt-get install time) and ~40 GB of free disk
# (16 GB of checkpoints, an 18 GB cache); the folder is kept for the next run.
# --class flux: a full-size FLUX.1-dev-shaped FluxPipeline instead (CLIP-L, T5-XXL 24 layers,
# the transformer's 19 double and 38 single blocks at width 3072 with the guidance embedding:
# 11.9 B parameters, FLUX.1's VAE; 34 GB of bf16; with --quant int8 a 12 GB transformer cache;
# ~60 GB of free disk), the flux-pipeline-tiny case's tokenizers, scheduler and index.
#
#   bench/full_pipeline_memory.sh [--class sd3|flux] [--quant none|int8|fp8] [--dir build/full-pipeline]
#                                 [--size 512] [--steps 2] [--threads 2]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=build/full-pipeline SIZE=512 STEPS=2 THREADS=2 CLASS=sd3 QUANT=none
while [ $# -gt 0 ]; do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --class) CLASS=$2; shift 2 ;;
    --quant) QUANT=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/full_pipeline_memory.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
KILN=build/kiln
case $CLASS in
  sd3) TINY=tests/data/goldens/sd3-pipeline-tiny P=$DIR/sd35m-full NEED=40 ;;
  flux) TINY=tests/data/goldens/flux-pipeline-tiny P=$DIR/flux-dev-full NEED=60 ;;
  *) echo "--class $CLASS: sd3 or flux" >&2; exit 2 ;;
esac
case $QUANT in none|int8|fp8) ;; *) echo "--quant $QUANT: none, int8 or fp8" >&2; exit 2 ;; esac
[ -x $KILN ] || { echo "build kiln first (make build)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time for the peak RSS: apt-get install time" >&2; exit 1; }
C=$DIR/cache-$CLASS-$QUANT
mkdir -p "$DIR"
if [ ! -f $P/model_index.json ] || [ ! -d $C ]; then
  avail=$(df --output=avail -k "$DIR" | tail -1)
  [ "$avail" -gt $((NEED * 1024 * 1024)) ] || { echo "$DIR: $((avail / 1024 / 1024)) GB free; this needs ~$NEED GB" >&2; exit 1; }
fi
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error

if [ $CLASS = flux ] && [ ! -f $P/model_index.json ]; then  # written whole or not at all
  T=$P.tmp; rm -rf $T; mkdir -p $T/configs
  cp -r $TINY/model_index.json $TINY/scheduler $TINY/tokenizer $TINY/tokenizer_2 $T/
  cat > $T/configs/text_encoder.json <<JSON
{"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", "vocab_size": 49408,
 "max_position_embeddings": 77, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "layer_norm_eps": 1e-05,
 "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
 "hidden_act": "quick_gelu", "projection_dim": 768}
JSON
  cat > $T/configs/text_encoder_2.json <<JSON
{"architectures": ["T5EncoderModel"], "model_type": "t5", "vocab_size": 32128, "d_model": 4096, "d_kv": 64,
 "d_ff": 10240, "num_layers": 24, "num_heads": 64, "relative_attention_num_buckets": 32,
 "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu", "layer_norm_epsilon": 1e-06,
 "is_encoder_decoder": false, "use_cache": false}
JSON
  cat > $T/configs/transformer.json <<JSON
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "out_channels": null,
 "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24,
 "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": true, "axes_dims_rope": [16, 56, 56]}
JSON
  cat > $T/configs/vae.json <<JSON
{"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3, "latent_channels": 16,
 "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu", "norm_num_groups": 32,
 "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159, "use_quant_conv": false,
 "use_post_quant_conv": false, "mid_block_add_attention": true,
 "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
 "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]}
JSON
  for c in text_encoder text_encoder_2 transformer vae; do
    echo "writing $c (seeded, bf16)" >&2
    $KILN make-model $T/$c --config $T/configs/$c.json --weights bf16 --seed 1 > /dev/null
  done
  rm -rf $P; mv $T $P
fi
if [ ! -f $P/model_index.json ]; then  # written whole or not at all: an interrupted write is redone
  T=$P.tmp; rm -rf $T; mkdir -p $T/configs
  cp -r $TINY/model_index.json $TINY/scheduler $TINY/tokenizer $TINY/tokenizer_2 $TINY/tokenizer_3 $T/
  clip='"architectures": ["CLIPTextModelWithProjection"], "model_type": "clip_text_model", "vocab_size": 49408,
    "max_position_embeddings": 77, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "layer_norm_eps": 1e-05'
  cat > $T/configs/text_encoder.json <<EOF
{$clip, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
 "hidden_act": "quick_gelu", "projection_dim": 768}
EOF
  cat > $T/configs/text_encoder_2.json <<EOF
{$clip, "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
 "hidden_act": "gelu", "projection_dim": 1280}
EOF
  cat > $T/configs/text_encoder_3.json <<EOF
{"architectures": ["T5EncoderModel"], "model_type": "t5", "vocab_size": 32128, "d_model": 4096, "d_kv": 64,
 "d_ff": 10240, "num_layers": 24, "num_heads": 64, "relative_attention_num_buckets": 32,
 "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu", "layer_norm_epsilon": 1e-06,
 "is_encoder_decoder": false, "use_cache": false}
EOF
  cat > $T/configs/transformer.json <<EOF
{"_class_name": "SD3Transformer2DModel", "sample_size": 128, "patch_size": 2, "in_channels": 16,
 "out_channels": 16, "num_layers": 24, "attention_head_dim": 64, "num_attention_heads": 24,
 "joint_attention_dim": 4096, "caption_projection_dim": 1536, "pooled_projection_dim": 2048,
 "pos_embed_max_size": 384, "dual_attention_layers": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
 "qk_norm": "rms_norm"}
EOF
  cat > $T/configs/vae.json <<EOF
{"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3, "latent_channels": 16,
 "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu", "norm_num_groups": 32,
 "sample_size": 1024, "scaling_factor": 1.5305, "shift_factor": 0.0609, "use_quant_conv": false,
 "use_post_quant_conv": false, "mid_block_add_attention": true,
 "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
 "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]}
EOF
  for c in text_encoder text_encoder_2 text_encoder_3 transformer vae; do
    echo "writing $c (seeded, bf16)" >&2
    $KILN make-model $T/$c --config $T/configs/$c.json --weights bf16 --seed 1 > /dev/null
  done
  rm -rf $P; mv $T $P
fi

measure() {  # label, then the command: its peak RSS and wall time (from /usr/bin/time)
  local label=$1; shift
  /usr/bin/time -f "%M %e" -o $DIR/time.txt "$@" > $DIR/log.txt 2>&1 || { cat $DIR/log.txt >&2; exit 1; }
  read -r kb s < $DIR/time.txt
  awk -v l="$label" -v kb="$kb" -v s="$s" 'BEGIN { printf "| %s | %.2f GB | %s s |\n", l, kb / 1048576, s }'
}
echo "full-size $CLASS pipeline $P ($(du -sh $P | cut -f1) on disk), ${SIZE}x$SIZE, $STEPS steps, --quant $QUANT, $THREADS threads; $(nproc) CPUs, $(free -g | awk '/Mem/ {print $2}') GiB of memory"
echo "| run | peak RSS | wall |"
echo "|---|---|---|"
Q=(); [ $QUANT = none ] || Q=(--quant $QUANT)
G=(generate $P --cache-dir $C --prompt "a lighthouse at dawn" --width $SIZE --height $SIZE --steps $STEPS --seed 1 "${Q[@]}")
measure "kiln cache build (a miss converts every component; a hit maps them)" $KILN cache build $P --cache-dir $C "${Q[@]}"
measure "kiln generate on the caches" $KILN "${G[@]}" --output $DIR/auto.png
measure "kiln generate --low-memory" $KILN "${G[@]}" --low-memory --output $DIR/low.png
cmp -s $DIR/auto.png $DIR/low.png && echo "the two images: the same PNG" || { echo "the two images differ" >&2; exit 1; }
echo "cache: $(du -sh $C | cut -f1)"
