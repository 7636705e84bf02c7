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

/* The ops: one table, ops.def (each op's meaning, its parameters and the
 * function every executor runs it with). */
typedef enum kg_op {
#define KG_OP(id, name, gemm_src, slot, run) KG_##id,
#include "graph/ops.def"
#undef KG_OP
    KG_OP_COUNT
} kg_op;

const char *kg_op_name(kg_op op);

#define KG_MAX_SRC 7 /* sources of a node: 3; 5 for a linear with a gate_add folded in, 6 for a joint attention,
                      * 7 with a rotary table */
#define KG_ATTN_ROPE 6 /* an attention's rotary table (kg_fuse folds the rope of its q and k in; -1: none) */

/* One op call, as every executor makes it (eager and planned from a node's
 * concrete shapes, compiled packages from the shapes' expressions): the
 * data of each source (a kk_weight for the source an op reads as a GEMM
 * weight, ops.def's gemm_src; NULL when absent), the output, the shapes and
 * formats (KK_FMT_*) of the sources and of the output (index KG_Y), the
 * integer and float parameters. Declared by an X-macro so that generated C
 * declares exactly the same struct (codegen.c). */
#define KG_Y KG_MAX_SRC
#define KG_CALL_FIELDS(X)                                                          \
    X(int, op, )                                                                   \
    X(const void *, src, [KG_MAX_SRC])                                             \
    X(void *, y, )                                                                 \
    X(int64_t, sh, [KG_MAX_SRC + 1][4])                                            \
    X(int, nd, [KG_MAX_SRC + 1])                                                   \
    X(int, fmt, [KG_MAX_SRC + 1])                                                  \
    X(int64_t, ip, [4])                                                            \
    X(float, fp, )
#define KG_CALL_FIELD(type, name, dims) type name dims;
typedef struct kg_call {
    KG_CALL_FIELDS(KG_CALL_FIELD)
} kg_call;

/* What an op runs with besides its call: the backend's kernels and, in a
 * parallel run, the collectives' context. */
struct kg_dist;
typedef struct kg_ctx {
    const kk_backend *be;
    const struct kg_dist *dist;
} kg_ctx;
typedef void (*kg_run_fn)(const kg_ctx *x, const kg_call *c);

/* A row of ops.def */
typedef struct kg_op_info {
    const char *name;
    int gemm_src;
    int slot; /* the backend slot it runs on (KK_SLOT_*; HOST: on host memory itself) */
    kg_run_fn run;
} kg_op_info;
extern const kg_op_info kg_ops[KG_OP_COUNT];
/* The function that runs op on backend be: its runner where be runs its
 * slot in f32 (kk_supports; a host op where be's memory is the host's),
 * else one that runs it on the host backend (kk_host) on copies of its
 * sources, copying the output back: ggml's scheduler's split, one op at a
 * time. NULL for nodes executors never run. */
kg_run_fn kg_runner(const kk_backend *be, kg_op op);
/* "input,weight,linear,...": the table's names in order (the packages' ABI) */
const char *kg_op_table_names(void);

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
    int varies;           /* WEIGHT: its data changes during a forward (an FSDP block's, gathered) */
    int out_bf16;         /* set by kg_plan_bf16: the output's format, KK_FMT_* (f32; bf16 rows or blocked) */
} kg_node;

/* The nodes executors bind instead of running (ops.def's INPUT and
 * WEIGHT): an input takes the forward's buffer of its slot, a weight the
 * model's data. Executors ask these, never an op number. */
static inline int kg_is_input(const kg_node *n) { return n->op == KG_INPUT; }
static inline int kg_is_weight(const kg_node *n) { return n->op == KG_WEIGHT; }

/* Resolves a weight name to its shape, f32 data (NULL when the weight only
 * exists packed) and kernel view; returns 0 if unknown, 2 for a weight
 * whose data changes during a forward (an FSDP block's: kg_node.varies),
 * else 1. */
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
struct kg_dist {
    const struct kd_mesh *mesh;
    void (*fsdp_gather)(void *user, int block); /* fills the weights of a block */
    void *user;
};
typedef struct kg_dist kg_dist;

/* a graph's outputs: a text encoder gives every layer's hidden state */
#define KG_MAX_OUTPUTS 80

typedef struct kg_graph {
    kg_node *nodes;
    int n, cap;
    kg_region *regions;
    int n_regions;
    kg_id outputs[KG_MAX_OUTPUTS];
    char output_names[KG_MAX_OUTPUTS][48]; /* "sample"; "out<i>" when not named */
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
/* the linear layer of a checkpoint's name: weights name.weight and name.bias */
kg_id kg_linear_named(kg_graph *g, kg_id x, const char *name);
/* a + b and a * b, b broadcast to a's shape (numpy rules, right-aligned) */
kg_id kg_add(kg_graph *g, kg_id a, kg_id b);
kg_id kg_mul(kg_graph *g, kg_id a, kg_id b);
kg_id kg_silu(kg_graph *g, kg_id x);
kg_id kg_gelu_tanh(kg_graph *g, kg_id x);
kg_id kg_gelu(kg_graph *g, kg_id x);       /* exact (erf) */
kg_id kg_quick_gelu(kg_graph *g, kg_id x); /* x * sigmoid(1.702 x) */
/* table [V, D] rows by ids [...] (integers as f32) -> [..., D] */
kg_id kg_gather(kg_graph *g, kg_id table, kg_id ids);
kg_id kg_layernorm(kg_graph *g, kg_id x, float eps);
/* layernorm with an affine weight w [D] and bias b [D], each optional (-1) */
kg_id kg_layernorm_affine(kg_graph *g, kg_id x, kg_id w, kg_id b, float eps);
/* RMS norm over the last dim, * w [D] when w >= 0 */
kg_id kg_rmsnorm(kg_graph *g, kg_id x, kg_id w, float eps);
kg_id kg_rmsnorm_heads(kg_graph *g, kg_id x, kg_id w, int heads, float eps);
kg_id kg_modulate(kg_graph *g, kg_id x, kg_id shift, kg_id scale);
kg_id kg_gate_add(kg_graph *g, kg_id res, kg_id gate, kg_id y);
kg_id kg_slice_cols(kg_graph *g, kg_id x, int64_t off, int64_t len);
kg_id kg_concat_tokens(kg_graph *g, kg_id a, kg_id b);
kg_id kg_slice_tokens(kg_graph *g, kg_id x, int64_t off, int64_t len);
kg_id kg_attention(kg_graph *g, kg_id q, kg_id k, kg_id v, int heads);
/* the general form: scale of q k^T (0: 1/sqrt(Dh)), an additive bias
 * [B or 1, heads or 1, Nq, Nk] (-1: none), causal (query i sees keys <= i) */
kg_id kg_attention_ex(kg_graph *g, kg_id q, kg_id k, kg_id v, int heads, float scale, kg_id bias, int causal);
/* slice and concat along any axis */
kg_id kg_slice(kg_graph *g, kg_id x, int axis, int64_t off, int64_t len);
kg_id kg_concat(kg_graph *g, kg_id a, kg_id b, int axis);
/* "[2, 77, 768]" */
void kg_shape_str(const kg_node *n, char *buf, size_t cap);
kg_id kg_patchify(kg_graph *g, kg_id x, int p);
kg_id kg_unpatchify(kg_graph *g, kg_id x, int p, int64_t h, int64_t w, int64_t c);
/* the inverse of kg_patchify (a token's features in the order c, py, px):
 * Flux's _unpack_latents */
kg_id kg_unpatchify_cfirst(kg_graph *g, kg_id x, int p, int64_t h, int64_t w, int64_t c);
kg_id kg_timestep_proj(kg_graph *g, kg_id t, int dim);
/* of t * scale (Flux: 1000, its timestep and guidance come in [0, 1] and as is) */
kg_id kg_timestep_proj_scaled(kg_graph *g, kg_id t, int dim, float scale);
kg_id kg_pos_crop(kg_graph *g, kg_id table, int64_t max, int64_t h, int64_t w);
/* Flux's rotary table for T text then h x w image tokens over axes (their
 * channel counts, even), theta: [T + h*w, sum of axes] (ops.def ROPE_TABLE) */
kg_id kg_rope_table(kg_graph *g, int64_t T, int64_t h, int64_t w, const int axes[3], float theta);
/* x [B,N,heads*Dh] rotated by table [N,Dh] */
kg_id kg_rope(kg_graph *g, kg_id x, kg_id table, int heads);
void kg_mark_output(kg_graph *g, kg_id x); /* named "out<i>" */
/* x is the graph's next output, under a name (under 48 characters) */
void kg_output(kg_graph *g, kg_id x, const char *name);
/* Mark the nodes built between begin and end as one region (layer i). */
void kg_region_begin(kg_graph *g, int layer);
void kg_region_end(kg_graph *g);

/* parallel runs (graph_dist.c); parts = the group's size */
kg_id kg_shard(kg_graph *g, kg_id x, int dim, int parts, int index);
kg_id kg_allgather(kg_graph *g, kg_id x, int dim, int group, int parts);
kg_id kg_alltoall(kg_graph *g, kg_id x, int to_heads, int group, int parts);
kg_id kg_allreduce(kg_graph *g, kg_id x, int group);
kg_id kg_fsdp_gather(kg_graph *g, kg_id x, int block);
/* run one of the ops above: op (KG_*), its iparam, the [B,N,D] shapes of x
 * and y (ops.c's kg_run_dist_node calls it for every executor) */
void kg_run_dist_op(const kg_dist *d, int op, const int64_t *ip, const int64_t *xs, const int64_t *ys, const float *x,
                    float *y);
/* append a node (shape checked by the caller; graph_dist.c's builders use it) */
kg_id kg_push(kg_graph *g, kg_op op, int ndim, const int64_t *shape, kg_id a, kg_id b, kg_id c);

/* Fusion for a backend: linear + tanh-GELU into one linear with an epilogue,
 * layernorm + modulate into one op. The graph computes the same function. */
void kg_fuse(kg_graph *g);
/* The formats between ops, as the backend wants them (it is asked, op by
 * op and weight by weight: kk_supports; a backend that answers f32 only
 * gets nothing planned): keep in bf16 the outputs of linear,
 * layernorm_modulate and modulate nodes that only linears whose GEMM reads
 * bf16 on their weight consume, so those GEMMs need no conversion pass;
 * blocked (KK_FMT_BLOCKED) where the GEMMs read that layout as it is, so
 * they need no packing pass either. The q, k and v an attention alone reads
 * go in bf16 rows where the backend's attention takes them so. */
void kg_plan_bf16(kg_graph *g, const kk_backend *be);
/* The bytes of a node's output in its format (out_bf16). */
size_t kg_out_bytes(const kg_node *n);

/* The call node n makes: buf[j] holds node j's data (a weight node's buf
 * is its f32 data; the source ops.def names gemm_src gets the node's
 * kk_weight instead), y its output. */
void kg_call_of(const kg_graph *g, const kg_node *n, float *const *buf, void *y, kg_call *c);

/* ---- executors ---------------------------------------------------------- */
/* Run every node in order with the backend's kernels. inputs[slot] point to
 * the input tensors; outputs[i] receive the marked outputs (caller-allocated,
 * kg_numel floats each). Intermediates are freed after their last use. */
/* Which nodes the outputs need (live[i]), and the last live node reading
 * each one (last_use[i]; i itself when none). Arrays of g->n. */
void kg_liveness(const kg_graph *g, char *live, int *last_use);
/* The shape constants: konst[i] = 1 for a live node that runs (an op with a
 * runner, not a collective) and reads no input, only weights whose data
 * does not change during a forward (kg_node.varies) and other such nodes,
 * and is no output: a function of the weights and the shape alone (SD3's
 * cropped position table, T5's position bias, Flux's RoPE tables next).
 * The planned executor and packages compute them once per shape and keep
 * them on the backend between forwards (kx_consts); eager runs them as it
 * runs the rest. live from kg_liveness; arrays of g->n. */
void kg_shape_consts(const kg_graph *g, const char *live, char *konst);
/* Run one node: buf[j] holds node j's data (f32, or bf16 where out_bf16;
 * a weight node's buf is its f32 data), y receives node n's output. */
void kg_exec_node(const kg_graph *g, const kk_backend *be, const kg_node *n, float *const *buf, float *y);
kiln_status kg_run_eager(const kg_graph *g, const kk_backend *be, const float *const *inputs,
                         float *const *outputs);

/* ---- the VAE's ops ------------------------------------------------------ */
/* The layout of an image-shaped activation: channels first [B,C,H,W] or
 * channels last [B,H,W,C] (the convolutions' own, the VAE's) */
enum { KG_NCHW = 0, KG_NHWC = 1 };
/* x [B,Cin,H,W] * w [Cout,Cin,kh,kw] + b [Cout] (-1: none) -> [B,Cout,Ho,Wo]
 * with Ho = (H + pad_lo + pad_hi - kh) / stride + 1: pad_lo rows / columns
 * of zeros before (top, left), pad_hi after (bottom, right); layout KG_NHWC:
 * x [B,H,W,Cin] -> [B,Ho,Wo,Cout] (w the same) */
kg_id kg_conv2d(kg_graph *g, kg_id x, kg_id w, kg_id b, int stride, int pad_lo, int pad_hi, int layout);
/* x [B,H,W,Cin] (channels last) nearest-upsampled 2x, then a 3x3 conv padded
 * 1, in one: w is the 3x3 weight's sub-pixel form [4 Cout, Cin, 2, 2]
 * (kk_conv_up2_weight; ka_spec.up2 stores it so) -> [B,2H,2W,Cout] */
kg_id kg_conv2d_up2(kg_graph *g, kg_id x, kg_id w, kg_id b);
/* group norm of x [B,C,...] (KG_NHWC: [B,...,C]) over groups of C/groups
 * channels, * w [C] + b [C] (each optional, -1), SiLU after when silu is set */
kg_id kg_group_norm(kg_graph *g, kg_id x, kg_id w, kg_id b, int groups, float eps, int silu, int layout);
/* x [B,C,H,W] -> [B,C,f*H,f*W] (KG_NHWC: [B,H,W,C] -> [B,f*H,f*W,C]), nearest */
kg_id kg_upsample_nearest(kg_graph *g, kg_id x, int f, int layout);
/* exp(0.5 * clamp(x, -30, 20)) elementwise (a log-variance's std) */
kg_id kg_logvar_std(kg_graph *g, kg_id x);
/* x [B,T,D] at one token per batch entry chosen by ids [B,T] -> [B,D]:
 * eos < 0 the first largest id, else the first id equal to eos (ops.def) */
kg_id kg_select_token(kg_graph *g, kg_id x, kg_id ids, int64_t eos);

/* T5: the relative position bias [1, H, nq, nk] from table [num_buckets, H]
 * (ops.def REL_POS_BIAS; transformers' T5Attention.compute_bias) */
kg_id kg_rel_pos_bias(kg_graph *g, kg_id table, int64_t nq, int64_t nk, int64_t max_distance, int bidirectional);
kg_id kg_relu(kg_graph *g, kg_id x);
/* x under another shape [ndim] of the same count, the values in their order (a copy) */
kg_id kg_reshape(kg_graph *g, kg_id x, int ndim, const int64_t *shape);

#endif
