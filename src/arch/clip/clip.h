/* clip.h - the CLIP text encoder (transformers' CLIPTextModel and
 * CLIPTextModelWithProjection): its config, the weights it expects, and its
 * forward pass written once as code that builds a graph. SD3 runs two of
 * them (CLIP-L, CLIP-G: text_encoder, text_encoder_2), Flux.1 one (CLIP-L
 * without the projection). */
#ifndef KILN_CLIP_H
#define KILN_CLIP_H

#include "arch/arch.h"
#include "graph/graph.h"
#include "kiln.h"

/* The family (clip_arch.c): both models, told apart by the config's
 * "architectures"; the outputs follow the config (clip_outputs). */
extern const ka_arch ka_clip;

/* The forward's symbols: batch and tokens (input_ids [batch, tokens]). */
enum { CLIP_SYM_BATCH, CLIP_SYM_TOKENS, CLIP_NSYM };

enum { CLIP_ACT_QUICK_GELU = 0, CLIP_ACT_GELU = 1 };

/* transformers' CLIPTextConfig, the keys the forward reads */
typedef struct clip_config {
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int projection_dim;
    int num_hidden_layers;
    int num_attention_heads;
    int max_position_embeddings;
    int hidden_act; /* CLIP_ACT_* */
    double layer_norm_eps;
    int bos_token_id, eos_token_id, pad_token_id;
    int with_projection; /* CLIPTextModelWithProjection: text_projection and text_embeds */
} clip_config;

/* every hidden state is an output, with the four named ones: within KA_MAX_OUT */
#define CLIP_MAX_LAYERS (KA_MAX_OUT - 5)
#define CLIP_MAX_VOCAB (1 << 24) /* token ids travel as f32: exact below 2^24 */

/* A config from the tensors' shapes (an all-in-one file's text encoder):
 * clip_config.c says which shape gives what and what no shape holds. */
kiln_status clip_config_infer(const kc_checkpoint *c, clip_config *x);
/* a CLIPTextModel saved without the text_model. prefix (transformers 5.25):
 * the names given it (clip_names.c) */
extern const kc_renamer clip_renamer;
/* transformers' CLIPTextConfig defaults for keys missing from config.json */
clip_config clip_config_defaults(void);
/* Does this config.json describe a CLIP text model, and which kind:
 * 1 CLIPTextModelWithProjection, 0 CLIPTextModel, -1 neither. By
 * "architectures", else model_type "clip_text_model" (a CLIPTextModel). */
int clip_config_kind(const char *json);
/* Parse config.json text (missing keys take the defaults), then validate;
 * with_projection from "architectures" (clip_config_kind). */
kiln_status clip_config_parse(const char *json, clip_config *cfg);
/* Reject impossible values with a message naming the key. */
kiln_status clip_config_validate(const clip_config *cfg);
/* Serialise as a transformers config.json (malloc'd). */
char *clip_config_to_json(const clip_config *cfg);
/* The weights a config needs, in a stable order. Caller frees *out. */
kiln_status clip_weight_spec(const clip_config *cfg, ka_spec **out, size_t *n);

/* The outputs of a config, in the graph's order: last_hidden_state
 * [B,T,D], hidden_states_penultimate [B,T,D] (hidden_states[-2], SD3's),
 * pooler_output [B,D], with the projection text_embeds [B,P], then
 * hidden_states_0 .. hidden_states_L [B,T,D] (transformers'
 * output_hidden_states: the embeddings, then every layer's output). Returns
 * their count; names[] holds the numbered names. */
int clip_outputs(const clip_config *cfg, ka_io *out, char (*names)[48]);

/* Build the forward for input_ids [B,T] (token ids as f32), with the
 * outputs of clip_outputs. */
kiln_status clip_build_forward(const clip_config *cfg, kg_graph *g, int64_t B, int64_t T);

#endif
