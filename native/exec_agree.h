/* The agreement check's comparison, run by both program executors (exec_ucx.c, exec_shm.c). */
#ifndef PYCOLL_EXEC_AGREE_H
#define PYCOLL_EXEC_AGREE_H
#include <string.h>

#include "exec.h"

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
