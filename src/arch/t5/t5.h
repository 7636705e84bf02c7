/* t5.h - the T5 encoder (transformers' T5EncoderModel; v1.1 in SD3's
 * text_encoder_3 and Flux's text_encoder_2): its config, the weights it
 * expects, and its forward pass written once as code that builds a graph.
 *
 *   input_ids [B, T] (token ids as f32) -> last_hidden_state [B, T, d_model]
 *
 * Symbols: batch (0) and tokens (the tokenizer's padded length: 256 for
 * SD3, 512 for Flux-dev). */
#ifndef KILN_T5_H
#define KILN_T5_H

#include "arch/arch.h"
#include "graph/graph.h"
#include "kiln.h"

/* The family's table (t5_arch.c). */
extern const ka_arch ka_t5;

enum { T5_SYM_BATCH, T5_SYM_TOKENS, T5_NSYM };

/* transformers' ACT2FN names the feed-forward takes */
enum { T5_ACT_RELU, T5_ACT_GELU_TANH /* gelu_new, gelu_pytorch_tanh */, T5_ACT_GELU /* exact, erf */ };

#define T5_MAX_LAYERS 256
#define T5_MAX_TOKENS 4096 /* the position bias is [heads, T, T] floats */
#define T5_MAX_BATCH 1024
#define T5_MAX_VOCAB (1 << 24) /* ids enter the graph as f32, exact below 2^24 */

typedef struct t5_config {
    int vocab_size;
    int d_model, d_kv, d_ff;
    int num_layers, num_heads;
    int num_buckets;  /* relative_attention_num_buckets */
    int max_distance; /* relative_attention_max_distance */
    double eps;       /* layer_norm_epsilon */
    int gated;        /* feed_forward_proj "gated-*": wo(act(wi_0 x) * wi_1 x); else wo(act(wi x)) */
    int act;          /* T5_ACT_* */
} t5_config;

/* transformers' T5Config defaults for keys missing from config.json */
t5_config t5_config_defaults(void);
/* A config from the tensors' shapes (an all-in-one file's t5xxl) and the
 * renamer of an embedding saved as encoder.embed_tokens (t5_names.c). */
kiln_status t5_config_infer(const kc_checkpoint *c, t5_config *x);
extern const kc_renamer t5_renamer;
/* Parse config.json text; every value checked, messages naming the key. */
kiln_status t5_config_parse(const char *json, t5_config *cfg);
kiln_status t5_config_validate(const t5_config *cfg);
/* transformers' config.json form (malloc'd) */
char *t5_config_to_json(const t5_config *cfg);
/* The weights a config needs, in a stable order. Caller frees *out. */
kiln_status t5_weight_spec(const t5_config *cfg, ka_spec **out, size_t *n);
/* Build the forward for ids [B, T]; par NULL: one process (FSDP: each
 * block's weights gathered before it; no tensor or sequence parallel). */
kiln_status t5_build_forward(const t5_config *cfg, kg_graph *g, int64_t B, int64_t T, const ka_par *par);

#endif
