/* dist.h - the mesh of ranks and its collectives, on MPI (Open MPI on Debian).
 *
 * A run of R ranks (mpirun -np R) is laid out as a mesh_rows x mesh_cols
 * grid: rank r sits at row r / cols, column r % cols. Each parallel
 * dimension (CFG, tensor, sequence) has a factor and a mesh axis; along one
 * axis the factors of the dimensions on it multiply to the axis length, and
 * a coordinate on the axis is split in the order cfg, tp, sp (outermost
 * first). Ranks that differ only in one dimension's index form its group
 * (a communicator): KD_TP for the all-reduce after row-parallel linears,
 * KD_SP for Ulysses' all-to-alls, KD_CFG for the two CFG halves, KD_FSDP
 * (ranks that hold the same tensor-parallel shard) for per-block gathers.
 *
 * Everything here compiles without MPI too (KILN_HAVE_MPI unset): then a
 * mesh larger than 1x1 fails with KILN_ERR_UNSUPPORTED and a message that
 * says how to build with MPI. MPI is initialised only when a mesh is made
 * (or the CLI runs under mpirun), never for a single process.
 * Collectives abort the job on a transport error (MPI_ERRORS_ARE_FATAL):
 * a half-finished collective cannot be recovered by one rank alone. */
#ifndef KILN_DIST_H
#define KILN_DIST_H

#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

typedef enum kd_group { KD_WORLD = 0, KD_CFG, KD_TP, KD_SP, KD_FSDP, KD_NGROUPS } kd_group;

typedef struct kd_comms kd_comms; /* the MPI communicators (dist.c) */

typedef struct kd_mesh {
    int rows, cols, row, col;
    kiln_parallel par;
    int fsdp;
    int size[KD_NGROUPS];  /* ranks in each group (1: the dimension is off) */
    int index[KD_NGROUPS]; /* this rank's index in each group */
    /* the mesh rows / columns this rank's host owns (host_coords set when
     * the run spans more than one host; KILN_HOST_ID overrides the host name) */
    int host_coords, host_r0, host_r1, host_c0, host_c1, n_hosts;
    kd_comms *comms;
} kd_mesh;

/* 1 when this kiln was built with MPI. */
int kd_available(void);
/* Initialise MPI once (thread level FUNNELED; MPI_Finalize at exit unless
 * the caller initialised MPI itself). */
kiln_status kd_init(void);
/* World size and rank: 1 and 0 when MPI is not initialised. */
int kd_world_size(void);
int kd_world_rank(void);
/* True when started by mpirun/mpiexec with more than one rank (by the
 * launcher's environment, before MPI_Init). */
int kd_launched(void);

/* Fill an unset mesh (1x1 with factors > 1) from the factors: rows = the
 * product of the factors on axis 0, columns on axis 1. */
void kd_infer_mesh(const kiln_parallel *p, int *rows, int *cols);
/* Check a mesh and parallel config against the world and build the groups.
 * Errors name the bad input (mesh size against the number of ranks, factors
 * that do not fill an axis). */
kiln_status kd_mesh_create(int rows, int cols, const kiln_parallel *p, int fsdp, kd_mesh **out);
void kd_mesh_free(kd_mesh *m);

void kd_barrier(const kd_mesh *m);
/* buf [n] summed over the group, in place */
void kd_allreduce_sum(const kd_mesh *m, kd_group g, float *buf, size_t n);
/* recv [size][bytes] = every member's send [bytes], in group order */
void kd_allgather(const kd_mesh *m, kd_group g, const void *send, void *recv, size_t bytes);
/* send [size][bytes] -> recv [size][bytes]: block j goes to member j */
void kd_alltoall(const kd_mesh *m, kd_group g, const void *send, void *recv, size_t bytes);
/* recv = concatenation of every member's send (counts[j] bytes each) */
void kd_allgatherv(const kd_mesh *m, kd_group g, const void *send, size_t bytes, void *recv,
                   const size_t *counts);

/* Bytes this rank sent through collectives since the start (by the usual
 * algorithms: ring all-reduce 2(p-1)/p n, all-gather and all-to-all (p-1)
 * blocks); the benchmark reports it per step. */
uint64_t kd_bytes_sent(void);

#endif
