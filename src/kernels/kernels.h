/* kernels.h - the backend interface: every executor calls kernels through a
 * kk_backend, so a fast backend replaces the reference one op by op while the
 * reference kernels stay as the oracle in tests.
 * Activations are f32, row-major; shapes are given in comments. */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

/* A linear layer's weight as the kernels consume it: y = x W^T with W
 * [M outputs, K inputs]. f32 is row-major [M,K] (NULL when only packed);
 * packed is the fast GEMM's own layout (NULL when none), by packed_dtype:
 *   F32        oneDNN's packed matmul weights
 *   BF16       kiln's AMX GEMM layout "amx32" where the CPU has AMX
 *              (gemm_amx.h), its fp16 GEMM's "f16p64" where the CPU has
 *              AVX512-FP16 but no AMX (gemm_f16.h), else oneDNN's packed
 *              bf16 weights
 *   I8         quantized: the AMX GEMM's s8 layout "s8-amx32", else oneDNN's
 *              packed s8 weights of an s8 x s8 matmul
 *   F8_E4M3    quantized: this machine's BF16 packed layout with every
 *              element stored as e4m3 (decoded to bf16 per call)
 * Quantized blobs end with the per-output-channel scales [M] f32 (the last
 * 4*M bytes of kk_fast_layout's size): W[m,k] = q[m,k] * scales[m]. */
typedef struct kk_weight {
    int64_t M, K;
    const float *f32;
    const void *packed;
    kiln_dtype packed_dtype;
    const float *scales; /* I8, F8_E4M3: [M], inside the packed blob; else NULL */
} kk_weight;

/* Quantized weight types (I8, F8_E4M3). */
static inline int kk_dtype_is_quant(kiln_dtype t) { return t == KILN_I8 || t == KILN_F8_E4M3; }
/* 1 when the fast linear on w reads and writes bf16 activations directly
 * (linear_io): BF16 packed weights and the quantized ones. */
static inline int kk_weight_bf16_io(const kk_weight *w) {
    return w && w->packed && (w->packed_dtype == KILN_BF16 || kk_dtype_is_quant(w->packed_dtype));
}

enum { KK_ACT_NONE = 0, KK_ACT_GELU_TANH = 1 };

/* How an activation [rows, K] is stored (linear_io's x_fmt / y_fmt, the
 * bf16 producers' y_fmt, a graph node's out_bf16):
 *   KK_FMT_F32      f32, row-major
 *   KK_FMT_BF16     bf16, row-major
 *   KK_FMT_BLOCKED  bf16 in the AMX GEMM's operand layout, so that GEMM
 *                   reads it with no packing pass: blocks of 32 rows, each
 *                   [K/32 steps][2 tiles of 16 rows][16 rows][32 inputs];
 *                   rows and K zero-padded to multiples of 32 */
enum { KK_FMT_F32 = 0, KK_FMT_BF16 = 1, KK_FMT_BLOCKED = 2 };
/* elements of a blocked [rows, K] (padding included), and where (r, k) lies */
static inline size_t kk_blocked_elems(int64_t rows, int64_t K) {
    return (size_t)((rows + 31) / 32 * 32) * (size_t)((K + 31) / 32 * 32);
}
static inline size_t kk_blocked_index(int64_t r, int64_t k, int64_t K) {
    return (size_t)(((r / 32) * ((K + 31) / 32) + k / 32) * 1024 + (r % 32) / 16 * 512 + (r % 16) * 32 + k % 32);
}
/* The bytes of an activation [rows, K] in format fmt (KK_FMT_*) held as up
 * to `segments` token segments apart (each blocked one padded on its own):
 * what executors allocate for it. */
static inline size_t kk_act_bytes(int fmt, int64_t rows, int64_t K, int segments) {
    if (fmt == KK_FMT_BLOCKED) return sizeof(uint16_t) * kk_blocked_elems(rows + 32 * (segments > 1 ? segments - 1 : 0), K);
    return (fmt ? sizeof(uint16_t) : sizeof(float)) * (size_t)(rows * K);
}
/* bf16 x [rows,K] row-major -> out blocked (padding zeroed), and back */
void kk_block_rows(const uint16_t *x, int64_t rows, int64_t K, uint16_t *out);
void kk_unblock_rows(const uint16_t *in, int64_t rows, int64_t K, uint16_t *x);
/* Two token segments (the image and the context tokens) kept apart: token
 * i of batch entry b is row b*Na + i of the first segment when i < Na, else
 * row b*Nb + i - Na of the second. Returns the segment (0, 1), its row in *row */
static inline int kk_segment_row(int64_t b, int64_t i, int64_t Na, int64_t Nb, int64_t *row) {
    *row = i < Na ? b * Na + i : b * Nb + i - Na;
    return i >= Na;
}
/* f32 x [B, Na+Nb, K] -> out blocked by token segment (rounded to nearest
 * even, padding zeroed): each segment's rows (kk_segment_row) a blocked
 * [B*n, K], the first at out, the second from kk_blocked_elems(B*Na, K) on -
 * how a joint attention hands its two segments to the GEMMs after
 * (attention_joint_bf16) */
void kk_block_segments(const float *x, int64_t B, int64_t Na, int64_t Nb, int64_t K, uint16_t *out);

/* A 2-D convolution's geometry (the conv2d slot, kg_conv2d): x [B,Cin,H,W],
 * w [Cout,Cin,kh,kw], y [B,Cout,Ho,Wo]; pad_lo rows / columns of zeros
 * before (top, left), pad_hi after (bottom, right):
 * Ho = (H + pad_lo + pad_hi - kh) / stride + 1, Wo alike. nhwc: x is
 * [B,H,W,Cin] and y [B,Ho,Wo,Cout] instead (channels last; w unchanged).
 * up2 (with nhwc): x nearest-upsampled 2x, then a 3x3 conv padded 1, folded
 * into one: w is the sub-pixel form [4 Cout, Cin, 2, 2] of the 3x3 weight
 * (kk_conv_up2_weight), kh = kw = 2, Ho = 2 H, Wo = 2 W, stride and pads 1.
 * x_bf16 (with nhwc, not up2; where supports(CONV2D, BF16, w)): x is bf16 rows.
 * residual: a tensor of y's shape and layout is added to y (the slot's
 * res; kg_fuse folds a resnet's add into its conv). y_bf16 (with nhwc, no
 * residual; where supports(CONV2D, BF16, w)): y is written as bf16 rows, the f32
 * sums (+ b) rounded to nearest even. */
typedef struct kk_conv {
    int64_t B, Cin, H, W, Cout, kh, kw, Ho, Wo;
    int64_t stride, pad_lo, pad_hi;
    int64_t nhwc, up2, x_bf16, residual, y_bf16;
} kk_conv;

/* The backend's slots by kind, for kk_backend.supports and ops.def (each op
 * names the slot it runs on): an op's main slot; KK_SLOT_HOST for the ops
 * that run on host memory themselves (the collectives). */
typedef enum kk_slot {
    KK_SLOT_HOST,
    KK_SLOT_LINEAR, /* linear, linear_io, linear_gate_add */
    KK_SLOT_SILU,
    KK_SLOT_GELU_TANH,
    KK_SLOT_LAYERNORM,
    KK_SLOT_LAYERNORM_MODULATE,
    KK_SLOT_RMSNORM_HEADS,
    KK_SLOT_MODULATE,
    KK_SLOT_GATE_ADD,
    KK_SLOT_ATTENTION, /* attention, attention_joint, attention_joint_bf16, attention_ex */
    KK_SLOT_CONV2D,
    KK_SLOT_GROUP_NORM,
    KK_SLOT_UNARY,
    KK_SLOT_BINARY,
    KK_SLOT_GATHER_ROWS,
    KK_SLOT_AFFINE_ROWS,
    KK_SLOT_RMSNORM_ROWS,
    KK_SLOT_SLICE_ROWS,
    KK_SLOT_CONCAT_ROWS,
    KK_SLOT_PATCHIFY,
    KK_SLOT_UNPATCHIFY,
    KK_SLOT_TIMESTEP_PROJ,
    KK_SLOT_POS_CROP,
    KK_SLOT_ROPE, /* rope_table, rope */
    KK_SLOT_UPSAMPLE,
    KK_SLOT_LOGVAR_STD,
    KK_SLOT_SELECT_TOKEN,
    KK_SLOT_REL_POS_BIAS,
    KK_SLOT_COPY,
    KK_SLOT_COUNT
} kk_slot;

typedef struct kk_backend {
    const char *name;
    /* y [rows,M] = act(x [rows,K] . W^T + b [M]) (b may be NULL) */
    void (*linear)(const float *x, const kk_weight *w, const float *b, float *y, int64_t rows, int act);
    void (*silu)(const float *x, float *y, int64_t n);
    void (*gelu_tanh)(const float *x, float *y, int64_t n);
    /* y [rows,D] = (x - mean) / sqrt(var + eps), per row */
    void (*layernorm)(const float *x, float *y, int64_t rows, int64_t D, float eps);
    /* y [B,N,D] = layernorm(x) * (1 + scale [B,D]) + shift [B,D] (fused) */
    void (*layernorm_modulate)(const float *x, const float *shift, const float *scale, float *y,
                               int64_t B, int64_t N, int64_t D, float eps);
    /* y [rows,H*Dh] = x / rms(x per head) * w [Dh] */
    void (*rmsnorm_heads)(const float *x, const float *w, float *y, int64_t rows, int64_t H,
                          int64_t Dh, float eps);
    /* y [B,N,D] = x * (1 + scale [B,D]) + shift [B,D] */
    void (*modulate)(const float *x, const float *shift, const float *scale, float *y, int64_t B,
                     int64_t N, int64_t D);
    /* y [B,N,D] = res + gate [B,D] * v */
    void (*gate_add)(const float *res, const float *gate, const float *v, float *y, int64_t B,
                     int64_t N, int64_t D);
    /* o [B,Nq,H*Dh] = softmax(q k^T / sqrt(Dh)) v, per batch and head.
     * rope (every attention slot's last argument; NULL: none): a rotary
     * table [Nk, Dh] (kk_rope_table's) by which q and k are rotated
     * (kk_rope's arithmetic, bitwise) as the kernel loads them: key j takes
     * row j, query i row i (the queries are the first Nq tokens); so Flux's
     * RoPE costs no pass over memory and its joint attention stays fused */
    void (*attention)(const float *q, const float *k, const float *v, float *o, int64_t B,
                      int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, const float *rope);
    /* o [B,Na+Nb,H*Dh]: attention over two token segments read in place, q =
     * [qa; qb] along each batch's tokens (qa [B,Na,H*Dh], qb [B,Nb,H*Dh]), k
     * and v alike: the image and context streams, whose concatenations
     * kg_fuse folds in. qb NULL: only qa's tokens are queries, o [B,Na,H*Dh]
     * (k and v still span both segments); rope: [Na+Nb, Dh], token i of
     * the concatenation (a, then b) taking row i */
    void (*attention_joint)(const float *qa, const float *ka, const float *va, const float *qb, const float *kb,
                            const float *vb, float *o, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,
                            const float *rope);
    /* Optional: attention_joint on q, k, v in bf16 rows (KK_FMT_BF16), as
     * the GEMMs making them wrote them, and o for the GEMMs after
     * (kg_plan_bf16) in o_fmt: f32 or bf16 rows, or KK_FMT_BLOCKED by token
     * segment as kk_block_segments lays it out (the first segment's B*Na
     * rows blocked, then from kk_blocked_elems(B*Na, H*Dh) on the second's
     * B*Nb, when qb is given), so each segment's GEMM reads it in place; for
     * plain attention, qb, kb and vb NULL and Nb 0 */
    void (*attention_joint_bf16)(const uint16_t *qa, const uint16_t *ka, const uint16_t *va, const uint16_t *qb,
                                 const uint16_t *kb, const uint16_t *vb, void *o, int o_fmt, int64_t B, int64_t Na,
                                 int64_t Nb, int64_t H, int64_t Dh, const float *rope);
    /* y [B,N,M] = res [B,N,M] + gate [B,M] * (x [B,N,K] . W^T + b): a gate_add
     * in the GEMM's epilogue (kg_fuse); gate's rows are gate_ld floats apart;
     * gate NULL: y = res + (x . W^T + b) with res [N,M], the same for every
     * batch entry (an add of a table, the position embedding, folded in);
     * x is bf16 (rows or blocked: x_fmt, KK_FMT_*) only on backends with linear_io */
    void (*linear_gate_add)(const void *x, int x_fmt, const kk_weight *w, const float *b, const float *res,
                            const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N);
    /* Optional (NULL: not offered): bf16 activations between ops, so a GEMM
     * whose input another op produced needs no conversion pass. x_fmt /
     * y_fmt are KK_FMT_*: f32, bf16 rows or bf16 blocked; a backend that
     * offers these takes every format (converting where its GEMM cannot
     * read or write one), and the bf16 producers write KK_FMT_BF16 or
     * KK_FMT_BLOCKED. */
    void (*linear_io)(const void *x, int x_fmt, const kk_weight *w, const float *b, void *y, int y_fmt,
                      int64_t rows, int act);
    void (*layernorm_modulate_bf16)(const float *x, const float *shift, const float *scale, uint16_t *y,
                                    int64_t B, int64_t N, int64_t D, float eps, int y_fmt);
    void (*modulate_bf16)(const float *x, const float *shift, const float *scale, uint16_t *y, int64_t B,
                          int64_t N, int64_t D, int y_fmt);

    /* ---- memory: every activation, weight and input of a forward lives in
     * the backend's memory. Executors get buffers through kk_buf_alloc /
     * kk_buf_free, copy a forward's inputs in and its outputs out with
     * kk_copy_from_host / kk_copy_to_host, and see weights through
     * kk_buf_map. alloc NULL: the backend's memory is the host's
     * (kb_alloc_aligned, 64-byte aligned; copies are memcpy, a mapping is
     * the host memory itself), and executors hand it host buffers in
     * place. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*to_host)(void *host, const void *buf, size_t bytes);
    void (*from_host)(void *buf, const void *host, size_t bytes);
    /* a buffer holding a copy of host memory its kernels read and never
     * write (a weight in a mapped cache file): a device backend uploads it,
     * once per model; released by unmap */
    void *(*map)(const void *host, size_t bytes);
    void (*unmap)(void *buf);
    /* Optional: 1 when the backend runs its slot `slot` (KK_SLOT_*) on
     * activations in format fmt (KK_FMT_*), reading GEMM weight w (NULL: any
     * weight, or none). The planner asks it (kg_plan_bf16: which formats
     * the backend wants between ops), and so does every executor before it
     * runs an op (kg_runner: an op whose slot a backend does not run in f32
     * runs on the host, kk_host, its values copied there and back). NULL:
     * every slot in f32 only. The CPU backend in bf16 (fast.c) answers:
     *   LINEAR      BF16 on weights packed bf16 or quantized (linear_io,
     *               linear_gate_add read it; kk_weight_bf16_io), BLOCKED
     *               where its AMX GEMM reads the weight's input blocked
     *   LAYERNORM_MODULATE, MODULATE   BF16, and BLOCKED with AMX (the
     *               _bf16 slots)
     *   ATTENTION   BF16: q, k, v in bf16 rows, the output in bf16 rows,
     *               or BLOCKED with AMX (attention_joint_bf16)
     *   CONV2D      BF16 on weights packed bf16: channels-last bf16 x read
     *               (kk_conv.x_bf16) and y written (y_bf16)
     *   GROUP_NORM  BF16: channels-last bf16 rows read and written
     *   SLICE_ROWS  BF16: rows of bf16 pairs moved as f32 units */
    int (*supports)(int slot, int fmt, const kk_weight *w);

    /* ---- weights: what the weight cache stores for this backend, so a
     * forward reads exactly what its kernels consume (docs/cache.md).
     * pack_layout NULL: f32 row-major weights (the reference kernels'), and
     * then pack, weights_tag and weight_dtype_error are NULL too. */
    /* the cache key's layout part: what the packed layouts depend on (the
     * CPU's features, oneDNN's version, the GEMM: kk_fast_isa) */
    const char *(*weights_tag)(void);
    /* the packed layout of a weight in dt (F32, BF16, I8, F8_E4M3): a
     * linear's W [M,K] (sh = {M, K}; conv 0) or a convolution's
     * [Cout,Cin,kh,kw] (conv 1): its name and size in bytes */
    kiln_status (*pack_layout)(const int64_t sh[4], int conv, kiln_dtype dt, char layout[40], size_t *bytes);
    /* w (f32 row-major) packed into out (pack_layout's bytes); quantized
     * for I8 and F8_E4M3 */
    kiln_status (*pack)(const float *w, const int64_t sh[4], int conv, kiln_dtype dt, void *out);
    /* NULL when the backend computes with linear weights packed in dt; else
     * why not, in words for the user */
    const char *(*weight_dtype_error)(kiln_dtype dt);
    /* whether the machine has a feature a package's manifest needs
     * ("avx512bf16", "amx": kk_cpu_has); NULL: none */
    int (*has_feature)(const char *feature);

    /* ---- the VAE's convolutions. y [B,Cout,Ho,Wo] = conv(x [B,Cin,H,W], w)
     * + b [Cout] (+ res, y's shape, where p->residual; b and res may be
     * NULL), geometry p; w [Cout,Cin,kh,kw] as M = Cout,
     * K = Cin*kh*kw: f32 row-major, or packed (packed_dtype F32 or BF16) in
     * kk_fast_conv_layout's layout at conversion (the fast backends read
     * either; the reference needs f32). */
    void (*conv2d)(const float *x, const kk_weight *w, const float *b, const float *res, float *y, const kk_conv *p);
    /* The group norm of x [B,C,S] (nhwc: [B,S,C]) over G groups, * w + b,
     * SiLU when silu, as kk_group_norm computes it; x_bf16 / y_bf16 (nhwc,
     * where supports(GROUP_NORM, BF16)): x is read / y is written as bf16 rows
     * (void *) */
    void (*group_norm)(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                       int64_t G, float eps, int silu, int nhwc, int x_bf16, int y_bf16);
    /* Attention with a scale, an additive bias and a causal mask, exactly
     * kk_attention_general's contract (the text encoders' attention_ex;
     * the reference's is kk_attention_general) */
    void (*attention_ex)(const float *q, const float *k, const float *v, const float *bias, const int64_t bs[4],
                         float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, float scale, int causal);
    /* y [n] = exact GELU, quick GELU or ReLU of x (KK_UN_*), as kk_unary */
    void (*unary)(int op, const float *x, float *y, int64_t n);

    /* ---- the ops that move or combine values without a GEMM; every
     * backend has them (the CPU's: layout.c, KK_HOST_OPS in cpu/host_ops.h),
     * so an executor runs every op through its backend (ops.c) */
    /* y = a op b (KK_BIN_*), numpy broadcasting over shapes right-aligned to 4 dims (kk_binary) */
    void (*binary)(int op, const float *a, const int64_t as[4], const float *b, const int64_t bs[4], float *y,
                   const int64_t ys[4]);
    void (*gather_rows)(const float *table, int64_t V, int64_t D, const float *ids, int64_t n, float *y);
    void (*affine_rows)(float *y, const float *w, const float *b, int64_t rows, int64_t D);
    void (*rmsnorm_rows)(const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps);
    void (*slice_rows)(const float *x, float *y, int64_t rows, int64_t stride, int64_t off, int64_t len);
    void (*concat_rows)(const float *a, int64_t na, const float *b, int64_t nb, float *y, int64_t rows);
    void (*patchify)(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t p);
    void (*unpatchify)(const float *x, float *y, int64_t B, int64_t p, int64_t h, int64_t w, int64_t C, int cfirst);
    void (*timestep_proj)(const float *t, float *y, int64_t B, int64_t dim, float scale);
    void (*pos_crop)(const float *table, float *y, int64_t M, int64_t h, int64_t w, int64_t D);
    void (*rope_table)(float *y, int64_t T, int64_t h, int64_t w, const int64_t axes[3], float theta);
    void (*rope)(const float *x, const float *table, float *y, int64_t B, int64_t N, int64_t H, int64_t Dh);
    void (*upsample_nearest)(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t f, int nhwc);
    void (*logvar_std)(const float *x, float *y, int64_t n);
    void (*select_token)(const float *x, const float *ids, float *y, int64_t B, int64_t T, int64_t D, int64_t eos);
    void (*rel_pos_bias)(const float *table, int64_t num_buckets, int64_t H, int64_t Nq, int64_t Nk,
                         int64_t max_distance, int bidirectional, float *y);
    /* bytes from src to dst, both the backend's (a reshape) */
    void (*copy)(void *dst, const void *src, size_t bytes);
} kk_backend;

/* ---- a backend through its slots, with the defaults of kk_backend
 * (src/kernels/backend.c) ---- */
/* 1 when the host reads and writes be's buffers directly (no alloc slot) */
static inline int kk_host_memory(const kk_backend *be) { return !be || !be->alloc; }
void *kk_buf_alloc(const kk_backend *be, size_t bytes);
void kk_buf_free(const kk_backend *be, void *p);
void kk_copy_to_host(const kk_backend *be, void *host, const void *buf, size_t bytes);
void kk_copy_from_host(const kk_backend *be, void *buf, const void *host, size_t bytes);
/* be's view of host memory its kernels read (a weight); host itself where
 * be's memory is the host's; NULL out of memory (host NULL: NULL) */
void *kk_buf_map(const kk_backend *be, const void *host, size_t bytes);
void kk_buf_unmap(const kk_backend *be, void *buf, const void *host);
/* Whether be runs slot (KK_SLOT_*) on activations in fmt with GEMM weight
 * w (kk_backend.supports; NULL: f32 only). KK_SLOT_HOST: in f32 where be's
 * memory is the host's. */
static inline int kk_supports(const kk_backend *be, int slot, int fmt, const kk_weight *w) {
    if (slot == KK_SLOT_HOST) return fmt == KK_FMT_F32 && kk_host_memory(be);
    return be->supports ? be->supports(slot, fmt, w) : fmt == KK_FMT_F32;
}
/* "linear", "attention", ...: a slot kind's name (the slot's own, as the struct names it) */
const char *kk_slot_name(int slot);
/* 1 when be stores linear and convolution weights packed (pack_layout) */
int kk_packs(const kk_backend *be);
/* be's packed layout of a weight (kk_backend.pack_layout); "rowmajor" and
 * the f32 size for a backend that does not pack */
kiln_status kk_pack_layout(const kk_backend *be, const int64_t sh[4], int conv, kiln_dtype dt, char layout[40],
                           size_t *bytes);
kiln_status kk_pack(const kk_backend *be, const float *w, const int64_t sh[4], int conv, kiln_dtype dt, void *out);
/* the cache key's layout part ("" for f32 row-major weights) */
const char *kk_weights_tag(const kk_backend *be);
/* NULL when be computes with linear weights packed in dt, else why not */
const char *kk_weight_dtype_error(const kk_backend *be, kiln_dtype dt);
int kk_has_feature(const kk_backend *be, const char *feature);
/* The scales of a quantized packed blob of `bytes` bytes, its last 4*M
 * bytes (kk_weight); NULL for other dtypes. Address arithmetic only, so it
 * serves a backend buffer too. */
const float *kk_weight_scales(const void *packed, size_t bytes, int64_t M, kiln_dtype dt);

/* ---- the backends of this build, by name (backend.c) ---- */
/* "cpu": the fast CPU kernels (kk_fast), F32 or BF16; "reference": the
 * reference kernels, F32; "check": the reference kernels on memory the host
 * cannot touch outside the backend's own calls (kernels/check/check.c), F32.
 * NULL when there is no such backend or it does not compute in dt. */
const kk_backend *kk_backend_get(const char *name, kiln_dtype dt);
/* "cpu, reference, check" */
const char *kk_backend_names(void);
/* The registry name of a backend kk_backend_get returned ("cpu", ...). */
const char *kk_backend_family(const kk_backend *be);
/* The host backend that runs, on copies, an op another backend does not
 * (kk_backend.supports): the reference kernels. */
const kk_backend *kk_host(void);

/* Data movement shared by every executor (src/kernels/layout.c). */
/* x [B,C,H,W] -> y [B,(H/p)(W/p),C*p*p] */
void kk_patchify(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t p);
/* x [B,h*w,p*p*C] -> y [B,C,h*p,w*p]; a token's features in the order
 * (py, px, c) (SD3's unpatchify), or with cfirst (c, py, px) (Flux's
 * _unpack_latents, the inverse of patchify) */
void kk_unpatchify(const float *x, float *y, int64_t B, int64_t p, int64_t h, int64_t w, int64_t C, int cfirst);
/* t [B] -> y [B,dim] sinusoidal (cos | sin) of t * scale */
void kk_timestep_proj(const float *t, float *y, int64_t B, int64_t dim, float scale);
/* table [M*M,D] -> y [h*w,D], centre crop */
void kk_pos_crop(const float *table, float *y, int64_t M, int64_t h, int64_t w, int64_t D);
/* Flux's rotary table y [T + h*w, Dh], Dh = axes[0] + axes[1] + axes[2]:
 * T text tokens at position ids (0, 0, 0), then the h x w image tokens
 * row-major at (0, row, col) (FluxPipeline's txt_ids, img_ids); for each
 * axis a its axes[a]/2 pairs j have the angle id[a] / theta^(2j/axes[a])
 * (diffusers' FluxPosEmbed, in double), and y[n, 2i] = cos, y[n, 2i+1] =
 * sin of the pair i (the axes' pairs in order) */
void kk_rope_table(float *y, int64_t T, int64_t h, int64_t w, const int64_t axes[3], float theta);
/* x [B,N,H*Dh] rotated by table [N,Dh] (kk_rope_table's): each head's
 * adjacent channel pair (x0, x1) -> (x0 c - x1 s, x1 c + x0 s), as
 * diffusers' apply_rotary_emb(use_real_unbind_dim=-1) */
void kk_rope(const float *x, const float *table, float *y, int64_t B, int64_t N, int64_t H, int64_t Dh);
/* kk_rope of one head's row x [Dh] by the table's row t [Dh] into y: what
 * the attention kernels apply as they load q and k (the same arithmetic) */
static inline void kk_rope_row(const float *x, const float *t, float *y, int64_t Dh) {
    for (int64_t i = 0; i < Dh; i += 2) {
        float x0 = x[i], x1 = x[i + 1], c = t[i], s = t[i + 1];
        y[i] = x0 * c + -x1 * s;
        y[i + 1] = x1 * c + x0 * s;
    }
}
/* y [n] = a [n] + b [i % nb] */
void kk_add_bcast(const float *a, const float *b, float *y, int64_t n, int64_t nb);
/* y [rows,len] = x [rows, off .. off+len) of rows of stride floats */
void kk_slice_rows(const float *x, float *y, int64_t rows, int64_t stride, int64_t off, int64_t len);
/* y [rows, na+nb] = a [rows,na] ++ b [rows,nb] */
void kk_concat_rows(const float *a, int64_t na, const float *b, int64_t nb, float *y, int64_t rows);
/* General forms, f32, shared by every backend (layout.c): */
enum { KK_BIN_ADD = 0, KK_BIN_MUL = 1 };
/* y = a op b with numpy broadcasting: shapes right-aligned to 4 dims (a
 * dim of 1 in a or b repeats), ys the broadcast shape; kk_binary takes
 * kk_add_bcast's path where b is a's trailing dims (the same sums) */
void kk_binary(int op, const float *a, const int64_t as[4], const float *b, const int64_t bs[4], float *y,
               const int64_t ys[4]);
void kk_binary_bcast(int op, const float *a, const int64_t as[4], const float *b, const int64_t bs[4], float *y,
                     const int64_t ys[4]);
enum { KK_UN_GELU = 0, KK_UN_QUICK_GELU = 1, KK_UN_RELU = 2 };
/* y [n] = exact GELU (erf), quick GELU (x * sigmoid(1.702 x)) or ReLU of x */
void kk_unary(int op, const float *x, float *y, int64_t n);
/* y [n, D] = table [V, D] rows ids [n] (integers as f32); an id outside
 * [0, V) gives a zero row and a deferred failure (kb_defer_failure) */
void kk_gather_rows(const float *table, int64_t V, int64_t D, const float *ids, int64_t n, float *y);
/* y [rows,D] = y * w [D] + b [D] in place (either may be NULL) */
void kk_affine_rows(float *y, const float *w, const float *b, int64_t rows, int64_t D);
/* y [rows,D] = x / sqrt(mean(x^2) + eps) * w [D] (w NULL: 1), the mean
 * square summed in double and taken in f32 */
void kk_rmsnorm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps);
/* o [B,Nq,H*Dh] = softmax(scale * q k^T + bias) v per batch and head, with
 * bias [Bb,Hb,Nq,Nk] (Bb 1 or B, Hb 1 or H; NULL: none) and, causal, key j
 * only for query i >= j; double sums, a key whose score is -inf adds nothing
 * (a row of such keys gives 0) */
void kk_attention_general(const float *q, const float *k, const float *v, const float *bias, const int64_t bs[4],
                          float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, float scale, int causal);
/* linear_gate_add as be's linear (linear_io for bf16 x, x_fmt a KK_FMT_*)
 * and then its gate_add over y, one batch entry (gate row) at a time (with
 * gate NULL, y + res [N,M] for each): for GEMMs without the epilogue */
void kk_linear_then_gate_add(const kk_backend *be, const void *x, int x_fmt, const kk_weight *w, const float *b,
                             const float *res, const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N);
/* attention_joint by be->attention on the concatenated q (or qa alone when
 * qb is NULL), k and v, made in work (3 * B*(Na+Nb)*H*Dh floats): for
 * kernels without segmented reads */
void kk_attention_joint_concat(const kk_backend *be, const float *qa, const float *ka, const float *va,
                               const float *qb, const float *kb, const float *vb, float *o, int64_t B, int64_t Na,
                               int64_t Nb, int64_t H, int64_t Dh, float *work, const float *rope);

/* y [B,C,S] = group norm of x [B,C,S] (S: every position) over G groups of
 * C/G channels, * w [C] + b [C] (either may be NULL), then SiLU when silu:
 * mean and variance summed in double per (batch entry, group), the
 * normalised value formed in double and rounded once. nhwc: x and y are
 * [B,S,C] (channels last), summed in the same order, so both layouts give
 * the same bits. */
void kk_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                   int64_t G, float eps, int silu, int nhwc);
/* The sub-pixel form of w [Cout,Cin,3,3], the conv after a nearest 2x
 * upsample: out [4 Cout, Cin, 2, 2], phase (a, b) (output row parity a,
 * column parity b) at rows (2a + b) Cout ... Taps of output row 2i + a read
 * input rows i + a - 1 and i + a: for a = 0 w's kernel row 0, then rows 1 + 2;
 * for a = 1 rows 0 + 1, then row 2 (columns alike). Sums in double, rounded
 * once. Then y[2i+a, 2j+b] = sum over taps t, u of x[i+a-1+t, j+b-1+u] .
 * out[phase][t][u]: upsample-then-conv in a 16/36 of its multiplies. */
void kk_conv_up2_weight(const float *w, int64_t Cout, int64_t Cin, float *out);
/* x [B,C,H,W] -> y [B,C,f*H,f*W], nearest (each value repeated f x f);
 * nhwc: [B,H,W,C] -> [B,f*H,f*W,C] */
void kk_upsample_nearest(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t f, int nhwc);

/* y [n] = exp(0.5 * clamp(x, -30, 20)) (in double, rounded once) */
void kk_logvar_std(const float *x, float *y, int64_t n);

/* The reference kernels: straightforward loops, double accumulation. */
const kk_backend *kk_reference(void);

/* The fast CPU backend computing GEMMs in dt (F32, or BF16 with f32
 * accumulation) on weights packed by kk_fast_pack; NULL when this build or
 * machine cannot (the caller falls back to the reference). */
const kk_backend *kk_fast(kiln_dtype dt);
/* The packed layout the fast GEMM wants for W [M,K] in dt (F32, BF16, or
 * quantized I8 / F8_E4M3) on this machine: a name ("amx32", "f16p64",
 * "s8-amx32", "e4m3-amx32", or oneDNN's "dnnl-<hex>" / "e4m3-<hex>") and its size in
 * bytes (scales included). */
kiln_status kk_fast_layout(int64_t M, int64_t K, kiln_dtype dt, char layout[40], size_t *bytes);
/* The CPU features, oneDNN version and GEMM the packed layouts depend on,
 * e.g. "amx-dnnl2.6-amx32" or "avx512bf16-dnnl2.6-f16p64" (part of the
 * weight cache key). */
const char *kk_fast_isa(void);
/* The CPU classes of docs/PERFORMANCE.md, weakest first. A machine's class
 * comes from cpuid; KILN_MAX_ISA (one of the names below, from avx2) caps
 * it, so that a machine runs exactly the kernels a lower class runs, oneDNN's
 * included (capped through dnnl_set_max_cpu_isa before its first use);
 * ONEDNN_MAX_CPU_ISA lowers it too. */
typedef enum {
    KK_CLASS_BASE,        /* "sse41": below AVX2 + FMA + F16C: the reference kernels' class */
    KK_CLASS_AVX2,        /* "avx2": AVX2, FMA, F16C (AMD Zen 1-3, Intel before Skylake-SP) */
    KK_CLASS_AVX512,      /* "avx512": AVX-512 F/BW/VL/DQ without BF16 (Skylake-SP, Ice Lake) */
    KK_CLASS_AVX512_BF16, /* "avx512_bf16": and AVX512-BF16 and VNNI (AMD Zen 4/5) */
    KK_CLASS_AVX512_FP16, /* "avx512_fp16": and AVX512-FP16 (a Sapphire Rapids with AMX hidden) */
    KK_CLASS_AMX,         /* "amx": and AMX-BF16/INT8 tiles (Sapphire Rapids and later) */
    KK_CLASS_COUNT
} kk_class;
/* This process's class: the hardware's, capped by KILN_MAX_ISA (an unknown
 * value caps nothing; kk_cpu_cap_error says so) and ONEDNN_MAX_CPU_ISA. */
kk_class kk_cpu_class(void);
/* The hardware's class, uncapped. */
kk_class kk_cpu_hw_class(void);
/* A class's name ("avx2", ...), and a name's class (-1: not one). */
const char *kk_class_name(kk_class c);
int kk_class_parse(const char *name);
/* NULL, or a message when KILN_MAX_ISA is set to something that is not a class. */
const char *kk_cpu_cap_error(void);
/* Whether this machine has a CPU feature named by a kk_fast_isa tag
 * ("avx2", "avx512", "avx512vnni", "avx512bf16", "amx"); 0 for names it
 * does not know. */
int kk_cpu_has(const char *feature);
/* Pack W [M,K] (f32 row-major) into out (kk_fast_layout's bytes); for I8
 * and F8_E4M3 quantize it first (per output channel, src/tensor/quant.h). */
kiln_status kk_fast_pack(const float *w, int64_t M, int64_t K, kiln_dtype dt, void *out);
/* The layout the fast convolution wants for a conv weight [Cout,Cin,kh,kw]
 * in dt (F32 or BF16) on this machine: the weights oneDNN's convolution
 * primitive picks, named "conv-<hex>" (the oneDNN layout's hash), and its
 * size in bytes; and the packing of w (f32 row-major) into it. A
 * convolution whose primitive wants another layout (another geometry)
 * reorders the packed weight per call. */
kiln_status kk_fast_conv_layout(int64_t Cout, int64_t Cin, int64_t kh, int64_t kw, kiln_dtype dt, char layout[40],
                                size_t *bytes);
kiln_status kk_fast_conv_pack(const float *w, int64_t Cout, int64_t Cin, int64_t kh, int64_t kw, kiln_dtype dt,
                              void *out);
/* W [M,K] f32 row-major back from a packed weight (dequantized: q * scale):
 * the oracle that quantized kernels are tested against. */
kiln_status kk_fast_unpack(const kk_weight *w, float *out);

/* y [B,D] = x [B,T,D] at one position t of each batch entry, chosen from
 * ids [B,T] (integers as f32): eos < 0, the first position of the largest
 * id; else the first position whose id is eos, 0 when none (a text
 * encoder's pooled token, as transformers picks it) */
void kk_select_token(const float *x, const float *ids, float *y, int64_t B, int64_t T, int64_t D, int64_t eos);

/* T5's relative position bucket (transformers' _relative_position_bucket)
 * of rel = key position - query position: with bidirectional, half of the
 * num_buckets for rel > 0; within each half, distances below max_exact =
 * half / 2 have a bucket each and longer ones share log-spaced buckets up
 * to max_distance, the log formula in float32 and truncated as torch does.
 * Needs half / 2 >= 1 and max_distance > max_exact (graph.c checks). */
int64_t kk_rel_pos_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance, int bidirectional);
/* y [H, Nq, Nk] = table [num_buckets, H] at row kk_rel_pos_bucket(j - i)
 * for query i, key j: T5's position bias (layout.c) */
void kk_rel_pos_bias(const float *table, int64_t num_buckets, int64_t H, int64_t Nq, int64_t Nk, int64_t max_distance,
                     int bidirectional, float *y);

#endif
