/* t5_forward.c - the T5 encoder's forward, written once as graph building.
 * It follows transformers' T5EncoderModel.forward (T5Stack without a
 * decoder, no attention mask: the SD3 and Flux pipelines attend over the
 * padding too); names in the comments are transformers' names. */
#include "arch/t5/t5.h"
#include "base/base.h"

#include <stdio.h>

static kg_id weight(kg_graph *g, const char *fmt, int i) {
    char name[128];
    snprintf(name, sizeof name, fmt, i);
    return kg_weight(g, name);
}

/* nn.Linear(bias=False) of block i by name: x [B,T,K] -> [B,T,M] */
static kg_id lin(kg_graph *g, kg_id x, const char *fmt, int i) { return kg_linear(g, x, weight(g, fmt, i), -1); }

static kg_id act(kg_graph *g, kg_id x, int a) {
    return a == T5_ACT_RELU ? kg_relu(g, x) : a == T5_ACT_GELU ? kg_gelu(g, x) : kg_gelu_tanh(g, x);
}

/* T5Block(i): hidden [B,T,D] + SelfAttention(layer_norm(hidden)), then
 * + DenseReluDense(layer_norm(hidden)); bias [1,H,T,T] the position bias */
static kg_id block(const t5_config *c, kg_graph *g, int i, kg_id x, kg_id bias) {
    float eps = (float)c->eps;
    /* T5LayerSelfAttention: T5LayerNorm (RMS, weight, no mean or bias) */
    kg_id h = kg_rmsnorm(g, x, weight(g, "encoder.block.%d.layer.0.layer_norm.weight", i), eps);
    kg_id q = lin(g, h, "encoder.block.%d.layer.0.SelfAttention.q.weight", i);
    kg_id k = lin(g, h, "encoder.block.%d.layer.0.SelfAttention.k.weight", i);
    kg_id v = lin(g, h, "encoder.block.%d.layer.0.SelfAttention.v.weight", i);
    /* scores = q k^T + position_bias, no 1/sqrt(d_kv) (T5 folds it into
     * its initialisation); softmax in f32 */
    kg_id a = kg_attention_ex(g, q, k, v, c->num_heads, 1.0f, bias, 0);
    x = kg_add(g, x, lin(g, a, "encoder.block.%d.layer.0.SelfAttention.o.weight", i));

    /* T5LayerFF: T5DenseGatedActDense wo(act(wi_0 h) * wi_1 h), or
     * T5DenseActDense wo(act(wi h)) */
    h = kg_rmsnorm(g, x, weight(g, "encoder.block.%d.layer.1.layer_norm.weight", i), eps);
    kg_id f = c->gated ? kg_mul(g, act(g, lin(g, h, "encoder.block.%d.layer.1.DenseReluDense.wi_0.weight", i), c->act),
                                lin(g, h, "encoder.block.%d.layer.1.DenseReluDense.wi_1.weight", i))
                       : act(g, lin(g, h, "encoder.block.%d.layer.1.DenseReluDense.wi.weight", i), c->act);
    return kg_add(g, x, lin(g, f, "encoder.block.%d.layer.1.DenseReluDense.wo.weight", i));
}

kiln_status t5_build_forward(const t5_config *c, kg_graph *g, int64_t B, int64_t T, const ka_par *par) {
    if (par && (par->tp > 1 || par->sp > 1))
        return kb_fail(KILN_ERR_UNSUPPORTED, "the T5 encoder runs without tensor or sequence parallel (tp %d, sp %d)",
                       par->tp, par->sp);
    if (B < 1 || B > T5_MAX_BATCH || T < 1 || T > T5_MAX_TOKENS)
        return kb_fail(KILN_ERR_SHAPE, "t5: batch %lld and tokens %lld must be in 1..%d and 1..%d", (long long)B,
                       (long long)T, T5_MAX_BATCH, T5_MAX_TOKENS);
    kg_id ids = kg_input(g, "input_ids", 2, (int64_t[]){B, T});
    /* embed_tokens (tied to shared): [B,T] -> [B,T,D]; an id outside the
     * vocabulary fails the forward, naming it and its position */
    kg_id x = kg_gather(g, kg_weight(g, "shared.weight"), ids);
    /* T5Attention.compute_bias of block 0 (has_relative_attention_bias),
     * passed on to every block: [1,H,T,T], bidirectional buckets */
    kg_id bias = kg_rel_pos_bias(g, kg_weight(g, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
                                 T, T, c->max_distance, 1);
    for (int i = 0; i < c->num_layers; i++) { /* a region: compiled once per distinct block kind */
        kg_region_begin(g, i);
        if (par && par->fsdp) x = kg_fsdp_gather(g, x, i);
        x = block(c, g, i, x, bias);
        kg_region_end(g);
    }
    x = kg_rmsnorm(g, x, kg_weight(g, "encoder.final_layer_norm.weight"), (float)c->eps);
    kg_output(g, x, "last_hidden_state");
    return g->status;
}
