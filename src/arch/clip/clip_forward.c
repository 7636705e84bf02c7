/* clip_forward.c - the CLIP text encoder's forward, written once as graph
 * building. It follows transformers' CLIPTextTransformer.forward (and
 * CLIPTextModelWithProjection's projection); names in the comments are
 * transformers' so the two read side by side. */
#include "arch/clip/clip.h"
#include "base/base.h"

#include <math.h>
#include <stdio.h>

/* nn.Linear by name: name.weight [out, in] and (bias) name.bias [out] */
static kg_id lin(kg_graph *g, kg_id x, const char *layer, const char *name, int bias) {
    char w[128], b[128];
    snprintf(w, sizeof w, "%s%s.weight", layer, name);
    snprintf(b, sizeof b, "%s%s.bias", layer, name);
    return kg_linear(g, x, kg_weight(g, w), bias ? kg_weight(g, b) : -1);
}

/* nn.LayerNorm by name: (x - mean) / sqrt(var + eps) * weight + bias */
static kg_id norm(kg_graph *g, kg_id x, const char *layer, const char *name, float eps) {
    char w[128], b[128];
    snprintf(w, sizeof w, "%s%s.weight", layer, name);
    snprintf(b, sizeof b, "%s%s.bias", layer, name);
    return kg_layernorm_affine(g, x, kg_weight(g, w), kg_weight(g, b), eps);
}

/* CLIPEncoderLayer: pre-LN causal self-attention and MLP, each residual;
 * h [B,T,D] -> [B,T,D] */
static kg_id encoder_layer(const clip_config *c, kg_graph *g, kg_id h, int i) {
    char L[64];
    snprintf(L, sizeof L, "text_model.encoder.layers.%d.", i);
    float eps = (float)c->layer_norm_eps;
    int64_t dh = c->hidden_size / c->num_attention_heads;

    /* CLIPAttention: softmax(q k^T / sqrt(head_dim) + causal mask) v; no
     * padding mask (the pipelines give none) */
    kg_id x = norm(g, h, L, "layer_norm1", eps);
    kg_id q = lin(g, x, L, "self_attn.q_proj", 1), k = lin(g, x, L, "self_attn.k_proj", 1);
    kg_id v = lin(g, x, L, "self_attn.v_proj", 1);
    kg_id a = kg_attention_ex(g, q, k, v, c->num_attention_heads, (float)(1.0 / sqrt((double)dh)), -1, 1);
    h = kg_add(g, h, lin(g, a, L, "self_attn.out_proj", 1));

    /* CLIPMLP: fc2(act(fc1(x))) */
    x = lin(g, norm(g, h, L, "layer_norm2", eps), L, "mlp.fc1", 1);
    x = c->hidden_act == CLIP_ACT_GELU ? kg_gelu(g, x) : kg_quick_gelu(g, x);
    return kg_add(g, h, lin(g, x, L, "mlp.fc2", 1));
}

int clip_outputs(const clip_config *c, ka_io *out, char (*names)[48]) {
    int n = 0;
    out[n++] = (ka_io){"last_hidden_state", 3};
    out[n++] = (ka_io){"hidden_states_penultimate", 3};
    out[n++] = (ka_io){"pooler_output", 2};
    if (c->with_projection) out[n++] = (ka_io){"text_embeds", 2};
    for (int i = 0; i <= c->num_hidden_layers; i++, n++) {
        snprintf(names[n], sizeof names[0], "hidden_states_%d", i);
        out[n] = (ka_io){names[n], 3};
    }
    return n;
}

kiln_status clip_build_forward(const clip_config *c, kg_graph *g, int64_t B, int64_t T) {
    if (B <= 0 || T <= 0 || T > c->max_position_embeddings)
        return kb_fail(KILN_ERR_SHAPE, "CLIP: batch %lld and tokens %lld: the batch must be positive and the tokens 1 to "
                       "%d (max_position_embeddings)", (long long)B, (long long)T, c->max_position_embeddings);
    if (c->num_hidden_layers > CLIP_MAX_LAYERS)
        return kb_fail(KILN_ERR_CONFIG, "CLIP: %d layers, at most %d", c->num_hidden_layers, CLIP_MAX_LAYERS);
    kg_id ids = kg_input(g, "input_ids", 2, (int64_t[]){B, T});

    /* CLIPTextEmbeddings: token_embedding(input_ids) + position_embedding(arange(T)) */
    kg_id tok = kg_gather(g, kg_weight(g, "text_model.embeddings.token_embedding.weight"), ids);
    /* the first T rows of the table [max_pos, D]: sliced also when T is all
     * of them, so that the graph keeps one structure over a range of T */
    kg_id pos = kg_slice(g, kg_weight(g, "text_model.embeddings.position_embedding.weight"), 0, 0, T);
    kg_id h = kg_add(g, tok, pos); /* [B,T,D] + [T,D] */

    /* CLIPEncoder; hidden[i] is transformers' hidden_states[i]: the
     * embeddings, then each layer's output (before final_layer_norm) */
    kg_id hidden[CLIP_MAX_LAYERS + 1];
    hidden[0] = h;
    for (int i = 0; i < c->num_hidden_layers; i++) { /* a region: compiled once per distinct layer kind */
        kg_region_begin(g, i);
        hidden[i + 1] = h = encoder_layer(c, g, h, i);
        kg_region_end(g);
    }
    kg_id last = norm(g, h, "", "text_model.final_layer_norm", (float)c->layer_norm_eps);

    /* pooled_output: eos_token_id 2 is transformers' legacy rule, the
     * position of input_ids.argmax(-1); otherwise the first eos_token_id */
    kg_id pooled = kg_select_token(g, last, ids, c->eos_token_id == 2 ? -1 : c->eos_token_id);
    kg_output(g, last, "last_hidden_state");
    /* hidden_states[-2] (SD3 takes it): a copy, since that node is also
     * hidden_states_{L-1} and a node fills one output */
    kg_output(g, kg_slice(g, hidden[c->num_hidden_layers - 1], 0, 0, B), "hidden_states_penultimate");
    kg_output(g, pooled, "pooler_output");
    /* CLIPTextModelWithProjection: text_embeds = text_projection(pooled), no bias */
    if (c->with_projection) kg_output(g, lin(g, pooled, "", "text_projection", 0), "text_embeds");
    for (int i = 0; i <= c->num_hidden_layers; i++) {
        char name[48];
        snprintf(name, sizeof name, "hidden_states_%d", i);
        kg_output(g, hidden[i], name);
    }
    return g->status;
}
