/* The simulator's event loop (native/sim.c): its machine record and entry point, read by the cffi
 * build (native/build.py) into pycoll._native's declarations: one definition for both. Lines that
 * start with '#' are left out of those declarations. */
#ifndef PYCOLL_SIM_H
#define PYCOLL_SIM_H
#include <stdint.h>

/* The machine of pycoll.sim.engine.run's common case (sim.c): per-byte costs as the Python loop
 * computes them (1 / bandwidth), bandwidths of reductions and copies (inf: free). */
typedef struct {
    double alpha, per_byte, node_alpha, node_per_byte, overhead, reduce_bw, copy_bw, rendezvous;
    double overhead_per_byte, gap; /* LogGOPS's O and LogGP's g */
    int64_t rendezvous_bytes;
    int32_t ppn;
} pc_sim_machine_t;
/* Simulate n ranks' programs (flat arrays: see sim.c); finish[r], left[r] (instructions never run)
 * and stats (events, messages, bytes sent) out. PC_OK, PC_EINVAL or PC_ENOMEM. */
int pycoll_sim_run(int32_t n, const int64_t *ioff, const int8_t *kinds, const int32_t *peers,
                   const int32_t *steps, const int64_t *nbytes, const int32_t *ndeps, const int64_t *foff,
                   const int32_t *first, const int64_t *doff, const int32_t *dependents,
                   const pc_sim_machine_t *m, const double *starts, const double *factor, double *finish,
                   int64_t *left, int64_t *stats);

#endif
