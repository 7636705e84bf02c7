/* dist.c - the mesh and its collectives on MPI; stubs without MPI. */
#include "dist/dist.h"

#include "base/base.h"

#include <stdlib.h>
#include <string.h>

static uint64_t g_bytes_sent; /* documented in dist.h: bytes this rank sent */

uint64_t kd_bytes_sent(void) { return __atomic_load_n(&g_bytes_sent, __ATOMIC_RELAXED); }
uint64_t kiln_dist_bytes_sent(void) { return kd_bytes_sent(); }
int kiln_dist_available(void) { return kd_available(); }
int kiln_dist_rank(void) { return kd_world_rank(); }
int kiln_dist_size(void) { return kd_world_size(); }
kiln_status kiln_dist_init(void) { return kd_init(); }

int kd_launched(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return 1;
    }
    return 0;
}

void kd_infer_mesh(const kiln_parallel *p, int *rows, int *cols) {
    if ((int64_t)*rows * *cols > 1) return;
    const kiln_par_dim *d[3] = {&p->cfg, &p->tp, &p->sp};
    int n[2] = {1, 1};
    for (int i = 0; i < 3; i++)
        if (d[i]->factor > 1 && (d[i]->axis == 0 || d[i]->axis == 1)) n[d[i]->axis] *= d[i]->factor;
    *rows = n[0];
    *cols = n[1];
}

/* the checks that need no MPI: factors fill each axis exactly */
static kiln_status check_layout(int rows, int cols, const kiln_parallel *p) {
    const kiln_par_dim *d[3] = {&p->cfg, &p->tp, &p->sp};
    const char *names[3] = {"cfg", "tensor", "sequence"};
    int n[2] = {1, 1};
    if (rows < 1 || cols < 1)
        return kb_fail(KILN_ERR_INVALID_ARG, "mesh %dx%d: rows and columns must be at least 1", rows, cols);
    for (int i = 0; i < 3; i++) {
        if (d[i]->factor < 1 || d[i]->axis < 0 || d[i]->axis > 1)
            return kb_fail(KILN_ERR_INVALID_ARG, "%s parallel: factor %d on axis %d (factor >= 1, axis 0 or 1)",
                           names[i], d[i]->factor, d[i]->axis);
        if (d[i]->factor > 1) n[d[i]->axis] *= d[i]->factor;
    }
    if (n[0] != rows || n[1] != cols)
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "mesh %dx%d does not match the parallel factors: those on axis 0 (rows) multiply to %d "
                       "and those on axis 1 (columns) to %d (cfg %d on axis %d, tp %d on axis %d, sp %d on axis %d)",
                       rows, cols, n[0], n[1], p->cfg.factor, p->cfg.axis, p->tp.factor, p->tp.axis,
                       p->sp.factor, p->sp.axis);
    return KILN_OK;
}

#ifdef KILN_HAVE_MPI
#include <limits.h>
#include <mpi.h>

struct kd_comms {
    MPI_Comm c[KD_NGROUPS];
};

static int g_we_init;

static void count(uint64_t b) { __atomic_fetch_add(&g_bytes_sent, b, __ATOMIC_RELAXED); }

int kd_available(void) { return 1; }

static void finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

kiln_status kd_init(void) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return KILN_OK;
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return kb_fail(KILN_ERR_IO, "MPI_Init_thread failed");
    g_we_init = 1;
    atexit(finalize);
    return KILN_OK;
}

int kd_world_size(void) {
    int init = 0, fin = 0, n = 1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

int kd_world_rank(void) {
    int init = 0, fin = 0, r = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

/* the host name every rank reports: KILN_HOST_ID (tests simulate hosts with
 * it) or the processor name */
static void host_id(char *buf, size_t cap) {
    const char *e = getenv("KILN_HOST_ID");
    if (e && *e) {
        snprintf(buf, cap, "%s", e);
        return;
    }
    char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
    int len = 0;
    MPI_Get_processor_name(name, &len);
    snprintf(buf, cap, "%s", name);
}

#define HOST_LEN 256

kiln_status kd_mesh_create(int rows, int cols, const kiln_parallel *p, int fsdp, kd_mesh **out) {
    *out = NULL;
    kiln_status st = check_layout(rows, cols, p);
    if (st) return st;
    int init = 0;
    MPI_Initialized(&init);
    if (!init && !kd_launched()) /* not under mpirun: do not start MPI just to fail */
        return kb_fail(KILN_ERR_INVALID_ARG, "a %dx%d mesh needs %d MPI ranks (mpirun -np %d); this process runs alone",
                       rows, cols, rows * cols, rows * cols);
    if ((st = kd_init())) return st;
    int world = kd_world_size(), rank = kd_world_rank();
    if (world != rows * cols)
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "mesh %dx%d needs %d ranks, but this run has %d (start it with mpirun -np %d)", rows, cols,
                       rows * cols, world, rows * cols);
    kd_mesh *m = kb_calloc(1, sizeof *m);
    kd_comms *c = kb_calloc(1, sizeof *c);
    char *hosts = kb_calloc((size_t)world, HOST_LEN);
    if (!m || !c || !hosts) {
        free(m);
        free(c);
        free(hosts);
        return KILN_ERR_NOMEM;
    }
    m->rows = rows;
    m->cols = cols;
    m->row = rank / cols;
    m->col = rank % cols;
    m->par = *p;
    m->fsdp = fsdp;
    m->comms = c;
    /* split each axis coordinate into cfg, tp, sp indices (sp innermost) */
    const kiln_par_dim *d[3] = {&p->cfg, &p->tp, &p->sp};
    int coord[2] = {m->row, m->col}, idx[3] = {0, 0, 0}, f[3];
    for (int i = 2; i >= 0; i--) {
        f[i] = d[i]->factor > 1 ? d[i]->factor : 1;
        if (f[i] > 1) {
            idx[i] = coord[d[i]->axis] % f[i];
            coord[d[i]->axis] /= f[i];
        }
    }
    m->size[KD_WORLD] = world;
    m->index[KD_WORLD] = rank;
    m->size[KD_CFG] = f[0], m->index[KD_CFG] = idx[0];
    m->size[KD_TP] = f[1], m->index[KD_TP] = idx[1];
    m->size[KD_SP] = f[2], m->index[KD_SP] = idx[2];
    m->size[KD_FSDP] = fsdp ? world / f[1] : 1;
    m->index[KD_FSDP] = fsdp ? idx[0] * f[2] + idx[2] : 0;
    /* a group: ranks equal in every index but its own */
    MPI_Comm_dup(MPI_COMM_WORLD, &c->c[KD_WORLD]);
    MPI_Comm_split(MPI_COMM_WORLD, idx[1] * f[2] + idx[2], idx[0], &c->c[KD_CFG]);
    MPI_Comm_split(MPI_COMM_WORLD, idx[0] * f[2] + idx[2], idx[1], &c->c[KD_TP]);
    MPI_Comm_split(MPI_COMM_WORLD, idx[0] * f[1] + idx[1], idx[2], &c->c[KD_SP]);
    MPI_Comm_split(MPI_COMM_WORLD, fsdp ? idx[1] : rank, m->index[KD_FSDP], &c->c[KD_FSDP]);
    /* hosts: which mesh rows and columns share this rank's host */
    char mine[HOST_LEN];
    host_id(mine, sizeof mine);
    MPI_Allgather(mine, HOST_LEN, MPI_CHAR, hosts, HOST_LEN, MPI_CHAR, MPI_COMM_WORLD);
    m->host_r0 = rows, m->host_c0 = cols, m->host_r1 = m->host_c1 = -1;
    for (int r = 0; r < world; r++) {
        const char *h = hosts + (size_t)r * HOST_LEN;
        int first = 1;
        for (int q = 0; q < r && first; q++) first = strcmp(hosts + (size_t)q * HOST_LEN, h) != 0;
        m->n_hosts += first;
        if (strcmp(h, mine)) continue;
        int rr = r / cols, cc = r % cols;
        if (rr < m->host_r0) m->host_r0 = rr;
        if (rr > m->host_r1) m->host_r1 = rr;
        if (cc < m->host_c0) m->host_c0 = cc;
        if (cc > m->host_c1) m->host_c1 = cc;
    }
    m->host_coords = m->n_hosts > 1;
    free(hosts);
    *out = m;
    return KILN_OK;
}

void kd_mesh_free(kd_mesh *m) {
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    for (int g = 0; g < KD_NGROUPS && !fin; g++)
        if (m->comms->c[g] != MPI_COMM_NULL) MPI_Comm_free(&m->comms->c[g]);
    free(m->comms);
    free(m);
}

static int as_int(size_t n) {
    if (n > (size_t)INT_MAX) {
        kb_log(KILN_LOG_ERROR, "a collective of %zu elements exceeds MPI's int count", n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return (int)n;
}

void kd_barrier(const kd_mesh *m) { MPI_Barrier(m->comms->c[KD_WORLD]); }

void kd_allreduce_sum(const kd_mesh *m, kd_group g, float *buf, size_t n) {
    int p = m->size[g];
    if (p <= 1) return;
    MPI_Allreduce(MPI_IN_PLACE, buf, as_int(n), MPI_FLOAT, MPI_SUM, m->comms->c[g]);
    count((uint64_t)(2.0 * (p - 1) / p * (double)(n * sizeof(float))));
}

void kd_allgather(const kd_mesh *m, kd_group g, const void *send, void *recv, size_t bytes) {
    int p = m->size[g];
    if (p <= 1) {
        memcpy(recv, send, bytes);
        return;
    }
    MPI_Allgather(send, as_int(bytes), MPI_BYTE, recv, as_int(bytes), MPI_BYTE, m->comms->c[g]);
    count((uint64_t)(p - 1) * bytes);
}

void kd_alltoall(const kd_mesh *m, kd_group g, const void *send, void *recv, size_t bytes) {
    int p = m->size[g];
    if (p <= 1) {
        memcpy(recv, send, bytes);
        return;
    }
    MPI_Alltoall(send, as_int(bytes), MPI_BYTE, recv, as_int(bytes), MPI_BYTE, m->comms->c[g]);
    count((uint64_t)(p - 1) * bytes);
}

void kd_allgatherv(const kd_mesh *m, kd_group g, const void *send, size_t bytes, void *recv,
                   const size_t *counts) {
    int p = m->size[g];
    if (p <= 1) {
        memcpy(recv, send, bytes);
        return;
    }
    int *cnt = malloc(sizeof(int) * 2 * (size_t)p);
    if (!cnt) {
        kb_log(KILN_LOG_ERROR, "out of memory in an all-gather");
        MPI_Abort(MPI_COMM_WORLD, 1);
        return;
    }
    size_t off = 0;
    for (int j = 0; j < p; j++) {
        cnt[j] = as_int(counts[j]);
        cnt[p + j] = as_int(off);
        off += counts[j];
    }
    MPI_Allgatherv(send, as_int(bytes), MPI_BYTE, recv, cnt, cnt + p, MPI_BYTE, m->comms->c[g]);
    count((uint64_t)(off - bytes));
    free(cnt);
}

#else /* no MPI in this build */

struct kd_comms {
    int unused;
};

int kd_available(void) { return 0; }
static kiln_status no_mpi(void) {
    return kb_fail(KILN_ERR_UNSUPPORTED,
                   "this kiln was built without MPI: install libopenmpi-dev (scripts/install-deps.sh) and "
                   "rebuild (cmake -DKILN_MPI=ON) to run on a mesh of ranks");
}
kiln_status kd_init(void) { return no_mpi(); }
int kd_world_size(void) { return 1; }
int kd_world_rank(void) { return 0; }
kiln_status kd_mesh_create(int rows, int cols, const kiln_parallel *p, int fsdp, kd_mesh **out) {
    (void)fsdp;
    *out = NULL;
    kiln_status st = check_layout(rows, cols, p);
    return st ? st : no_mpi();
}
void kd_mesh_free(kd_mesh *m) { free(m); }
/* never reached: no mesh can exist without MPI */
void kd_barrier(const kd_mesh *m) { (void)m; }
void kd_allreduce_sum(const kd_mesh *m, kd_group g, float *buf, size_t n) {
    (void)m, (void)g, (void)buf, (void)n;
}
void kd_allgather(const kd_mesh *m, kd_group g, const void *send, void *recv, size_t bytes) {
    (void)m, (void)g;
    memcpy(recv, send, bytes);
}
void kd_alltoall(const kd_mesh *m, kd_group g, const void *send, void *recv, size_t bytes) {
    (void)m, (void)g;
    memcpy(recv, send, bytes);
}
void kd_allgatherv(const kd_mesh *m, kd_group g, const void *send, size_t bytes, void *recv,
                   const size_t *counts) {
    (void)m, (void)g, (void)counts;
    memcpy(recv, send, bytes);
}
#endif
