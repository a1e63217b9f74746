/* The program executor's state over UCX (native/exec_ucx.c; its instructions are exec.h's), read
 * by the cffi build (native/ucx_build.py) into pycoll._ucx's declarations: one definition for
 * both. Lines that start with '#' are left out of those declarations; ucp_worker_h and ucp_ep_h
 * come from ucp.h. */
#ifndef PYCOLL_EXEC_UCX_H
#define PYCOLL_EXEC_UCX_H
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "exec.h"

typedef struct {
    ucp_worker_h worker;
    ucp_ep_h *eps;
    const int *errflags;
    pc_reduce_fn reduce;
    int32_t rank, size, n, nbufs;
    int32_t next, lo, failed, status;
    uint64_t base, agree;
    const pc_instr_t *ins;
    const int32_t *deps;
    char **bufs;
    void **reqs;
    uint8_t *state;
    uint64_t *times; /* NULL, or per instruction when issued and when done (PYCOLL_TRACE_INSTRUCTIONS) */
    const uint8_t *mark; /* NULL, or the mark every message but the exchange's carries (exec.h) */
    uint8_t *marks;      /* per receive: where its message's mark lands (PC_MARK_BYTES each) */
    ucp_dt_iov_t *iovs;  /* per instruction: the two parts (mark, slice) of a marked message */
    int64_t got;         /* a receive that failed with PC_ST_MARK: the payload bytes that came */
} pc_exec_t;

#endif
