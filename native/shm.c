/* The shared-memory segment of a node-local team and the collectives that run on it.
 *
 * Layout (all offsets from the start of the mapping, recomputed from nranks and slot_bytes and
 * compared with the header on every check, so a corrupted header is an error, never a wild
 * access):
 *
 *   0            pc_shm_header_t (one page)
 *   ctrl_off     nranks control blocks: generation flags on their own cache lines, pid
 *   slots_off    2 x nranks slots of slot_bytes (double buffered by generation parity)
 *   result_off   2 result areas of slot_bytes
 *
 * A collective is cut into chunks of at most slot_bytes. Chunk generations count up over all
 * collectives of the segment; a rank publishes "my slot holds generation g" (arrive) and "my part
 * of the result of generation g is written" (reduced) with release stores, and peers read them
 * with acquire loads (C11 atomics).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/uio.h>

#include "pycoll_native.h"

#define PAGE 4096ULL
static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t pycoll_shm_layout(uint32_t nranks, uint64_t slot_bytes, pc_shm_header_t *h) {
    memset(h, 0, sizeof *h);
    if (nranks < 1 || nranks > PC_SHM_MAX_RANKS || slot_bytes == 0 || slot_bytes % PC_LINE) return 0;
    h->magic = PC_SHM_MAGIC;
    h->version = PC_SHM_VERSION;
    h->nranks = nranks;
    h->slot_bytes = slot_bytes;
    h->ctrl_off = PAGE;
    h->slots_off = round_up(h->ctrl_off + (uint64_t)nranks * PC_CTRL_BYTES, PAGE);
    h->result_off = h->slots_off + 2ULL * nranks * slot_bytes;
    h->p2p_off = round_up(h->result_off + 2ULL * slot_bytes, PAGE);
    h->total_bytes = round_up(h->p2p_off + (uint64_t)nranks * nranks * PC_RING * sizeof(pc_desc_t), PAGE);
    return h->total_bytes;
}

int pycoll_shm_init(void *base, uint64_t total, const pc_shm_header_t *layout) {
    if (layout->total_bytes > total) return PC_ERANGE;
    memset((char *)base + layout->ctrl_off, 0, (uint64_t)layout->nranks * PC_CTRL_BYTES);
    memcpy(base, layout, sizeof *layout);
    atomic_thread_fence(memory_order_release);
    return PC_OK;
}

int pycoll_shm_check(const void *base, uint64_t mapped, uint32_t nranks) {
    pc_shm_header_t h, want;
    memcpy(&h, base, sizeof h);
    if (h.magic != PC_SHM_MAGIC || h.version != PC_SHM_VERSION || h.nranks != nranks) return PC_EHEADER;
    if (!pycoll_shm_layout(h.nranks, h.slot_bytes, &want)) return PC_EHEADER;
    if (h.ctrl_off != want.ctrl_off || h.slots_off != want.slots_off || h.result_off != want.result_off ||
        h.p2p_off != want.p2p_off || h.total_bytes != want.total_bytes)
        return PC_EHEADER;
    if (h.total_bytes > mapped) return PC_ERANGE;
    return PC_OK;
}

static pc_shm_ctrl_t *ctrl(void *base, uint32_t r) {
    const pc_shm_header_t *h = base;
    return (pc_shm_ctrl_t *)((char *)base + h->ctrl_off + (uint64_t)r * PC_CTRL_BYTES);
}

void pycoll_shm_attach(void *base, uint32_t rank, uint64_t pid) {
    pc_shm_ctrl_t *c = ctrl(base, rank);
    c->pid = pid;
    atomic_store_explicit((_Atomic uint64_t *)&c->attached, 1, memory_order_release);
}

uint64_t pycoll_shm_load(const void *base, uint32_t rank, int which) {
    pc_shm_ctrl_t *c = ctrl((void *)base, rank);
    if (which == 3) return c->pid;
    uint64_t *p = which == 0 ? &c->arrive : which == 1 ? &c->reduced : &c->attached;
    return atomic_load_explicit((_Atomic uint64_t *)p, memory_order_acquire);
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void publish(uint64_t *flag, uint64_t gen) {
    atomic_store_explicit((_Atomic uint64_t *)flag, gen, memory_order_release);
}

/* Wait (up to max_polls polls) until every rank's flag (0 arrive, 1 reduced) reaches gen, or only
 * rank `only` if only >= 0. Returns 1 ready, 0 not yet, PC_ESTATE if a flag is impossible.
 *
 * How far ahead can a peer be? A rank writes its slot of generation g only once every reduced
 * flag is at g - 2, so with this rank's reduced flag at r (<= c->gen) nobody writes beyond
 * r + 2, and nobody finishes a generation beyond r + 2 (it needs data of that generation, or the
 * slot of a reduce's non-root). A barrier publishes its flags on entry: r + 3 at most. */
static int wait_flags(pc_shm_coll_t *c, int which, uint64_t gen, int only, uint64_t max_polls) {
    uint64_t polls = 0;
    for (;;) {
        int ready = 1;
        for (uint32_t r = 0; r < c->nranks; r++) {
            if (only >= 0 && r != (uint32_t)only) continue;
            pc_shm_ctrl_t *b = ctrl(c->base, r);
            uint64_t v = atomic_load_explicit((_Atomic uint64_t *)(which ? &b->reduced : &b->arrive),
                                              memory_order_acquire);
            if (v > c->gen + 3) return PC_ESTATE; /* see below: nobody gets further ahead */
            if (v < gen) { ready = 0; break; }
        }
        if (ready) return 1;
        c->spins++;
        if (++polls >= max_polls) return 0;
        relax();
    }
}

/* Before this rank writes its slot of generation c->gen: every rank is done with the same slot's
 * previous use (generation gen - 2). Free when they are (one pass over the flags). */
static int slot_free(pc_shm_coll_t *c, uint64_t max_polls) {
    return c->gen > 2 ? wait_flags(c, 1, c->gen - 2, -1, max_polls) : 1;
}

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* elements of a block of cnt elements in chunk k of per elements */
static uint64_t piece(uint64_t cnt, uint64_t k, uint64_t per) {
    if (k >= cnt / per + 1) return 0; /* also guards k * per against overflow */
    uint64_t lo = k * per;
    return lo >= cnt ? 0 : min64(cnt - lo, per);
}

/* reduce_scatter: elements of each block in one chunk (block b's piece lies at b * that in every
 * slot); whole cache lines when a slot is big enough */
static uint64_t rs_per(uint64_t slot_bytes, uint32_t nranks, size_t es) {
    uint64_t bytes = slot_bytes / nranks;
    if (bytes >= PC_LINE) bytes -= bytes % PC_LINE;
    return bytes / es;
}

/* The layout of a block collective: every block inside the whole buffer, this rank's block the
 * size of its own buffer. */
static int check_layout(const pc_shm_coll_t *c, size_t es) {
    if (!c->layout) return PC_EINVAL;
    uint64_t whole = c->coll == PC_COLL_ALLGATHER ? c->count : c->src_count;
    uint64_t mine = c->coll == PC_COLL_ALLGATHER ? c->src_count : c->count;
    if (whole > UINT64_MAX / es || mine > UINT64_MAX / es) return PC_EINVAL;
    for (uint32_t r = 0; r < c->nranks; r++) {
        uint64_t off = c->layout[2 * r], cnt = c->layout[2 * r + 1];
        if (cnt > whole || off > whole - cnt) return PC_ERANGE;
    }
    return c->layout[2 * c->rank + 1] == mine ? PC_OK : PC_EINVAL;
}

static uint64_t max_block(const pc_shm_coll_t *c) {
    uint64_t most = 0;
    for (uint32_t r = 0; r < c->nranks; r++) most = c->layout[2 * r + 1] > most ? c->layout[2 * r + 1] : most;
    return most;
}

/* reduce: up to this many ranks the root reduces every chunk alone (it reads n chunks, nothing
 * else moves twice); more ranks share the reduction of each chunk as the allreduce does */
#define PC_REDUCE_AT_ROOT 4

static int rooted(int coll) { return coll == PC_COLL_BCAST || coll == PC_COLL_REDUCE; }
static int blocks(int coll) { return coll == PC_COLL_ALLGATHER || coll == PC_COLL_REDUCE_SCATTER; }

uint64_t pycoll_shm_chunks(const pc_shm_coll_t *c) {
    const pc_shm_header_t *h = c->base;
    size_t es = pycoll_dtype_size(c->dtype);
    if (c->coll == PC_COLL_BARRIER) return 1;
    if (!es || h->slot_bytes < es || c->nranks < 1 || c->nranks > PC_SHM_MAX_RANKS || c->rank >= c->nranks)
        return 0;
    uint64_t per = h->slot_bytes / es, n = c->count;
    if (blocks(c->coll)) {
        if (check_layout(c, es)) return 0; /* pycoll_shm_progress() says why */
        if (c->coll == PC_COLL_REDUCE_SCATTER) per = rs_per(h->slot_bytes, c->nranks, es);
        if (!per) return 0;
        n = max_block(c);
    }
    return n / per + (n % per != 0);
}

int pycoll_shm_progress(pc_shm_coll_t *c, uint64_t max_polls) {
    int rc = pycoll_shm_check(c->base, c->mapped, c->nranks);
    if (rc) return rc;
    if (c->rank >= c->nranks || c->coll < 0 || c->coll >= PC_NCOLLS ||
        (rooted(c->coll) && (c->root < 0 || (uint32_t)c->root >= c->nranks)))
        return PC_EINVAL;
    const pc_shm_header_t *h = c->base;
    char *base = c->base;
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    if (c->coll == PC_COLL_BARRIER) {
        if (c->phase == 0) {
            publish(&me->arrive, c->gen);
            publish(&me->reduced, c->gen); /* reads no slot: done with this generation */
            c->phase = 1;
        }
        rc = wait_flags(c, 0, c->gen, -1, max_polls);
        if (rc <= 0) return rc;
        c->chunk = c->nchunks = 1;
        c->gen++;
        return 1;
    }
    size_t es = pycoll_dtype_size(c->dtype);
    if (!es || h->slot_bytes < es) return PC_EINVAL;
    uint64_t per = h->slot_bytes / es;
    if (blocks(c->coll)) {
        rc = check_layout(c, es);
        if (rc) return rc;
        if (c->coll == PC_COLL_REDUCE_SCATTER) per = rs_per(h->slot_bytes, c->nranks, es);
        if (!per) return PC_EINVAL; /* slots too small for a piece of every block */
    }
    if (c->nchunks != pycoll_shm_chunks(c)) return PC_EINVAL; /* the state was not set up */
    const void *ins[PC_SHM_MAX_RANKS];
    while (c->chunk < c->nchunks) {
        uint64_t off = c->chunk * per;
        uint64_t m = blocks(c->coll) ? 0 : c->count - off < per ? c->count - off : per;
        uint64_t parity = c->gen & 1;
        char *slots = base + h->slots_off + parity * c->nranks * h->slot_bytes;
        char *mine = slots + (uint64_t)c->rank * h->slot_bytes;
        char *result = base + h->result_off + parity * h->slot_bytes;
        if (c->coll == PC_COLL_REDUCE && c->nranks <= PC_REDUCE_AT_ROOT) {
            /* the others copy their chunk into their slot and are done with it; the root reduces
             * the slots and its own input, in rank order, straight into dst */
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                if ((int)c->rank != c->root || c->src == c->dst) /* in place: dst is an input */
                    memcpy(mine, c->src + off * es, m * es);
                if ((int)c->rank != c->root) {
                    publish(&me->arrive, c->gen);
                    publish(&me->reduced, c->gen); /* reads no slot */
                }
                c->phase = 1;
            }
            if ((int)c->rank == c->root) {
                for (uint32_t r = 0; r < c->nranks; r++) {
                    if ((int)r == c->root) continue;
                    rc = wait_flags(c, 0, c->gen, (int)r, max_polls);
                    if (rc <= 0) return rc;
                }
                for (uint32_t r = 0; r < c->nranks; r++) ins[r] = slots + r * h->slot_bytes;
                if (c->src != c->dst) ins[c->rank] = c->src + off * es;
                rc = pycoll_reduce_n(c->op, c->dtype, c->dst + off * es, ins, (int)c->nranks, m);
                if (rc) return rc;
                publish(&me->arrive, c->gen);
                publish(&me->reduced, c->gen);
            }
        } else if (c->coll == PC_COLL_ALLREDUCE || c->coll == PC_COLL_REDUCE) {
            /* this rank reduces [lo, hi) of the chunk: the peers read the rest of its slot, it
             * reads its own part from src */
            uint64_t lo = m * c->rank / c->nranks, hi = m * (c->rank + 1) / c->nranks;
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                memcpy(mine, c->src + off * es, lo * es);
                memcpy(mine + hi * es, c->src + (off + hi) * es, (m - hi) * es);
                publish(&me->arrive, c->gen);
                c->phase = 1;
            }
            if (c->phase == 1) {
                rc = wait_flags(c, 0, c->gen, -1, max_polls);
                if (rc <= 0) return rc;
                /* this rank's share of the chunk, reduced over the ranks' inputs in rank order */
                if (hi > lo) {
                    for (uint32_t r = 0; r < c->nranks; r++) ins[r] = slots + r * h->slot_bytes + lo * es;
                    ins[c->rank] = c->src + (off + lo) * es;
                    rc = pycoll_reduce_n(c->op, c->dtype, result + lo * es, ins, (int)c->nranks, hi - lo);
                    if (rc) return rc;
                }
                publish(&me->reduced, c->gen);
                c->phase = 2;
            }
            if (c->coll == PC_COLL_ALLREDUCE || (int)c->rank == c->root) {
                rc = wait_flags(c, 1, c->gen, -1, max_polls);
                if (rc <= 0) return rc;
                memcpy(c->dst + off * es, result, m * es);
            }
        } else if (c->coll == PC_COLL_ALLGATHER) {
            /* every rank's piece of its block in its slot; everyone copies the others' out */
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                uint64_t mm = piece(c->src_count, c->chunk, per);
                const char *from = mm ? c->src + off * es : NULL;
                if (mm) memcpy(mine, from, mm * es);
                publish(&me->arrive, c->gen);
                if (mm) { /* its own block while the peers copy theirs; in place: already there */
                    char *to = c->dst + (c->layout[2 * c->rank] + off) * es;
                    if (to != from) memmove(to, from, mm * es);
                }
                c->phase = 1;
            }
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            for (uint32_t r = 0; r < c->nranks; r++) {
                uint64_t mr = piece(c->layout[2 * r + 1], c->chunk, per);
                if (r != c->rank && mr)
                    memcpy(c->dst + (c->layout[2 * r] + off) * es, slots + r * h->slot_bytes, mr * es);
            }
            publish(&me->reduced, c->gen);
        } else if (c->coll == PC_COLL_REDUCE_SCATTER) {
            /* every rank's piece of every block in its slot (block b at b * per); each rank
             * reduces the pieces of its own block in rank order straight into its dst, reading
             * its own piece from src (unless dst overlaps it: then from the slot too) */
            const char *own = c->src + c->layout[2 * c->rank] * es;
            uintptr_t o = (uintptr_t)own, d = (uintptr_t)c->dst, nb = c->count * es;
            int direct = !nb || o + nb <= d || d + nb <= o;
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                for (uint32_t b = 0; b < c->nranks; b++) {
                    uint64_t mb = piece(c->layout[2 * b + 1], c->chunk, per);
                    if (mb && (b != c->rank || !direct))
                        memcpy(mine + b * per * es, c->src + (c->layout[2 * b] + off) * es, mb * es);
                }
                publish(&me->arrive, c->gen);
                c->phase = 1;
            }
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            uint64_t mm = piece(c->count, c->chunk, per);
            if (mm) {
                for (uint32_t r = 0; r < c->nranks; r++)
                    ins[r] = slots + r * h->slot_bytes + (uint64_t)c->rank * per * es;
                if (direct) ins[c->rank] = own + off * es;
                rc = pycoll_reduce_n(c->op, c->dtype, c->dst + off * es, ins, (int)c->nranks, mm);
                if (rc) return rc;
            }
            publish(&me->reduced, c->gen);
        } else { /* bcast: the root's slot carries the chunk */
            char *slot = slots + (uint64_t)c->root * h->slot_bytes;
            if ((int)c->rank == c->root) {
                if (c->phase == 0) {
                    rc = slot_free(c, max_polls); /* the readers of generation gen-2 (same slot) */
                    if (rc <= 0) return rc;
                    memcpy(slot, c->dst + off * es, m * es);
                    publish(&me->arrive, c->gen);
                    publish(&me->reduced, c->gen);
                    c->phase = 1;
                }
            } else {
                rc = wait_flags(c, 0, c->gen, c->root, max_polls);
                if (rc <= 0) return rc;
                memcpy(c->dst + off * es, slot, m * es);
                publish(&me->arrive, c->gen);
                publish(&me->reduced, c->gen);
            }
            if (c->chunk + 1 == c->nchunks && (int)c->rank == c->root) {
                /* the root returns (and may reuse its slot) once every rank has its copy */
                rc = wait_flags(c, 1, c->gen, -1, max_polls);
                if (rc <= 0) return rc;
            }
        }
        c->chunk++;
        c->gen++;
        c->phase = 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ point to point */
static pc_desc_t *desc(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                       int *rc) {
    *rc = pycoll_shm_check(base, mapped, nranks);
    if (*rc) return NULL;
    if (src >= nranks || dst >= nranks || slot >= PC_RING) {
        *rc = PC_EINVAL;
        return NULL;
    }
    const pc_shm_header_t *h = base;
    return (pc_desc_t *)((char *)base + h->p2p_off) + ((uint64_t)src * nranks + dst) * PC_RING + slot;
}

int pycoll_p2p_post(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                    uint64_t khash, uint64_t step, uint64_t nbytes, uint64_t addr, uint64_t seq) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    if (atomic_load_explicit((_Atomic uint64_t *)&d->state, memory_order_acquire) != PC_DESC_FREE) return 0;
    d->khash = khash;
    d->step = step;
    d->nbytes = nbytes;
    d->addr = addr;
    d->seq = seq;
    atomic_store_explicit((_Atomic uint64_t *)&d->state, PC_DESC_POSTED, memory_order_release);
    return 1;
}

int pycoll_p2p_state(const void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst,
                     uint32_t slot) {
    int rc;
    pc_desc_t *d = desc((void *)base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    uint64_t s = atomic_load_explicit((_Atomic uint64_t *)&d->state, memory_order_acquire);
    return s > PC_DESC_CONSUMED ? PC_ESTATE : (int)s;
}

int pycoll_p2p_free(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    atomic_store_explicit((_Atomic uint64_t *)&d->state, PC_DESC_FREE, memory_order_release);
    return PC_OK;
}

int pycoll_p2p_take(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                    uint64_t *out) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    uint64_t s = atomic_load_explicit((_Atomic uint64_t *)&d->state, memory_order_acquire);
    if (s != PC_DESC_POSTED) return s > PC_DESC_CONSUMED ? PC_ESTATE : 0;
    out[0] = d->khash;
    out[1] = d->step;
    out[2] = d->nbytes;
    out[3] = d->addr;
    out[4] = d->seq;
    return 1;
}

int pycoll_p2p_consumed(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    atomic_store_explicit((_Atomic uint64_t *)&d->state, PC_DESC_CONSUMED, memory_order_release);
    return PC_OK;
}

int64_t pycoll_cma_read(int64_t pid, void *local, uint64_t remote, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
        struct iovec l = {(char *)local + done, n - done};
        struct iovec r = {(void *)(uintptr_t)(remote + done), n - done};
        ssize_t got = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
        if (got < 0) return -errno;
        if (got == 0) return -EFAULT;
        done += (uint64_t)got;
    }
    return (int64_t)done;
}
