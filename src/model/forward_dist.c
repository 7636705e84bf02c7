/* forward_dist.c - a forward on a mesh of ranks. The graph is the family's
 * one model definition built for this rank's part (exec.c passes the
 * parallel context to the builder):
 *   CFG parallel   the batch (symbol 0, every input's and output's first
 *                  dimension) is split across the CFG group (uncond on one
 *                  rank, cond on the other) and the outputs all-gathered;
 *   tensor par.    the weights are this rank's shard, row-parallel outputs
 *                  all-reduced inside the graph;
 *   sequence par.  tokens split, attention by Ulysses all-to-all;
 *   FSDP           each block's weights gathered before it runs.
 * Every rank of the mesh must make the same calls with the same inputs. */
#include "base/base.h"
#include "dist/dist.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

kiln_status km_exec_run_dist(kiln_model *m, const int64_t *s, const float *const *in, float *const *out) {
    const kd_mesh *mesh = m->mesh;
    const ka_arch *a = m->arch;
    int cfg = mesh->size[KD_CFG], ci = mesh->index[KD_CFG];
    if (s[0] < 1 || s[0] % cfg)
        return kb_fail(KILN_ERR_SHAPE,
                       "CFG parallel %d splits the batch across ranks, but the batch is %lld (kiln generate runs "
                       "batch 2 with guidance > 1; guidance <= 1 has nothing to split)", cfg, (long long)s[0]);
    double t0 = kb_now();
    int64_t ls[KA_MAX_SYMS];
    memcpy(ls, s, sizeof ls);
    ls[0] = s[0] / cfg;
    int64_t ish[KA_MAX_IO][4] = {{0}}, osh[KA_MAX_OUT][4] = {{0}};
    a->io_shapes(m->cfg, ls, ish, osh);
    const float *lin[KA_MAX_IO];
    float *lout[KA_MAX_OUT] = {0};
    kiln_status st = KILN_OK;
    for (int k = 0; k < a->n_in; k++) lin[k] = in[k] + (size_t)ci * ka_numel(a->in[k].ndim, ish[k]); /* a row block */
    for (int k = 0; k < m->n_out && !st; k++) {
        lout[k] = cfg > 1 ? kb_alloc_aligned(sizeof(float) * ka_numel(m->out[k].ndim, osh[k])) : out[k];
        if (!lout[k]) st = kb_fail(KILN_ERR_NOMEM, "out of memory for the forward output %s", m->out[k].name);
    }
    /* this rank's part runs the execution chain like any forward */
    if (!st) st = km_exec_run(m, ls, lin, lout);
    /* outputs [cfg][B/cfg, ...] are the batch in order */
    for (int k = 0; k < m->n_out && cfg > 1; k++) {
        if (!st) kd_allgather(mesh, KD_CFG, lout[k], out[k], sizeof(float) * ka_numel(m->out[k].ndim, osh[k]));
        kb_free_aligned(lout[k]);
    }
    if (!st) kb_ledger_add("forward (mesh)", kb_now() - t0, kiln_model_last_exec(m));
    return st;
}
