/* What both program executors (exec_ucx.c, exec_shm.c) share in code: the agreement check's
 * comparison and the instruction times a trace asks for. */
#ifndef PYCOLL_EXEC_UTIL_H
#define PYCOLL_EXEC_UTIL_H
#include <string.h>
#include <time.h>

#include "exec.h"

/* Whether every instruction that instruction `in` depends on is done (state: per instruction). */
static inline int pc_deps_done(const uint8_t *state, const int32_t *deps, const pc_instr_t *in)
{
    for (int d = 0; d < in->ndeps; d++)
        if (state[deps[in->dep0 + d]] != PC_S_DONE)
            return 0;
    return 1;
}

/* CLOCK_MONOTONIC in nanoseconds (Python's time.monotonic() reads the same clock). */
static inline uint64_t pc_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* With a times array (PYCOLL_TRACE_INSTRUCTIONS), note when instruction i was issued (k = 0) or
 * finished (k = 1). */
#define PC_MARK(e, i, k)                                   \
    do {                                                   \
        if ((e)->times)                                    \
            (e)->times[2 * (size_t)(i) + (k)] = pc_now_ns(); \
    } while (0)

/* Whether the n fingerprints (rows of PC_FP_WORDS) gathered in recs agree: the first PC_FP_FLOWS
 * words the same in every row, and the sums (mod 2**64) of the two flows columns equal (see
 * pycoll.agreement.disagreement, which then says how they differ). */
static inline int pc_exec_agree(const uint64_t *recs, int n)
{
    uint64_t sent = 0, received = 0;
    for (int r = 0; r < n; r++) {
        const uint64_t *row = recs + (size_t)r * PC_FP_WORDS;
        if (r && memcmp(row, recs, PC_FP_FLOWS * sizeof(uint64_t)) != 0)
            return 0;
        sent += row[PC_FP_FLOWS];
        received += row[PC_FP_FLOWS + 1];
    }
    return sent == received;
}

#endif
