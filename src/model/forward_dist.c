/* forward_dist.c - kiln_forward on a mesh of ranks. The graph is the one
 * model definition (sd3_forward.c) built for this rank's part:
 *   CFG parallel   the batch is split across the CFG group (uncond on one
 *                  rank, cond on the other) and the outputs all-gathered;
 *   tensor par.    the weights are this rank's shard, row-parallel outputs
 *                  all-reduced inside the graph;
 *   sequence par.  image tokens split, attention by Ulysses all-to-all;
 *   FSDP           each block's weights gathered before it runs.
 * Every rank of the mesh must make the same calls with the same inputs. */
#include "base/base.h"
#include "dist/dist.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

kiln_status km_forward_dist(kiln_model *m, const kiln_forward_args *a, float *out) {
    const kd_mesh *mesh = m->mesh;
    const kiln_config *c = &m->cfg;
    int cfg = mesh->size[KD_CFG], ci = mesh->index[KD_CFG];
    if (a->batch < 1 || a->batch % cfg)
        return kb_fail(KILN_ERR_SHAPE,
                       "CFG parallel %d splits the batch across ranks, but the batch is %d (kiln generate runs "
                       "batch 2 with guidance > 1; guidance <= 1 has nothing to split)", cfg, a->batch);
    double t0 = kb_now();
    int64_t Bl = a->batch / cfg, H = a->height, W = a->width, T = a->context_len;
    size_t img = (size_t)c->in_channels * (size_t)(H * W), oimg = (size_t)c->out_channels * (size_t)(H * W);
    size_t ctx = (size_t)T * (size_t)c->joint_attention_dim, pool = (size_t)c->pooled_projection_dim;
    size_t off = (size_t)(Bl * ci);
    const float *in[4] = {a->hidden + off * img, a->context + off * ctx, a->pooled + off * pool, a->timestep + off};
    float *mine = cfg > 1 ? kb_alloc_aligned(sizeof(float) * (size_t)Bl * oimg) : out;
    if (!mine) return kb_fail(KILN_ERR_NOMEM, "out of memory for the forward output");

    /* this rank's part runs the execution chain like any forward (exec.c builds
     * the graph with the parallel context and its collectives) */
    kiln_forward_args la = {(int)Bl, a->height, a->width, a->context_len, in[0], in[1], in[2], in[3]};
    kiln_status st = km_forward(m, &la, mine);
    /* outputs [cfg][Bl, C, H, W] are the batch in order */
    if (!st && cfg > 1) kd_allgather(mesh, KD_CFG, mine, out, sizeof(float) * (size_t)Bl * oimg);
    if (cfg > 1) kb_free_aligned(mine);
    if (!st) kb_ledger_add("forward (mesh)", kb_now() - t0, kiln_model_last_exec(m));
    return st;
}
