/* onednn.h - what the fast CPU backend's files (fast.c, conv.c) share: one
 * oneDNN CPU engine, each thread's stream, and each thread's work buffers
 * (all defined in fast.c). */
#ifndef KILN_ONEDNN_H
#define KILN_ONEDNN_H

#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

/* The engine, made once; NULL when oneDNN could not make a CPU engine. */
dnnl_engine_t kk_dnnl_engine(void);
/* This thread's stream on it (threads run primitives at once); NULL on failure. */
dnnl_stream_t kk_dnnl_stream(void);

/* Work buffer slots: fast.c's GEMMs and attentions use 0..KK_SCRATCH_CONV-1
 * (attn_ex.c KK_SCRATCH_ATTN_EX), conv.c the KK_SCRATCH_CONV_N slots from
 * KK_SCRATCH_CONV. Each thread's buffers are freed when it exits. */
enum {
    KK_SCRATCH_ATTN_EX = 17,
    KK_SCRATCH_ROPE = 18, /* q and k rotated for the attention kernels that take no RoPE table */
    KK_SCRATCH_CONV = 21,
    KK_SCRATCH_CONV_N = 6,
    KK_SCRATCH_SLOTS = KK_SCRATCH_CONV + KK_SCRATCH_CONV_N
};
/* This thread's buffer of at least bytes in slot (it only grows); NULL when
 * out of memory, for a kernel that then takes another way. */
void *kk_scratch(int slot, size_t bytes);
/* This thread's buffer of at least bytes in slot (it only grows); NULL
 * records an out-of-memory failure in the calling thread's run
 * (kb_defer_failure: call it where the slot runs, not on a worker thread),
 * and the forward then fails instead of returning an output the kernel did
 * not write. */
void *kk_scratch_must(int slot, size_t bytes);

#endif
