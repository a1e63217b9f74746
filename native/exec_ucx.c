/* The program executor over UCX (pycoll.tl.ucx.executor; appended to ucx.c in pycoll._ucx).
 *
 * Runs one rank's lowered program (pycoll.lower.program): instructions in order, each started
 * once the instructions it depends on are done; sends and receives are UCP tag messages on the
 * wire tag of the collective (base | sender << 32 | step), receives posted into their slice;
 * reductions call the kernel pointer handed in (pycoll._native's pycoll_reduce); copies are
 * memmove; a check (the agreement check's comparison, between its exchange and the collective's
 * first instructions) compares the fingerprints the exchange gathered. AVG divisions are left to
 * Python (pc_exec_progress returns PC_EXEC_PYTHON with e->next on the instruction; pc_exec_did
 * marks it done). Everything an instruction names was
 * checked when the program was loaded (slices inside their buffers, dependencies earlier ones);
 * the executor checks the peer and kind again before touching memory.
 */
#include <sched.h>
#include <time.h>

#include "exec_util.h"
#include "exec_ucx.h"

static char *pc_exec_at(pc_exec_t *e, const pc_instr_t *in, int k)
{
    return e->bufs[in->buf[k]] + in->off[k];
}

static int pc_exec_fail(pc_exec_t *e, int i, int status)
{
    e->failed = i;
    e->status = status;
    return PC_EXEC_FAILED;
}

/* Whether instruction i's messages carry the call's mark (exec.h): all but the exchange's. */
static int pc_exec_marked(const pc_exec_t *e, const pc_instr_t *in)
{
    return e->mark != NULL && !(in->flags & PC_F_AGREE);
}

/* A receive i that ended with status st and length bytes: 0 if its message is the one expected
 * (its mark, where marked, and its length), else the failure (PC_EXEC_FAILED). */
static int pc_exec_received(pc_exec_t *e, int i, ucs_status_t st, size_t length)
{
    const pc_instr_t *in = &e->ins[i];
    if (!pc_exec_marked(e, in)) {
        if (st != UCS_OK)
            return pc_exec_fail(e, i, st);
        if (length != in->len[0]) /* a short message: the slice would be left part unwritten */
            return pc_exec_fail(e, i, UCS_ERR_MESSAGE_TRUNCATED);
        return 0;
    }
    if (st == UCS_ERR_MESSAGE_TRUNCATED) { /* longer than mark and slice: not this call's */
        e->got = -1;
        return pc_exec_fail(e, i, PC_ST_MARK);
    }
    if (st != UCS_OK)
        return pc_exec_fail(e, i, st);
    e->got = (int64_t)length - PC_MARK_BYTES;
    if (length != in->len[0] + PC_MARK_BYTES || memcmp(e->marks + (size_t)PC_MARK_BYTES * i, e->mark,
                                                       PC_MARK_BYTES) != 0)
        return pc_exec_fail(e, i, PC_ST_MARK);
    return 0;
}

/* Start (or reset for a new call) with base tag base: nothing posted, nothing done. */
static void pc_exec_start(pc_exec_t *e, uint64_t base)
{
    e->base = base;
    e->next = e->lo = 0;
    e->failed = -1;
    e->status = 0;
    memset(e->state, 0, (size_t)e->n);
    memset(e->reqs, 0, sizeof(void *) * (size_t)e->n);
    if (e->times)
        memset(e->times, 0, sizeof(uint64_t) * 2 * (size_t)e->n);
}

/* Mark instruction i (an AVG that Python ran) done and move past it. */
static void pc_exec_did(pc_exec_t *e, int i)
{
    PC_MARK(e, i, 0);
    PC_MARK(e, i, 1);
    e->state[i] = PC_S_DONE;
    if (e->next == i)
        e->next = i + 1;
}

/* Test the posted requests; fail on a request error or a peer whose endpoint failed. */
static int pc_exec_test(pc_exec_t *e)
{
    for (int i = e->lo; i < e->next; i++) {
        if (e->state[i] != PC_S_POSTED)
            continue;
        const pc_instr_t *in = &e->ins[i];
        if (e->errflags[in->peer])
            return pc_exec_fail(e, i, e->errflags[in->peer]);
        ucs_status_t st = ucp_request_check_status(e->reqs[i]);
        if (st == UCS_INPROGRESS)
            continue;
        ucp_tag_recv_info_t info;
        info.length = in->len[0] + (pc_exec_marked(e, in) ? PC_MARK_BYTES : 0);
        if (in->kind == PC_I_RECV && st == UCS_OK)
            ucp_tag_recv_request_test(e->reqs[i], &info);
        ucp_request_free(e->reqs[i]);
        e->reqs[i] = NULL;
        e->state[i] = PC_S_WAITING; /* (freed: never tested again, failed or not) */
        if (in->kind == PC_I_RECV) {
            if (pc_exec_received(e, i, st, info.length))
                return PC_EXEC_FAILED;
        } else if (st != UCS_OK) {
            return pc_exec_fail(e, i, st);
        }
        PC_MARK(e, i, 1);
        e->state[i] = PC_S_DONE;
    }
    while (e->lo < e->n && e->state[e->lo] == PC_S_DONE)
        e->lo++;
    return PC_EXEC_RUNNING;
}

/* Advance: progress the worker, test what is posted, start what may start. PC_EXEC_DONE,
 * PC_EXEC_RUNNING, PC_EXEC_PYTHON (an AVG at e->next) or PC_EXEC_FAILED (e->failed, e->status). */
static int pc_exec_progress(pc_exec_t *e)
{
    ucp_request_param_t param;
    if (e->failed >= 0) /* a failed run stays failed: its requests are aborted, not tested */
        return PC_EXEC_FAILED;
    ucp_worker_progress(e->worker);
    if (pc_exec_test(e) != PC_EXEC_RUNNING)
        return PC_EXEC_FAILED;
    while (e->next < e->n) {
        int i = e->next;
        const pc_instr_t *in = &e->ins[i];
        if (!pc_deps_done(e->state, e->deps, in))
            return PC_EXEC_RUNNING;
        if (in->kind != PC_I_AVG) /* (an AVG is Python's: pc_exec_did marks it) */
            PC_MARK(e, i, 0);
        if (in->kind == PC_I_SEND || in->kind == PC_I_RECV) {
            if (in->peer < 0 || in->peer >= e->size || in->peer == e->rank)
                return pc_exec_fail(e, i, UCS_ERR_INVALID_PARAM);
            if (e->errflags[in->peer])
                return pc_exec_fail(e, i, e->errflags[in->peer]);
            ucp_tag_recv_info_t info;
            ucs_status_ptr_t p;
            uint64_t base = (in->flags & PC_F_AGREE) ? e->base | e->agree : e->base;
            int marked = pc_exec_marked(e, in);
            /* a marked message is the mark then the slice, as one message (two parts: an IOV) */
            const void *data = pc_exec_at(e, in, 0);
            size_t count = in->len[0];
            if (marked) {
                ucp_dt_iov_t *iov = e->iovs + 2 * (size_t)i;
                iov[0].buffer = in->kind == PC_I_SEND ? (void *)e->mark : e->marks + (size_t)PC_MARK_BYTES * i;
                iov[0].length = PC_MARK_BYTES;
                iov[1].buffer = (void *)data;
                iov[1].length = in->len[0];
                data = iov;
                count = 2;
            }
            info.length = in->len[0] + (marked ? PC_MARK_BYTES : 0);
            if (in->kind == PC_I_SEND) {
                param.op_attr_mask = marked ? UCP_OP_ATTR_FIELD_DATATYPE : 0;
                param.datatype = ucp_dt_make_iov();
                p = ucp_tag_send_nbx(e->eps[in->peer], data, count,
                                     base | ((uint64_t)e->rank << 32) | (uint64_t)(in->step & 0xfff), &param);
            } else {
                param.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO | (marked ? UCP_OP_ATTR_FIELD_DATATYPE : 0);
                param.recv_info.tag_info = &info;
                param.datatype = ucp_dt_make_iov();
                p = ucp_tag_recv_nbx(e->worker, (void *)data, count,
                                     base | ((uint64_t)in->peer << 32) | (uint64_t)(in->step & 0xfff),
                                     UINT64_MAX, &param);
            }
            if (UCS_PTR_IS_ERR(p)) {
                if (in->kind == PC_I_RECV && marked && UCS_PTR_STATUS(p) == UCS_ERR_MESSAGE_TRUNCATED) {
                    e->got = -1;
                    return pc_exec_fail(e, i, PC_ST_MARK);
                }
                return pc_exec_fail(e, i, UCS_PTR_STATUS(p));
            }
            if (p == NULL) {
                if (in->kind == PC_I_RECV && pc_exec_received(e, i, UCS_OK, info.length))
                    return PC_EXEC_FAILED;
                PC_MARK(e, i, 1);
                e->state[i] = PC_S_DONE;
            } else {
                e->reqs[i] = p;
                e->state[i] = PC_S_POSTED;
            }
        } else if (in->kind == PC_I_REDUCE) {
            int rc = e->reduce(in->op, in->dtype, pc_exec_at(e, in, 2), pc_exec_at(e, in, 0),
                               pc_exec_at(e, in, 1), in->count);
            if (rc)
                return pc_exec_fail(e, i, UCS_ERR_INVALID_PARAM);
            PC_MARK(e, i, 1);
            e->state[i] = PC_S_DONE;
        } else if (in->kind == PC_I_COPY) {
            memmove(pc_exec_at(e, in, 1), pc_exec_at(e, in, 0), in->len[0]);
            PC_MARK(e, i, 1);
            e->state[i] = PC_S_DONE;
        } else if (in->kind == PC_I_CHECK) {
            if (!pc_exec_agree((const uint64_t *)pc_exec_at(e, in, 0), e->size))
                return pc_exec_fail(e, i, PC_ST_MISMATCH);
            PC_MARK(e, i, 1);
            e->state[i] = PC_S_DONE;
        } else if (in->kind == PC_I_AVG) {
            return PC_EXEC_PYTHON;
        } else {
            return pc_exec_fail(e, i, UCS_ERR_INVALID_PARAM);
        }
        e->next = i + 1;
    }
    if (pc_exec_test(e) != PC_EXEC_RUNNING)
        return PC_EXEC_FAILED;
    return e->lo == e->n ? PC_EXEC_DONE : PC_EXEC_RUNNING;
}

/* Start with base tag base and advance until done or spin_ns pass (checked every 16 polls), in
 * one call: a collective run again on the same buffers by the engine's express lane
 * (pycoll.engine.express.ProgramLane), which spares Python a pass per poll while a peer's message
 * is on its way. A time, not a count of polls: a poll of UCP over TCP costs system calls (about
 * a microsecond), one over shared memory a tenth of that. The result of the last
 * pc_exec_progress: PC_EXEC_RUNNING when the time ran out (the engine goes on polling). With
 * yield_every, it gives the core away every that many polls. */
static int pc_exec_run(pc_exec_t *e, uint64_t base, int64_t spin_ns, int yield_every)
{
    struct timespec t0, t;
    int rc, n = 0;
    pc_exec_start(e, base);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((rc = pc_exec_progress(e)) == PC_EXEC_RUNNING) {
        n++;
        if (yield_every && n % yield_every == 0)
            sched_yield(); /* ranks outnumber the cores: the peer may be waiting for this one */
        if (n % 16 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) >= spin_ns)
                break;
        }
    }
    return rc;
}

/* Run the program iters times in a row on base tag base, each run to its end, with no Python
 * between runs: the round trip of a ping-pong program through the executor alone
 * (benchmarks/ucx_roundtrip.py). PC_EXEC_DONE, or the result of a run that did not finish. */
static int pc_exec_repeat(pc_exec_t *e, uint64_t base, int iters)
{
    for (int i = 0; i < iters; i++) {
        int rc;
        pc_exec_start(e, base);
        while ((rc = pc_exec_progress(e)) == PC_EXEC_RUNNING)
            ;
        if (rc != PC_EXEC_DONE)
            return rc;
    }
    return PC_EXEC_DONE;
}

/* Give up: cancel the posted receives. The requests stay until pc_exec_reap finds them finished
 * (UCX may still read or write their buffers until then). */
static void pc_exec_abort(pc_exec_t *e)
{
    for (int i = 0; i < e->next && i < e->n; i++)
        if (e->state[i] == PC_S_POSTED && e->reqs[i] != NULL && e->ins[i].kind == PC_I_RECV)
            ucp_request_cancel(e->worker, e->reqs[i]);
}

/* Free the posted requests that finished (after pc_exec_abort); the number still running. */
static int pc_exec_reap(pc_exec_t *e)
{
    int running = 0;
    ucp_worker_progress(e->worker);
    for (int i = 0; i < e->next && i < e->n; i++) {
        if (e->state[i] != PC_S_POSTED || e->reqs[i] == NULL)
            continue;
        if (ucp_request_check_status(e->reqs[i]) == UCS_INPROGRESS) {
            running++;
            continue;
        }
        ucp_request_free(e->reqs[i]);
        e->reqs[i] = NULL;
        e->state[i] = PC_S_WAITING;
    }
    return running;
}
