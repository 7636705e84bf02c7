/* graph.h - the op graph that the model definition builds and every executor
 * consumes (eager now; planned and compiled executors later).
 *
 * Builders append nodes and return their id. Errors are sticky (ggml style):
 * the first bad shape sets g->status and a message, every later builder that
 * sees a negative id returns -1, and the caller checks g->status once.
 * All activations are f32, row-major; ndim <= 4. */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "kernels/kernels.h"
#include "kiln.h"
#include <stdint.h>

typedef int kg_id; /* index into g->nodes; -1 = none */

typedef enum kg_op {
    KG_INPUT,          /* name, shape; iparam[0] = input slot */
    KG_WEIGHT,         /* name, shape; data bound by the resolver */
    KG_LINEAR,         /* x [..,K] . W[M,K]^T + b[M] -> [..,M]; W may be [M, a, b, ..];
                        * iparam[0] = KK_ACT_* applied after (set by kg_fuse);
                        * iparam[1] = 1: a gate_add folded in by kg_fuse, the output is
                        * res [B,N,M] + gate [B,M] * (x W^T + b), src[3] = res, src[4] = gate:
                        * columns iparam[2] .. +M of the rows of src[4] (a [B,E] tensor);
                        * src[4] = -1: an add folded in, res + (x W^T + b) with res
                        * [1,N,M] (a table made from weights) for every batch entry */
    KG_ADD,            /* a + b; b may have batch 1 (broadcast over dim 0) */
    KG_SILU,
    KG_GELU_TANH,
    KG_LAYERNORM,      /* over the last dim, no affine; fparam = eps */
    KG_RMSNORM_HEADS,  /* x [B,N,H*Dh] per head * w[Dh]; iparam[0] = H; fparam = eps */
    KG_MODULATE,       /* x [B,N,D] * (1 + scale[B,D]) + shift[B,D]; src = x, shift, scale */
    KG_GATE_ADD,       /* res [B,N,D] + gate[B,D] * y [B,N,D]; src = res, gate, y */
    KG_SLICE_COLS,     /* x [B,E] -> [B,len]; iparam = off, len */
    KG_CONCAT_TOKENS,  /* [B,N1,D] ++ [B,N2,D] -> [B,N1+N2,D] */
    KG_SLICE_TOKENS,   /* [B,N,D] -> [B,len,D]; iparam = off, len */
    KG_ATTENTION,      /* q [B,Nq,H*Dh], k,v [B,Nk,H*Dh] -> [B,Nq,H*Dh]; iparam[0] = H;
                        * iparam[1] = 1: joint (set by kg_fuse): the concat_tokens making q, k, v
                        * folded in, src = q, k, v of the first segment, then of the second;
                        * src[3] = -1 when only the first segment's tokens are queries */
    KG_PATCHIFY,       /* [B,C,H,W] -> [B,(H/p)(W/p),C*p*p]; iparam[0] = p */
    KG_UNPATCHIFY,     /* [B,h*w,p*p*C] -> [B,C,h*p,w*p]; iparam = p, h, w, C */
    KG_TIMESTEP_PROJ,  /* t [B] -> [B,dim] (cos | sin); iparam[0] = dim */
    KG_POS_CROP,       /* table [1,M*M,D] -> [1,h*w,D] centre crop; iparam = M, h, w */
    /* made by kg_fuse, never by the model: */
    KG_LN_MODULATE,    /* layernorm(x) * (1 + scale) + shift; src = x, shift, scale; fparam = eps */
    KG_ALIAS,          /* an op folded into its producer src0; kg_fuse rewires its consumers,
                        * so executors never run it */
    /* parallel runs (graph_dist.c); group = a kd_group of src/dist/dist.h: */
    KG_SHARD,          /* this rank's part of x along dim 1 or 2; iparam = dim, parts, index */
    KG_ALLGATHER,      /* inverse of shard: concat every member's x along dim; iparam = dim, group, parts */
    KG_ALLTOALL,       /* Ulysses: iparam[0] = to_heads: 1 [B,n,D] -> [B,n*p,D/p] (every token,
                        * this rank's heads), 0 the inverse; iparam = to_heads, group, parts */
    KG_ALLREDUCE,      /* sum over the group (after a row-parallel linear); iparam[1] = group */
    KG_FSDP_GATHER,    /* x passed through, after gathering the weights of block iparam[0] */
    KG_OP_COUNT
} kg_op;

const char *kg_op_name(kg_op op);

#define KG_MAX_SRC 6 /* sources of a node: 3; 5 for a linear with a gate_add folded in, 6 for a joint attention */

typedef struct kg_node {
    kg_op op;
    int ndim;
    int64_t shape[4];
    kg_id src[KG_MAX_SRC];
    int64_t iparam[4];
    float fparam;
    const char *name;     /* INPUT/WEIGHT: owned by the graph */
    const float *data;    /* WEIGHT: bound f32 data (not owned; NULL if only packed) */
    const kk_weight *kw;  /* WEIGHT: the weight as linear kernels consume it */
    int out_bf16;         /* set by kg_plan_bf16: the output's format, KK_FMT_* (f32; bf16 rows or blocked) */
} kg_node;

/* Resolves a weight name to its shape, f32 data (NULL when the weight only
 * exists packed) and kernel view; returns 0 if unknown. */
typedef int (*kg_resolver)(void *user, const char *name, int *ndim, int64_t shape[4],
                           const float **data, const kk_weight **kw);

/* A run of nodes [start, end) that one repeated piece of the model built
 * (a transformer block): the compiler emits each distinct kind once. */
typedef struct kg_region {
    int start, end;
    int layer;
} kg_region;

/* What the collective ops of a parallel run need (graph_dist.c). */
struct kd_mesh;
typedef struct kg_dist {
    const struct kd_mesh *mesh;
    void (*fsdp_gather)(void *user, int block); /* fills the weights of a block */
    void *user;
} kg_dist;

typedef struct kg_graph {
    kg_node *nodes;
    int n, cap;
    kg_region *regions;
    int n_regions;
    kg_id outputs[4];
    int n_outputs;
    int n_inputs;
    kiln_status status; /* sticky first error */
    kg_resolver resolve;
    void *resolve_user;
    const kg_dist *dist; /* parallel runs only; NULL otherwise */
} kg_graph;

void kg_init(kg_graph *g, kg_resolver resolve, void *user);
void kg_free(kg_graph *g);
int64_t kg_numel(const kg_node *n);

kg_id kg_input(kg_graph *g, const char *name, int ndim, const int64_t *shape);
kg_id kg_weight(kg_graph *g, const char *name);
kg_id kg_linear(kg_graph *g, kg_id x, kg_id w, kg_id b /* -1: no bias */);
kg_id kg_add(kg_graph *g, kg_id a, kg_id b);
kg_id kg_silu(kg_graph *g, kg_id x);
kg_id kg_gelu_tanh(kg_graph *g, kg_id x);
kg_id kg_layernorm(kg_graph *g, kg_id x, float eps);
kg_id kg_rmsnorm_heads(kg_graph *g, kg_id x, kg_id w, int heads, float eps);
kg_id kg_modulate(kg_graph *g, kg_id x, kg_id shift, kg_id scale);
kg_id kg_gate_add(kg_graph *g, kg_id res, kg_id gate, kg_id y);
kg_id kg_slice_cols(kg_graph *g, kg_id x, int64_t off, int64_t len);
kg_id kg_concat_tokens(kg_graph *g, kg_id a, kg_id b);
kg_id kg_slice_tokens(kg_graph *g, kg_id x, int64_t off, int64_t len);
kg_id kg_attention(kg_graph *g, kg_id q, kg_id k, kg_id v, int heads);
kg_id kg_patchify(kg_graph *g, kg_id x, int p);
kg_id kg_unpatchify(kg_graph *g, kg_id x, int p, int64_t h, int64_t w, int64_t c);
kg_id kg_timestep_proj(kg_graph *g, kg_id t, int dim);
kg_id kg_pos_crop(kg_graph *g, kg_id table, int64_t max, int64_t h, int64_t w);
void kg_mark_output(kg_graph *g, kg_id x);
/* Mark the nodes built between begin and end as one region (layer i). */
void kg_region_begin(kg_graph *g, int layer);
void kg_region_end(kg_graph *g);

/* parallel runs (graph_dist.c); parts = the group's size */
kg_id kg_shard(kg_graph *g, kg_id x, int dim, int parts, int index);
kg_id kg_allgather(kg_graph *g, kg_id x, int dim, int group, int parts);
kg_id kg_alltoall(kg_graph *g, kg_id x, int to_heads, int group, int parts);
kg_id kg_allreduce(kg_graph *g, kg_id x, int group);
kg_id kg_fsdp_gather(kg_graph *g, kg_id x, int block);
/* run one of the ops above (the executors call it) */
void kg_run_dist(const kg_graph *g, const kg_node *n, const float *x, float *y);
/* the same with explicit operands: op (KG_*), its iparam, the [B,N,D] shapes
 * of x and y (compiled packages call this through their runtime table) */
void kg_run_dist_op(const kg_dist *d, int op, const int64_t *ip, const int64_t *xs, const int64_t *ys, const float *x,
                    float *y);
/* append a node (shape checked by the caller; graph_dist.c's builders use it) */
kg_id kg_push(kg_graph *g, kg_op op, int ndim, const int64_t *shape, kg_id a, kg_id b, kg_id c);

/* Fusion for a backend: linear + tanh-GELU into one linear with an epilogue,
 * layernorm + modulate into one op. The graph computes the same function. */
void kg_fuse(kg_graph *g);
/* For a backend with bf16 activation I/O: keep in bf16 the outputs of
 * linear, layernorm_modulate and modulate nodes that only linears with bf16
 * packed weights consume, so those GEMMs need no conversion pass; blocked
 * (KK_FMT_BLOCKED) where the backend's GEMMs read it as it is (blocked_io),
 * so they need no packing pass either. The q, k and v an attention alone
 * reads go in bf16 rows where the backend's attention takes them so
 * (attention_joint_bf16). */
void kg_plan_bf16(kg_graph *g, const kk_backend *be);
/* The bytes of a node's output in its format (out_bf16). */
size_t kg_out_bytes(const kg_node *n);

/* ---- executors ---------------------------------------------------------- */
/* Run every node in order with the backend's kernels. inputs[slot] point to
 * the input tensors; outputs[i] receive the marked outputs (caller-allocated,
 * kg_numel floats each). Intermediates are freed after their last use. */
/* Which nodes the outputs need (live[i]), and the last live node reading
 * each one (last_use[i]; i itself when none). Arrays of g->n. */
void kg_liveness(const kg_graph *g, char *live, int *last_use);
/* Run one node: buf[j] holds node j's data (f32, or bf16 where out_bf16;
 * a weight node's buf is its f32 data), y receives node n's output. */
void kg_exec_node(const kg_graph *g, const kk_backend *be, const kg_node *n, float *const *buf, float *y);
kiln_status kg_run_eager(const kg_graph *g, const kk_backend *be, const float *const *inputs,
                         float *const *outputs);

#endif
