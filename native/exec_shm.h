/* The program executor's state over shared memory (native/exec_shm.c; its instructions are
 * exec.h's), read by the cffi build (native/build.py) into pycoll._native's declarations. Lines
 * that start with '#' are left out of those declarations. */
#ifndef PYCOLL_EXEC_SHM_H
#define PYCOLL_EXEC_SHM_H
#include <stdint.h>

#include "exec.h"

/* e->status of a failed instruction (e->detail: the segment's or the system's error number) */
enum {
    PC_SX_LOST = 2,       /* its peer left (the transport's errflags) */
    PC_SX_TRUNC = 3,      /* a message of another length than the receive's slice */
    PC_SX_SEGMENT = 4,    /* the segment's descriptors are unreadable (detail: PC_E*) */
    PC_SX_CMA = 5,        /* the peer's memory could not be read (detail: errno) */
    PC_SX_NOMEM = 6,      /* no memory for a message that came before its receive */
    PC_SX_UNEXPECTED = 7, /* a message of this collective that no receive of the program expects */
    PC_SX_INVALID = 8     /* an instruction of an unknown kind, or a peer out of range */
};

typedef struct {
    void *base;               /* the team's segment (pycoll.tl.shm.ShmSegment) */
    uint64_t mapped;
    int32_t rank, size, n, nbufs;
    int32_t next, lo, failed, status, detail, nrpeers;
    int32_t stalled;          /* the receive whose sender's memory the last progress could not read
                               * (errno in detail; it is read again at the next), or -1 */
    uint64_t khash, agree;    /* the collective's key hash, its agreement exchange's */
    const int64_t *pids;      /* every rank's process (the one its memory is read from) */
    uint32_t *send_slot;      /* per peer: the next descriptor to post (shared with ShmTransport) */
    uint32_t *recv_slot;      /* per peer: the next descriptor to read (shared with ShmTransport) */
    const int32_t *errflags;  /* per peer: 1 once it is lost, 2 once another died or raised (set by ShmTransport) */
    const int32_t *rpeers;    /* the peers the program receives from */
    const pc_instr_t *ins;
    const int32_t *deps;
    char **bufs;
    uint8_t *state;           /* per instruction: PC_S_* */
    uint8_t *matched;         /* per receive: its message was read */
    uint32_t *slot;           /* per send: the descriptor it posted */
    char **early;             /* per receive: its message, read before it was issued (malloc) */
    uint64_t *times;          /* NULL, or per instruction when issued and when done (tracing) */
    const uint8_t *mark;      /* NULL, or the mark every message but the exchange's carries (exec.h) */
    uint8_t *marks;           /* per receive: where its message's mark lands (PC_MARK_BYTES each) */
    int64_t got;              /* a receive that failed with PC_ST_MARK: the payload bytes that came */
} pc_sx_t;

void pc_sx_start(pc_sx_t *e, uint64_t khash, uint64_t agree);
void pc_sx_did(pc_sx_t *e, int i);
int pc_sx_progress(pc_sx_t *e);
int pc_sx_run(pc_sx_t *e, int64_t spin_ns, int yield_every);
int pc_sx_early(pc_sx_t *e, int32_t src, int agree, uint64_t step, const void *data, uint64_t nbytes);
int pc_sx_reap(pc_sx_t *e);

#endif
