/* The program executor over shared memory (pycoll.tl.shm.executor): a lowered program run on the
 * one-host single-copy point-to-point path of pycoll.tl.shm.transport, with no Python per step.
 *
 * Instructions run in order, each once the instructions it depends on are done. A send posts a
 * descriptor (key hash, step, size, address of its slice) in the next slot of the ring to its peer
 * and is done when the peer marks it consumed (the slot is then freed). A receive is matched to
 * the descriptors its peer posts, in ring order: the executor reads the head of the ring from each
 * peer it receives from while that head is a message of its own collective (its key hash, or its
 * agreement exchange's), copies the payload straight out of the sender's memory
 * (process_vm_readv) into the receive's slice if the receive was issued, else into a buffer of its
 * own that the receive copies from when it is issued, and marks it consumed. A head of another
 * collective is left for the transport (ShmTransport._read), which leaves this collective's to
 * the executor: each side takes the heads that are its own, so neither waits on the other for
 * good. The send and receive cursors are the transport's own arrays. Reductions are pycoll's
 * kernels; an AVG division is left to Python (PC_EXEC_PYTHON), as over UCX.
 *
 * Nothing in a descriptor is trusted: its size must be the receive's slice's, its state one of
 * the three, and the memory it names is read from the process that attached as that rank.
 *
 * Marks (exec.h): where e->mark is set, every send but the agreement exchange's posts its
 * descriptor with e->mark, and every such receive compares the mark of the message it matched
 * with e->mark as the message is taken (from the ring, or from the transport's stash through
 * pc_sx_early_marked), copying it into e->marks + PC_MARK_BYTES * i. A message that carries
 * another mark, none, or another length is refused: none of its payload is read (its descriptor
 * is marked consumed, so its sender's send completes), and its receive fails with PC_ST_MARK
 * (e->got: the length that came) when it is issued, at once if it was. (So a program that came
 * late to a peer's message still sends what it sends before that receive, and the peer finds
 * the mismatch itself, as it would had the message come after the receive.) This is the wire of
 * ShmTransport.isend_marked and irecv_marked: a rank running the collective natively and one
 * running it in Python check each other.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec_util.h"
#include "exec_shm.h"
#include "pycoll_native.h"

static char *sx_at(pc_sx_t *e, const pc_instr_t *in, int k)
{
    return e->bufs[in->buf[k]] + in->off[k];
}

static int sx_fail(pc_sx_t *e, int i, int status, int detail)
{
    e->failed = i;
    e->status = status;
    e->detail = detail;
    return PC_EXEC_FAILED;
}

/* e->matched[i] of a receive whose message was refused before it was issued (early[i]: its length,
 * an int64_t) */
#define SX_REFUSED 2

/* Free the messages read before their receives were issued. */
static void sx_drop_early(pc_sx_t *e)
{
    for (int i = 0; i < e->n; i++) {
        if (e->early[i]) {
            free(e->early[i]);
            e->early[i] = NULL;
        }
    }
}

/* Start (or reset for a new call) on key hashes khash and agree: nothing posted, nothing done. */
void pc_sx_start(pc_sx_t *e, uint64_t khash, uint64_t agree)
{
    e->khash = khash;
    e->agree = agree;
    e->next = e->lo = 0;
    e->failed = e->stalled = -1;
    e->status = e->detail = 0;
    e->got = 0;
    sx_drop_early(e);
    memset(e->state, 0, (size_t)e->n);
    memset(e->matched, 0, (size_t)e->n);
    if (e->times)
        memset(e->times, 0, sizeof(uint64_t) * 2 * (size_t)e->n);
}

/* Mark instruction i (an AVG that Python ran) done and move past it. */
void pc_sx_did(pc_sx_t *e, int i)
{
    PC_MARK(e, i, 0);
    PC_MARK(e, i, 1);
    e->state[i] = PC_S_DONE;
    if (e->next == i)
        e->next = i + 1;
}

/* The first receive not yet matched from src with this step (and agree flag); -1 if none. */
static int sx_match(const pc_sx_t *e, int src, uint64_t step, int agree)
{
    for (int i = e->lo; i < e->n; i++) {
        const pc_instr_t *in = &e->ins[i];
        if (in->kind == PC_I_RECV && in->peer == src && !e->matched[i] && (uint64_t)in->step == step &&
            ((in->flags & PC_F_AGREE) != 0) == agree)
            return i;
    }
    return -1;
}

/* Whether receive i may take the message it matched (of nbytes, carrying mark; NULL: none): always
 * where e->mark is unset or i is of the agreement exchange; else only if the message carries
 * e->mark and is the receive's length. The mark is copied into e->marks (for Python to describe
 * a failure). */
static int sx_marked(pc_sx_t *e, int i, uint64_t nbytes, const uint8_t *mark)
{
    if (!e->mark || (e->ins[i].flags & PC_F_AGREE))
        return 1;
    if (e->marks) {
        uint8_t *at = e->marks + (size_t)PC_MARK_BYTES * (size_t)i;
        if (mark)
            memcpy(at, mark, PC_MARK_BYTES);
        else
            memset(at, 0, PC_MARK_BYTES);
    }
    return mark && nbytes == e->ins[i].len[0] && !memcmp(mark, e->mark, PC_MARK_BYTES);
}

/* Receive i's message (of nbytes) was refused (sx_marked): fail i now if it was issued
 * (PC_EXEC_FAILED), else keep the length for when it is (0; PC_EXEC_FAILED when out of memory). */
static int sx_refuse(pc_sx_t *e, int i, uint64_t nbytes)
{
    int64_t got = nbytes > (uint64_t)INT64_MAX ? -1 : (int64_t)nbytes;
    e->matched[i] = SX_REFUSED;
    if (e->state[i] == PC_S_POSTED) {
        e->got = got;
        return sx_fail(e, i, PC_ST_MARK, 0);
    }
    int64_t *kept = malloc(sizeof *kept);
    if (!kept)
        return sx_fail(e, i, PC_SX_NOMEM, 0);
    *kept = got;
    e->early[i] = (char *)kept;
    return 0;
}

/* Take the messages of this collective at the head of the ring from src; stop at another's. */
static int sx_read(pc_sx_t *e, int src)
{
    uint64_t d[6];
    uint8_t mark[PC_MARK_BYTES];
    for (;;) {
        uint32_t slot = e->recv_slot[src];
        int rc = pycoll_p2p_take(e->base, e->mapped, (uint32_t)e->size, (uint32_t)src, (uint32_t)e->rank, slot, d,
                                 mark);
        if (rc == 0)
            return PC_EXEC_RUNNING;
        if (rc < 0)
            return sx_fail(e, e->lo, PC_SX_SEGMENT, rc);
        int agree;
        if (d[0] == e->khash)
            agree = 0;
        else if (d[0] == e->agree)
            agree = 1;
        else
            return PC_EXEC_RUNNING; /* another collective's: the transport takes it */
        int i = sx_match(e, src, d[1], agree);
        if (i < 0)
            return sx_fail(e, e->lo, PC_SX_UNEXPECTED, src);
        if (!sx_marked(e, i, d[2], (d[5] & PC_DESC_MARKED) ? mark : NULL)) {
            /* (none of its payload is read; consumed, so that its sender's send completes) */
            rc = pycoll_p2p_consumed(e->base, e->mapped, (uint32_t)e->size, (uint32_t)src, (uint32_t)e->rank, slot);
            if (rc)
                return sx_fail(e, i, PC_SX_SEGMENT, rc);
            e->recv_slot[src] = (slot + 1) % PC_RING;
            if (sx_refuse(e, i, d[2]))
                return PC_EXEC_FAILED;
            continue;
        }
        uint64_t len = e->ins[i].len[0];
        if (d[2] != len)
            return sx_fail(e, i, PC_SX_TRUNC, 0);
        char *to;
        if (e->state[i] == PC_S_POSTED) {
            to = sx_at(e, &e->ins[i], 0);
        } else {
            to = e->early[i] = malloc(len ? len : 1);
            if (!to)
                return sx_fail(e, i, PC_SX_NOMEM, 0);
        }
        if (len) {
            int64_t got = pycoll_p2p_read(e->base, e->mapped, (uint32_t)e->size, (uint32_t)src, (uint32_t)e->rank,
                                          slot, e->pids[src], to, d[3], len);
            if (got == PC_ECMA) { /* (leave it at the head: Python decides whether the sender left) */
                if (e->early[i]) {
                    free(e->early[i]);
                    e->early[i] = NULL;
                }
                e->stalled = i;
                e->detail = errno;
                return PC_EXEC_RUNNING;
            }
            if (got != (int64_t)len)
                return sx_fail(e, i, PC_SX_SEGMENT, (int)got);
        }
        rc = pycoll_p2p_consumed(e->base, e->mapped, (uint32_t)e->size, (uint32_t)src, (uint32_t)e->rank, slot);
        if (rc)
            return sx_fail(e, i, PC_SX_SEGMENT, rc);
        e->recv_slot[src] = (slot + 1) % PC_RING;
        e->matched[i] = 1;
        if (e->state[i] == PC_S_POSTED) {
            PC_MARK(e, i, 1);
            e->state[i] = PC_S_DONE;
        }
    }
}

/* Test the posted instructions (a send's descriptor consumed: free it; a receive's peer lost). */
static int sx_test(pc_sx_t *e)
{
    for (int i = e->lo; i < e->next; i++) {
        if (e->state[i] != PC_S_POSTED)
            continue;
        const pc_instr_t *in = &e->ins[i];
        if (in->kind == PC_I_SEND) {
            int st = pycoll_p2p_state(e->base, e->mapped, (uint32_t)e->size, (uint32_t)e->rank, (uint32_t)in->peer,
                                      e->slot[i]);
            if (st < 0)
                return sx_fail(e, i, PC_SX_SEGMENT, st);
            if (st == PC_DESC_CONSUMED) {
                pycoll_p2p_free(e->base, e->mapped, (uint32_t)e->size, (uint32_t)e->rank, (uint32_t)in->peer,
                                e->slot[i]);
                PC_MARK(e, i, 1);
                e->state[i] = PC_S_DONE;
                continue;
            }
        }
        if (e->errflags[in->peer])
            return sx_fail(e, i, PC_SX_LOST, e->errflags[in->peer]);
    }
    while (e->lo < e->n && e->state[e->lo] == PC_S_DONE)
        e->lo++;
    return PC_EXEC_RUNNING;
}

/* Issue instruction i (its dependencies are done): PC_EXEC_RUNNING when it was (or, a send to a
 * full ring, when it must wait: e->next stays on it), else PC_EXEC_PYTHON or PC_EXEC_FAILED. */
static int sx_issue(pc_sx_t *e, int i)
{
    const pc_instr_t *in = &e->ins[i];
    switch (in->kind) {
    case PC_I_SEND: {
        if (in->peer < 0 || in->peer >= e->size || in->peer == e->rank)
            return sx_fail(e, i, PC_SX_INVALID, in->peer);
        if (e->errflags[in->peer])
            return sx_fail(e, i, PC_SX_LOST, e->errflags[in->peer]);
        uint32_t slot = e->send_slot[in->peer];
        int agree = (in->flags & PC_F_AGREE) != 0;
        int rc = pycoll_p2p_post(e->base, e->mapped, (uint32_t)e->size, (uint32_t)e->rank, (uint32_t)in->peer, slot,
                                 agree ? e->agree : e->khash, (uint64_t)in->step, in->len[0],
                                 (uint64_t)(uintptr_t)sx_at(e, in, 0), 0, agree ? NULL : e->mark);
        if (rc < 0)
            return sx_fail(e, i, PC_SX_SEGMENT, rc);
        if (rc == 0)
            return PC_EXEC_RUNNING; /* the ring is full: try again at the next poll */
        e->slot[i] = slot;
        e->send_slot[in->peer] = (slot + 1) % PC_RING;
        PC_MARK(e, i, 0);
        e->state[i] = PC_S_POSTED;
        break;
    }
    case PC_I_RECV:
        if (in->peer < 0 || in->peer >= e->size || in->peer == e->rank)
            return sx_fail(e, i, PC_SX_INVALID, in->peer);
        PC_MARK(e, i, 0);
        if (e->matched[i] == SX_REFUSED) { /* its message was refused before it was issued */
            e->got = *(const int64_t *)e->early[i];
            free(e->early[i]);
            e->early[i] = NULL;
            return sx_fail(e, i, PC_ST_MARK, 0);
        }
        if (e->matched[i]) { /* read before it was issued */
            memcpy(sx_at(e, in, 0), e->early[i], in->len[0]);
            free(e->early[i]);
            e->early[i] = NULL;
            PC_MARK(e, i, 1);
            e->state[i] = PC_S_DONE;
        } else {
            if (e->errflags[in->peer])
                return sx_fail(e, i, PC_SX_LOST, e->errflags[in->peer]);
            e->state[i] = PC_S_POSTED;
        }
        break;
    case PC_I_REDUCE:
        PC_MARK(e, i, 0);
        if (pycoll_reduce(in->op, in->dtype, sx_at(e, in, 2), sx_at(e, in, 0), sx_at(e, in, 1), in->count))
            return sx_fail(e, i, PC_SX_INVALID, in->kind);
        PC_MARK(e, i, 1);
        e->state[i] = PC_S_DONE;
        break;
    case PC_I_COPY:
        PC_MARK(e, i, 0);
        memmove(sx_at(e, in, 1), sx_at(e, in, 0), in->len[0]);
        PC_MARK(e, i, 1);
        e->state[i] = PC_S_DONE;
        break;
    case PC_I_CHECK:
        PC_MARK(e, i, 0);
        if (!pc_exec_agree((const uint64_t *)sx_at(e, in, 0), e->size))
            return sx_fail(e, i, PC_ST_MISMATCH, 0);
        PC_MARK(e, i, 1);
        e->state[i] = PC_S_DONE;
        break;
    case PC_I_AVG:
        return PC_EXEC_PYTHON;
    default:
        return sx_fail(e, i, PC_SX_INVALID, in->kind);
    }
    e->next = i + 1;
    return PC_EXEC_RUNNING;
}

/* Issue the instructions that may start, in order, until one must wait. */
static int sx_issue_ready(pc_sx_t *e)
{
    while (e->next < e->n) {
        int i = e->next;
        if (!pc_deps_done(e->state, e->deps, &e->ins[i]))
            return PC_EXEC_RUNNING;
        int rc = sx_issue(e, i);
        if (rc != PC_EXEC_RUNNING)
            return rc;
        if (e->next == i)
            return PC_EXEC_RUNNING; /* a send waiting for a free slot */
    }
    return PC_EXEC_RUNNING;
}

/* Advance: issue what may start (so that a receive is posted before its message is read: read
 * first, it would be copied twice), read what the peers posted, test what is posted, issue again.
 * PC_EXEC_DONE, PC_EXEC_RUNNING, PC_EXEC_PYTHON (an AVG at e->next) or PC_EXEC_FAILED
 * (e->failed, e->status, e->detail). */
int pc_sx_progress(pc_sx_t *e)
{
    if (e->failed >= 0) /* (a message handed in by pc_sx_early that no receive expects, or Python's) */
        return PC_EXEC_FAILED;
    e->stalled = -1;
    int rc = sx_issue_ready(e);
    if (rc != PC_EXEC_RUNNING)
        return rc;
    for (int k = 0; k < e->nrpeers; k++)
        if (sx_read(e, e->rpeers[k]) != PC_EXEC_RUNNING)
            return PC_EXEC_FAILED;
    if (sx_test(e) != PC_EXEC_RUNNING)
        return PC_EXEC_FAILED;
    rc = sx_issue_ready(e);
    if (rc != PC_EXEC_RUNNING)
        return rc;
    if (sx_test(e) != PC_EXEC_RUNNING)
        return PC_EXEC_FAILED;
    return e->lo == e->n ? PC_EXEC_DONE : PC_EXEC_RUNNING;
}

/* Advance until done or spin_ns pass (checked every 16 polls), in one call: the engine's express
 * lane (pycoll.engine.express.ProgramLane) runs a started program so, as pc_exec_run over UCX.
 * With yield_every, give the core away every that many polls. */
int pc_sx_run(pc_sx_t *e, int64_t spin_ns, int yield_every)
{
    struct timespec t0, t;
    int rc, n = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((rc = pc_sx_progress(e)) == PC_EXEC_RUNNING) {
        n++;
        if (yield_every && n % yield_every == 0)
            sched_yield(); /* ranks outnumber the cores: the peer may be waiting for this one */
        else
            pc_relax();
        if (n % 16 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) >= spin_ns)
                break;
        }
    }
    return rc;
}

/* Hand the executor a message of its collective that the transport took before the program
 * started (from src; agree: of the agreement exchange; mark: the mark it carried, NULL: none):
 * kept for the first receive not yet matched that expects it (refused, where e->mark is set and
 * it carries another mark, none or another length: that receive fails when it is issued). 0, or
 * PC_EXEC_FAILED when no receive expects it, or it has another length (e->status says which). */
int pc_sx_early_marked(pc_sx_t *e, int32_t src, int agree, uint64_t step, const void *data, uint64_t nbytes,
                       const uint8_t *mark)
{
    int i = sx_match(e, src, step, agree);
    if (i < 0)
        return sx_fail(e, e->lo, PC_SX_UNEXPECTED, src);
    if (!sx_marked(e, i, nbytes, mark))
        return sx_refuse(e, i, nbytes);
    if (nbytes != e->ins[i].len[0])
        return sx_fail(e, i, PC_SX_TRUNC, 0);
    char *to = e->early[i] = malloc(nbytes ? nbytes : 1);
    if (!to)
        return sx_fail(e, i, PC_SX_NOMEM, 0);
    memcpy(to, data, nbytes);
    e->matched[i] = 1;
    if (e->state[i] == PC_S_POSTED) { /* (issued already: it is done now) */
        memcpy(sx_at(e, &e->ins[i], 0), to, nbytes);
        free(to);
        e->early[i] = NULL;
        PC_MARK(e, i, 1);
        e->state[i] = PC_S_DONE;
    }
    return 0;
}

/* pc_sx_early_marked of a message that carried no mark. */
int pc_sx_early(pc_sx_t *e, int32_t src, int agree, uint64_t step, const void *data, uint64_t nbytes)
{
    return pc_sx_early_marked(e, src, agree, step, data, nbytes, NULL);
}

/* After a failure or a cancel: free the messages kept for receives and the slots of sends that
 * were consumed; the number of sends still posted (their peer may yet read the buffers they name,
 * so the caller keeps those alive until this returns 0). */
int pc_sx_reap(pc_sx_t *e)
{
    int posted = 0;
    sx_drop_early(e);
    for (int i = 0; i < e->next && i < e->n; i++) {
        const pc_instr_t *in = &e->ins[i];
        if (e->state[i] != PC_S_POSTED)
            continue;
        if (in->kind != PC_I_SEND) {
            e->state[i] = PC_S_WAITING;
            continue;
        }
        int st = pycoll_p2p_state(e->base, e->mapped, (uint32_t)e->size, (uint32_t)e->rank, (uint32_t)in->peer,
                                  e->slot[i]);
        /* (errflags 2: another peer was lost; this one lives and may still read the buffer) */
        if (st == PC_DESC_CONSUMED || st < 0 || e->errflags[in->peer] == 1) {
            if (st == PC_DESC_CONSUMED)
                pycoll_p2p_free(e->base, e->mapped, (uint32_t)e->size, (uint32_t)e->rank, (uint32_t)in->peer,
                                e->slot[i]);
            e->state[i] = PC_S_WAITING;
        } else {
            posted++;
        }
    }
    return posted;
}
