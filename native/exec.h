/* A lowered program's instruction record and the executors' codes, shared by the executor over
 * UCX (exec_ucx.c, in pycoll._ucx) and the one over shared memory (exec_shm.c, in pycoll._native).
 * The cffi builds read this file into their declarations: lines that start with '#' are left
 * out, so it holds declarations only. */
#ifndef PYCOLL_EXEC_H
#define PYCOLL_EXEC_H
#include <stdint.h>

enum { PC_I_SEND = 0, PC_I_RECV = 1, PC_I_REDUCE = 2, PC_I_COPY = 3, PC_I_AVG = 4, PC_I_CHECK = 5 };
enum { PC_EXEC_RUNNING = 0, PC_EXEC_DONE = 1, PC_EXEC_PYTHON = 2, PC_EXEC_FAILED = -1 };
enum { PC_S_WAITING = 0, PC_S_POSTED = 1, PC_S_DONE = 2 };
/* flags: a send or receive of the agreement check's exchange (on the check's tags or key) */
enum { PC_F_AGREE = 1 };
/* e->status of a failed PC_I_CHECK: the ranks' fingerprints disagree (no UCS status is positive) */
enum { PC_ST_MISMATCH = 1 };
/* e->status of a failed receive whose message's mark is not e->mark, or whose payload has another
 * length (e->got: the payload bytes that came; -1: more than fit): see pycoll.tl.base's marks.
 * Where e->mark is set, every send and receive but the agreement exchange's (PC_F_AGREE) carries
 * the PC_MARK_BYTES of e->mark ahead of its payload, in one message; a receive's lands in
 * e->marks + PC_MARK_BYTES * i. */
enum { PC_ST_MARK = 16, PC_MARK_BYTES = 32 };
/* a fingerprint (pycoll.agreement): WORDS uint64, the first FLOWS alike on every rank, then two sums */
enum { PC_FP_WORDS = 8, PC_FP_FLOWS = 6 };

typedef struct {
    int32_t kind, peer, step, op, dtype, ndeps, dep0, flags;
    int32_t buf[3];
    int32_t pad2;
    uint64_t off[3];
    uint64_t len[3];
    uint64_t count; /* reduce: elements */
} pc_instr_t;

typedef int (*pc_reduce_fn)(int, int, void *, const void *, const void *, size_t);

#endif
