/* The shared-memory segment of a node-local team and the collectives that run on it.
 *
 * Waiting: a rank that finds a flag not ready spins a little (in pycoll_shm_progress), and then
 * the engine may put it to sleep in the kernel on that flag (pycoll_shm_sleep: a futex on the
 * flag's low 32 bits, which change with every generation); the rank that publishes a flag wakes
 * the sleepers it finds counted next to it. So ranks that outnumber the cores, or share them with
 * other work, give the core up while they wait and come back as soon as the peer is there.
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
#include <sched.h>
#include <stddef.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "pycoll_native.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define PAGE 4096ULL
/* the smallest chunk of a pipelined bcast (see geometry) */
#define PC_PIPE_MIN (32ULL << 10)
/* the chunks of one-writer collectives rotate through this many places in each slot (area_stride) */
#define PC_AREAS 4
_Static_assert(sizeof(pc_shm_ctrl_t) == PC_CTRL_BYTES, "a control block is PC_CTRL_BYTES");
_Static_assert(offsetof(pc_shm_ctrl_t, reduced) == PC_LINE, "arrive and inline data fill one line");
_Static_assert(sizeof(pc_desc_t) == 2 * PC_LINE, "a descriptor is two lines");
_Static_assert(offsetof(pc_desc_t, addr) + PC_DESC_INLINE == PC_LINE, "an inline payload fills the first line");
_Static_assert(offsetof(pc_desc_t, mark) + PC_DESC_MARK == 2 * PC_LINE, "the mark ends the second line");
_Static_assert(PC_DESC_MARK == PC_MARK_BYTES, "a descriptor's mark is a program's");
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
    uint64_t *p = which == 0 ? &c->arrive : which == 1 ? &c->reduced : which == 4 ? &c->left :
                  which == 5 ? &c->owed[0] : &c->attached;
    return atomic_load_explicit((_Atomic uint64_t *)p, memory_order_acquire);
}

static uint32_t *low_word(uint64_t *flag) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)flag + 1;
#else
    return (uint32_t *)flag;
#endif
}

/* Set a flag to gen (release) and wake whoever sleeps on it. The store and the load of the
 * sleeper count are sequentially consistent, as are the sleeper's increment and re-check in
 * pycoll_shm_sleep: either the sleeper sees the new value or the waker sees the sleeper. */
static void publish(uint64_t *flag, uint32_t *sleepers, uint64_t gen) {
    atomic_store_explicit((_Atomic uint64_t *)flag, gen, memory_order_seq_cst);
    if (atomic_load_explicit((_Atomic uint32_t *)sleepers, memory_order_seq_cst))
        syscall(SYS_futex, low_word(flag), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void arrive(pc_shm_ctrl_t *me, uint64_t gen) { publish(&me->arrive, &me->arrive_sleepers, gen); }
static void reduced(pc_shm_ctrl_t *me, uint64_t gen) { publish(&me->reduced, &me->reduced_sleepers, gen); }

void pycoll_shm_leave(void *base, uint32_t rank, uint64_t how, const char *why) {
    pc_shm_ctrl_t *me = ctrl(base, rank);
    uint64_t was = atomic_load_explicit((_Atomic uint64_t *)&me->left, memory_order_acquire);
    /* the first word stays, except that a revoke replaces a failure (the rank is still there and
     * asks its peers to give up the team: they raise RevokedError rather than PeerLostError) */
    if (was && !(was == PC_LEFT_FAILED && how == PC_LEFT_REVOKED)) return;
    size_t n = why ? strnlen(why, PC_LEFT_WHY - 1) : 0;
    memcpy(me->left_why, why ? why : "", n);
    me->left_why[n] = 0;
    atomic_store_explicit((_Atomic uint64_t *)&me->left, how ? how : PC_LEFT_EXITED, memory_order_seq_cst);
    /* whoever sleeps on this rank's flags: wake up and look (the flags do not change) */
    if (atomic_load_explicit((_Atomic uint32_t *)&me->arrive_sleepers, memory_order_seq_cst))
        syscall(SYS_futex, low_word(&me->arrive), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    if (atomic_load_explicit((_Atomic uint32_t *)&me->reduced_sleepers, memory_order_seq_cst))
        syscall(SYS_futex, low_word(&me->reduced), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

uint64_t pycoll_shm_left(const void *base, uint32_t rank, char *out) {
    const pc_shm_ctrl_t *c = ctrl((void *)base, rank);
    uint64_t how = atomic_load_explicit((_Atomic uint64_t *)&c->left, memory_order_acquire);
    memcpy(out, c->left_why, PC_LEFT_WHY);
    out[PC_LEFT_WHY - 1] = 0; /* whatever the peer wrote there */
    return how;
}

int pycoll_shm_sleep(pc_shm_coll_t *c, uint64_t timeout_ns) {
    int rc = pycoll_shm_check(c->base, c->mapped, c->nranks);
    if (rc) return rc;
    if (c->wait_rank >= c->nranks) return 1; /* waits for nothing: go on */
    pc_shm_ctrl_t *b = ctrl(c->base, c->wait_rank);
    uint64_t *flag = c->wait_which ? &b->reduced : &b->arrive;
    uint32_t *sleepers = c->wait_which ? &b->reduced_sleepers : &b->arrive_sleepers;
    atomic_fetch_add_explicit((_Atomic uint32_t *)sleepers, 1, memory_order_seq_cst);
    uint64_t v = atomic_load_explicit((_Atomic uint64_t *)flag, memory_order_seq_cst);
    if (v < c->wait_gen) {
        struct timespec ts = {(time_t)(timeout_ns / 1000000000ULL), (long)(timeout_ns % 1000000000ULL)};
        syscall(SYS_futex, low_word(flag), FUTEX_WAIT, (uint32_t)v, &ts, NULL, 0); /* woken, timed out,
                                                    changed already (EAGAIN) or a signal: look again */
        v = atomic_load_explicit((_Atomic uint64_t *)flag, memory_order_acquire);
    }
    atomic_fetch_sub_explicit((_Atomic uint32_t *)sleepers, 1, memory_order_seq_cst);
    return v >= c->wait_gen;
}

/* One poll found what it waits for not ready: count it, and give the core a moment (or away, every
 * yield_every polls). 0 once max_polls polls are spent: return to the engine. */
static int pause_poll(pc_shm_coll_t *c, uint64_t *polls, uint64_t max_polls) {
    c->spins++;
    if (++*polls >= max_polls) return 0;
    if (c->yield_every && *polls % c->yield_every == 0)
        sched_yield();
    else
        pc_relax();
    return 1;
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
            if (v < gen) {
                ready = 0;
                c->wait_rank = r;
                c->wait_which = which;
                c->wait_gen = gen;
                break;
            }
        }
        if (ready) {
            c->wait_rank = UINT32_MAX;
            return 1;
        }
        if (!pause_poll(c, &polls, max_polls)) return 0;
    }
}

/* Before this rank writes its slot of generation c->gen: every rank is done with the same slot's
 * previous use (generation gen - 2). Free when they are (one pass over the flags). */
static int slot_free(pc_shm_coll_t *c, uint64_t max_polls) {
    return c->gen > 2 ? wait_flags(c, 1, c->gen - 2, -1, max_polls) : 1;
}

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* A large collective's output goes to memory with non-temporal stores, not through this core's
 * cache: it would not stay there anyway, and a plain store first reads each destination line (a
 * third of the memory traffic of a large allreduce). Measured on 2 ranks (2-core VM): allreduce
 * 128 MiB 37 -> 26-30 ms, 64 MiB 16.8 -> 13.2-13.4 ms, 32 MiB 7.7 -> 6.2-6.4 ms; bcast 64 MiB
 * 7.6 -> 6.0 ms; gather 64 MiB 8.0 -> 6.0 ms; 16 MiB allreduce 2.78 -> 2.67 ms. Below 16 MiB the
 * output still fits the caches and plain stores are as fast or faster (4 MiB: 0.64 vs 0.66 ms). */
#define PC_STREAM_MIN (16ULL << 20)

/* memcpy with non-temporal stores on x86-64 (plain memcpy elsewhere), fenced before it returns so
 * that a flag published afterwards orders after them; it also asks for the next n_next bytes at
 * next, a line per line it writes, into this core's L2: a rank that alternates reading its next
 * inputs and writing its last result keeps reads in flight while its stores drain, where one at a
 * time leaves the memory idle half the time */
static void stream_copy_ahead(void *dst, const void *src, uint64_t n, const char *next, uint64_t n_next) {
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    uint64_t head = (16 - ((uintptr_t)d & 15)) & 15, ahead = 0;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64, ahead += 64) {
        if (ahead < n_next) __builtin_prefetch(next + ahead, 0, 2);
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
    _mm_sfence();
#else
    (void)next, (void)n_next;
    memcpy(dst, src, n);
#endif
}

/* memcpy with non-temporal stores, fenced (stream_copy_ahead with nothing to ask for) */
static void stream_copy(void *dst, const void *src, uint64_t n) { stream_copy_ahead(dst, src, n, NULL, 0); }

/* Copy part of a collective's output out of the segment: streamed when the whole output is large. */
static void copy_out(const pc_shm_coll_t *c, size_t es, void *dst, const void *src, uint64_t n) {
    if (c->count * es >= PC_STREAM_MIN)
        stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

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

/* Every block of a layout inside a buffer of whole elements (of es bytes). */
static int check_blocks(const uint64_t *layout, uint32_t n, uint64_t whole, size_t es) {
    if (!layout) return PC_EINVAL;
    if (whole > UINT64_MAX / es) return PC_EINVAL;
    for (uint32_t r = 0; r < n; r++) {
        uint64_t off = layout[2 * r], cnt = layout[2 * r + 1];
        if (cnt > whole || off > whole - cnt) return PC_ERANGE;
    }
    return PC_OK;
}

static uint64_t max_block(const uint64_t *layout, uint32_t n) {
    uint64_t most = 0;
    for (uint32_t r = 0; r < n; r++) most = layout[2 * r + 1] > most ? layout[2 * r + 1] : most;
    return most;
}

/* reduce: up to this many ranks the root reduces every chunk alone (it reads n chunks, nothing
 * else moves twice); more ranks share the reduction of each chunk as the allreduce does */
#define PC_REDUCE_AT_ROOT 4
/* the most chunks a rank may say a collective needs (a larger number is a corrupted segment) */
#define PC_MAX_CHUNKS (1ULL << 40)

static int rooted(int coll) {
    return coll == PC_COLL_BCAST || coll == PC_COLL_REDUCE || coll == PC_COLL_GATHER || coll == PC_COLL_SCATTER ||
           coll == PC_COLL_BCAST_CMA || coll == PC_COLL_GATHER_CMA || coll == PC_COLL_SCATTER_CMA;
}
static int single_copy(int coll) { return coll >= PC_COLL_BCAST_CMA && coll <= PC_COLL_ALLTOALL_CMA; }
static int blocks(int coll) {
    return coll == PC_COLL_ALLGATHER || coll == PC_COLL_REDUCE_SCATTER || coll == PC_COLL_GATHER ||
           coll == PC_COLL_SCATTER || coll == PC_COLL_ALLTOALL;
}
/* collectives whose ranks need not know every block: they agree on the number of chunks at the
 * first one (ctrl info) */
static int agreed(int coll) { return coll == PC_COLL_GATHER || coll == PC_COLL_SCATTER || coll == PC_COLL_ALLTOALL; }
/* collectives whose slots carry a header of nranks block sizes (scatter, alltoall: the readers
 * check the size of what they read against what they expect) */
static uint64_t header_bytes(const pc_shm_coll_t *c) {
    return c->coll == PC_COLL_SCATTER || c->coll == PC_COLL_ALLTOALL
               ? round_up((uint64_t)c->nranks * sizeof(uint64_t), PC_LINE) : 0;
}

/* Bcast, gather, scatter and alltoall move each chunk from writers to readers in one copy each
 * way: if a writer reused the same addresses every other generation it would take back, line by
 * line, what the readers just read (measured on 2 ranks: a 64 KiB bcast 7.7 us, 4.9 us once its
 * chunks rotate through four places in the slot). Generation gen's chunk starts at
 * ((gen / 2) % PC_AREAS) * stride in each slot. A place may overlap the next one (a writer starts
 * gen only once every reader of gen - 2 is done, so any place is safe to reuse): the stride is a
 * little under a quarter of the slot so that a chunk holds a quarter of the slot plus a header
 * (a power-of-two block and the scatter's sizes fit in one chunk). Returns the stride (0: this
 * collective does not rotate, or its slots are too small to). */
static uint64_t area_stride(const pc_shm_coll_t *c, size_t es) {
    const pc_shm_header_t *h = c->base;
    if (c->coll != PC_COLL_BCAST && c->coll != PC_COLL_GATHER && c->coll != PC_COLL_SCATTER &&
        c->coll != PC_COLL_ALLTOALL)
        return 0;
    uint64_t stride = h->slot_bytes / PC_AREAS / 16 * 15;
    stride -= stride % PC_LINE;
    uint64_t room = h->slot_bytes - (PC_AREAS - 1) * stride, hdr = header_bytes(c);
    if (!stride || room < hdr + es) return 0;
    if ((c->coll == PC_COLL_SCATTER || c->coll == PC_COLL_ALLTOALL) && !rs_per(room - hdr, c->nranks, es)) return 0;
    return stride;
}

/* The bytes of a slot a chunk may fill (see area_stride). */
static uint64_t chunk_room(const pc_shm_coll_t *c, size_t es) {
    const pc_shm_header_t *h = c->base;
    return h->slot_bytes - (PC_AREAS - 1) * area_stride(c, es);
}

/* Where generation gen's chunk starts in each slot (0 for collectives that do not rotate). */
uint64_t pycoll_shm_area(const pc_shm_coll_t *c, uint64_t gen) {
    size_t es = pycoll_dtype_size(c->dtype);
    return es ? ((gen >> 1) % PC_AREAS) * area_stride(c, es) : 0;
}

/* How collective c is cut into chunks: *per elements of each block (or of the buffer) per chunk,
 * and *need chunks for what this rank knows of the blocks (agreed collectives: at least one).
 * Checks the layouts against the buffers. */
static int geometry(const pc_shm_coll_t *c, size_t es, uint64_t *per, uint64_t *need) {
    const pc_shm_header_t *h = c->base;
    uint64_t hdr = header_bytes(c);
    if (!es || h->slot_bytes < hdr + es) return PC_EINVAL;
    uint64_t room = chunk_room(c, es) - hdr, n = c->count;
    int me_root = (int)c->rank == c->root;
    int rc = PC_OK;
    *per = room / es;
    switch (c->coll) {
    case PC_COLL_ALLGATHER: /* blocks of dst, mine the size of src */
        rc = check_blocks(c->layout, c->nranks, c->count, es);
        if (!rc && c->layout[2 * c->rank + 1] != c->src_count) rc = PC_EINVAL;
        if (!rc) n = max_block(c->layout, c->nranks);
        break;
    case PC_COLL_REDUCE_SCATTER: /* blocks of src, mine the size of dst; a piece of each per slot */
    case PC_COLL_SCATTER:
    case PC_COLL_ALLTOALL:
        *per = rs_per(room, c->nranks, es);
        if (c->coll == PC_COLL_SCATTER && !me_root) { /* only the root knows the blocks */
            n = c->count;
            break;
        }
        rc = check_blocks(c->layout, c->nranks, c->src_count, es);
        if (rc) break;
        n = max_block(c->layout, c->nranks);
        if (c->coll == PC_COLL_ALLTOALL) {
            rc = check_blocks(c->rlayout, c->nranks, c->count, es);
            if (!rc && c->rlayout[2 * c->rank + 1] != c->layout[2 * c->rank + 1]) rc = PC_EINVAL;
            if (!rc && max_block(c->rlayout, c->nranks) > n) n = max_block(c->rlayout, c->nranks);
        } else if (c->layout[2 * (c->coll == PC_COLL_SCATTER ? c->root : (int)c->rank) + 1] != c->count) {
            rc = PC_EINVAL;
        }
        break;
    case PC_COLL_GATHER: /* the root: blocks of dst; every rank: its block is src */
        n = c->src_count;
        if (!me_root) break;
        rc = check_blocks(c->layout, c->nranks, c->count, es);
        if (!rc && c->layout[2 * c->root + 1] != c->src_count) rc = PC_EINVAL;
        if (!rc) n = max_block(c->layout, c->nranks);
        break;
    default:
        break;
    }
    if (rc) return rc;
    if (c->coll == PC_COLL_BCAST) {
        /* one writer, readers that copy out what it copied in: chunks of a quarter of the
         * message (at least PC_PIPE_MIN), so they copy side by side (the root fills the next slot
         * while the readers empty this one). Measured: the gather and scatter forms gain nothing
         * from it (their ranks would have to agree on a size only the root knows). */
        uint64_t cap = n * es / 4 > PC_PIPE_MIN ? n * es / 4 : PC_PIPE_MIN;
        if (cap / es < *per) *per = cap / es ? cap / es : 1;
    }
    if (!*per) return PC_EINVAL; /* slots too small for a piece of every block */
    *need = n / *per + (n % *per != 0);
    if (agreed(c->coll) && !*need) *need = 1;
    return PC_OK;
}

uint64_t pycoll_shm_chunks(const pc_shm_coll_t *c) {
    if (c->coll == PC_COLL_BARRIER || single_copy(c->coll) || c->coll == PC_COLL_ALLREDUCE_MAPPED ||
        c->coll == PC_COLL_ALLREDUCE_CMA)
        return 1;
    if (c->nranks < 1 || c->nranks > PC_SHM_MAX_RANKS || c->rank >= c->nranks ||
        pycoll_shm_check(c->base, c->mapped, c->nranks))
        return 0;
    uint64_t per, need;
    return geometry(c, pycoll_dtype_size(c->dtype), &per, &need) ? 0 : need; /* progress() says why */
}

/* The number of chunks every rank agrees on, once the ranks in `from` (-1: all) have published
 * the first generation: the largest any of them needs. */
static int agree(pc_shm_coll_t *c, int from, uint64_t gen0) {
    uint64_t most = c->nchunks;
    for (uint32_t r = 0; r < c->nranks; r++) {
        if (from >= 0 && r != (uint32_t)from) continue;
        uint64_t want = atomic_load_explicit((_Atomic uint64_t *)&ctrl(c->base, r)->info[gen0 & 1][0],
                                             memory_order_relaxed);
        if (want > PC_MAX_CHUNKS) return PC_ESTATE;
        if (from >= 0 && want < c->nchunks) return PC_EDISAGREE; /* the root's blocks are not ours */
        if (want > most) most = want;
    }
    c->nchunks = most;
    return PC_OK;
}

static void tell(pc_shm_ctrl_t *me, uint64_t gen0, uint64_t chunks, uint64_t count) {
    me->info[gen0 & 1][0] = chunks;
    me->info[gen0 & 1][1] = count;
}

/* A small allreduce or reduce (bcast, scan, exscan: on two ranks) of nbytes <= PC_INLINE: the data
 * travels inline next to the arrive flag, eagerly, one copy each way and one flag per rank.
 *
 * A writer (every rank; bcast: the root) first waits until every rank has read what its line
 * held before (every reduced flag at gen - 1: readers publish reduced once they have read a
 * generation), writes data and header, and publishes arrive. A reader waits for the writers'
 * arrive flags, checks each header (the generation, and the size it expects: else the ranks
 * disagree on the count, or the segment is corrupted), reduces every rank's data in rank order
 * (so every rank gets bitwise the same result) or copies the root's, and publishes reduced. Nobody
 * waits for the readers in the collective itself: the next write waits (usually for nothing).
 * A bcast's root, though, then waits for every rank to have read its last, where its slot (two
 * generations apart) would not make it wait, and so does every rank of a scan: on more than two
 * ranks they take the slots (2-core VM, 8 B, bcast 4 ranks 6.3 -> 4.0-6.2 us, 8 ranks 18.8 -> 14.3,
 * 16 ranks 67-80 -> 43; scan 8 ranks 25 -> 19-21, 16 ranks 103 -> 63; 2 ranks: the same), but
 * with nothing to move (count 0: inline, it still signs, so a rank whose count differs fails at
 * once rather than at the root's next call). */
static int prefix(int coll) { return coll == PC_COLL_SCAN || coll == PC_COLL_EXSCAN; }

static int inline_ok(const pc_shm_coll_t *c, size_t es) {
    return (c->coll == PC_COLL_ALLREDUCE || c->coll == PC_COLL_REDUCE ||
            ((c->coll == PC_COLL_BCAST || prefix(c->coll)) && (c->nranks <= 2 || !c->count))) &&
           c->count * es <= PC_INLINE;
}

/* The ranks whose data rank `rank` reduces in a prefix reduction (scan: 0..rank; exscan: 0..rank-1). */
static int prefix_inputs(const pc_shm_coll_t *c) { return (int)c->rank + (c->coll == PC_COLL_SCAN); }

static int inline_header(pc_shm_ctrl_t *b, uint64_t gen, uint64_t nbytes) {
    if (b->inline_gen != gen) return PC_ESTATE;
    if (b->inline_bytes != nbytes) return PC_EDISAGREE;
    return PC_OK;
}

static int inline_small(pc_shm_coll_t *c, size_t es, uint64_t max_polls) {
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    uint64_t nb = c->count * es;
    int root = (int)c->rank == c->root;
    int writes = c->coll != PC_COLL_BCAST || root;
    int reads = c->coll == PC_COLL_ALLREDUCE || (c->coll == PC_COLL_REDUCE && root) ||
                (c->coll == PC_COLL_BCAST && !root) || (prefix(c->coll) && prefix_inputs(c) > 0);
    int rc;
    if (c->phase == 0) {
        if (writes) {
            if (c->gen > 1) {
                rc = wait_flags(c, 1, c->gen - 1, -1, max_polls);
                if (rc <= 0) return rc;
            }
            memcpy(me->inline_data, c->coll == PC_COLL_BCAST ? c->dst : c->src, nb);
            me->inline_bytes = (uint32_t)nb;
            me->inline_gen = c->gen;
        }
        arrive(me, c->gen);
        c->phase = 1;
    }
    if (reads) {
        const void *ins[PC_SHM_MAX_RANKS];
        if (c->coll == PC_COLL_BCAST) {
            rc = wait_flags(c, 0, c->gen, c->root, max_polls);
            if (rc <= 0) return rc;
            pc_shm_ctrl_t *b = ctrl(c->base, (uint32_t)c->root);
            rc = inline_header(b, c->gen, nb);
            if (rc) return rc;
            memcpy(c->dst, b->inline_data, nb);
        } else {
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            for (uint32_t r = 0; r < c->nranks; r++) {
                pc_shm_ctrl_t *b = ctrl(c->base, r);
                rc = inline_header(b, c->gen, nb);
                if (rc) return rc;
                ins[r] = b->inline_data;
            }
            int nin = prefix(c->coll) ? prefix_inputs(c) : (int)c->nranks;
            rc = pycoll_reduce_n(c->op, c->dtype, c->dst, ins, nin, c->count);
            if (rc) return rc;
        }
    }
    reduced(me, c->gen);
    c->chunk = 1;
    c->gen++;
    c->phase = 0;
    return 1;
}

/* Single-copy collectives (PC_COLL_*_CMA), in one generation. The senders write into their slot
 * the address and size of each block a peer reads from them (bcast, gather: one pair; scatter,
 * alltoall: a pair per receiver) and publish arrive; each receiver checks the size it is told
 * against the one it expects (else PC_EDISAGREE: never a short or long read) and reads the block
 * straight out of the sender's memory with process_vm_readv (a wrong address fails the read: it
 * cannot write outside this rank's own buffer), then publishes reduced; a sender returns only once
 * every rank that reads from it has (its buffer may change as soon as it returns). One copy per
 * byte instead of two through the segment, for a system call per block: chosen from a size
 * where that pays (see the selection table). */
static int read_peer(const pc_shm_coll_t *c, uint32_t r, void *dst, uint64_t addr, uint64_t nbytes) {
    if (!nbytes) return PC_OK;
    uint64_t pid = ctrl(c->base, r)->pid;
    if (!pid || pid > INT_MAX) return PC_ESTATE;
    return pycoll_cma_read((int64_t)pid, dst, addr, nbytes) == (int64_t)nbytes ? PC_OK : PC_ECMA;
}

/* rank r's slot of generation gen: its (address, size) pairs */
static uint64_t *pairs(const pc_shm_coll_t *c, uint32_t r) {
    const pc_shm_header_t *h = c->base;
    return (uint64_t *)((char *)c->base + h->slots_off + (c->gen & 1) * c->nranks * h->slot_bytes +
                        (uint64_t)r * h->slot_bytes);
}

/* Small blocks of the single-copy scatter and alltoall travel through the sender's slot, after its
 * pairs: a copy in and a copy out cost less than a system call and the wait for the readers. The
 * pair then holds PC_PAIR_INLINE | the block's offset in the slot (a user-space address never has
 * the top bit set). */
#define PC_PAIR_INLINE (1ULL << 63)
static uint64_t inline_start(const pc_shm_coll_t *c) {
    return round_up(2 * sizeof(uint64_t) * c->nranks, PC_LINE);
}

/* The pair a sender publishes for a block of nbytes at from: the block copied into its slot at
 * *used (while it is small and fits), else its address (and the sender waits for its readers). */
static uint64_t lend_or_copy(pc_shm_coll_t *c, const char *from, uint64_t nbytes, uint64_t *used) {
    const pc_shm_header_t *h = c->base;
    uint64_t at = inline_start(c) + *used;
    if (nbytes && nbytes <= c->inline_max && at <= h->slot_bytes && nbytes <= h->slot_bytes - at) {
        memcpy((char *)pairs(c, c->rank) + at, from, nbytes);
        *used += round_up(nbytes, PC_LINE);
        return PC_PAIR_INLINE | at;
    }
    if (nbytes) c->lent = 1;
    return (uintptr_t)from;
}

/* Read the block that rank r's pair (addr, nbytes) describes: out of r's slot (checked against
 * the slot's bounds) or out of r's memory. */
static int read_block(const pc_shm_coll_t *c, uint32_t r, void *dst, uint64_t addr, uint64_t nbytes) {
    if (!(addr & PC_PAIR_INLINE)) return read_peer(c, r, dst, addr, nbytes);
    const pc_shm_header_t *h = c->base;
    uint64_t at = addr & ~PC_PAIR_INLINE;
    if (at < inline_start(c) || at > h->slot_bytes || nbytes > h->slot_bytes - at) return PC_ESTATE;
    memcpy(dst, (const char *)pairs(c, r) + at, nbytes);
    return PC_OK;
}

static int single_copy_check(const pc_shm_coll_t *c, size_t es) {
    const pc_shm_header_t *h = c->base;
    int me_root = (int)c->rank == c->root, rc = PC_OK;
    if (!es || c->nchunks != 1 || h->slot_bytes < 2 * sizeof(uint64_t) * c->nranks) return PC_EINVAL;
    if (c->count > UINT64_MAX / es || c->src_count > UINT64_MAX / es) return PC_EINVAL;
    if (c->coll == PC_COLL_SCATTER_CMA && me_root) {
        rc = check_blocks(c->layout, c->nranks, c->src_count, es);
        if (!rc && c->layout[2 * c->root + 1] != c->count) rc = PC_EINVAL;
    } else if (c->coll == PC_COLL_GATHER_CMA && me_root) {
        rc = check_blocks(c->layout, c->nranks, c->count, es);
        if (!rc && c->layout[2 * c->root + 1] != c->src_count) rc = PC_EINVAL;
    } else if (c->coll == PC_COLL_ALLTOALL_CMA) {
        rc = check_blocks(c->layout, c->nranks, c->src_count, es);
        if (!rc) rc = check_blocks(c->rlayout, c->nranks, c->count, es);
        if (!rc && c->rlayout[2 * c->rank + 1] != c->layout[2 * c->rank + 1]) rc = PC_EINVAL;
    }
    return rc;
}

static int single_copy_run(pc_shm_coll_t *c, size_t es, uint64_t max_polls) {
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    uint32_t n = c->nranks, rank = c->rank;
    int root = c->root, me_root = (int)rank == root, rc;
    if (c->phase == 0) {
        rc = slot_free(c, max_polls); /* nobody reads this parity's slots of generation gen - 2 */
        if (rc <= 0) return rc;
        uint64_t *mine = pairs(c, rank);
        c->lent = 0;
        if (c->coll == PC_COLL_BCAST_CMA && me_root) {
            mine[0] = (uintptr_t)c->dst, mine[1] = c->count, c->lent = 1;
        } else if (c->coll == PC_COLL_GATHER_CMA && !me_root) {
            mine[0] = (uintptr_t)c->src, mine[1] = c->src_count, c->lent = 1;
        } else if ((c->coll == PC_COLL_SCATTER_CMA && me_root) || c->coll == PC_COLL_ALLTOALL_CMA) {
            uint64_t used = 0;
            for (uint32_t b = 0; b < n; b++) {
                const char *from = c->src + c->layout[2 * b] * es;
                uint64_t cnt = c->layout[2 * b + 1];
                mine[2 * b] = b == rank ? (uintptr_t)from : lend_or_copy(c, from, cnt * es, &used);
                mine[2 * b + 1] = cnt;
            }
        }
        arrive(me, c->gen);
        c->phase = 1;
    }
    if (c->phase == 1) {
        if ((c->coll == PC_COLL_BCAST_CMA || c->coll == PC_COLL_SCATTER_CMA) && !me_root) {
            rc = wait_flags(c, 0, c->gen, root, max_polls);
            if (rc <= 0) return rc;
            const uint64_t *p = pairs(c, (uint32_t)root) + (c->coll == PC_COLL_SCATTER_CMA ? 2 * rank : 0);
            uint64_t addr = p[0], cnt = p[1];
            if (cnt != c->count) return PC_EDISAGREE;
            rc = c->coll == PC_COLL_SCATTER_CMA ? read_block(c, (uint32_t)root, c->dst, addr, cnt * es)
                                                : read_peer(c, (uint32_t)root, c->dst, addr, cnt * es);
            if (rc) return rc;
        } else if (c->coll == PC_COLL_SCATTER_CMA) { /* the root's own block */
            const char *from = c->src + c->layout[2 * rank] * es;
            if (c->count && from != c->dst) memmove(c->dst, from, c->count * es);
        } else if (c->coll == PC_COLL_GATHER_CMA && me_root) {
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            for (uint32_t r = 0; r < n; r++) {
                char *to = c->dst + c->layout[2 * r] * es;
                if ((int)r == root) {
                    if (c->src_count && to != c->src) memmove(to, c->src, c->src_count * es);
                    continue;
                }
                const uint64_t *p = pairs(c, r);
                uint64_t addr = p[0], cnt = p[1];
                if (cnt != c->layout[2 * r + 1]) return PC_EDISAGREE;
                rc = read_peer(c, r, to, addr, cnt * es);
                if (rc) return rc;
            }
        } else if (c->coll == PC_COLL_ALLTOALL_CMA) {
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            for (uint32_t i = 0; i < n; i++) {
                uint32_t r = (rank + i) % n; /* each rank starts with a different peer */
                char *to = c->dst + c->rlayout[2 * r] * es;
                if (r == rank) {
                    const char *from = c->src + c->layout[2 * r] * es;
                    if (c->layout[2 * r + 1] && to != from) memmove(to, from, c->layout[2 * r + 1] * es);
                    continue;
                }
                const uint64_t *p = pairs(c, r) + 2 * rank;
                uint64_t addr = p[0], cnt = p[1];
                if (cnt != c->rlayout[2 * r + 1]) return PC_EDISAGREE;
                rc = read_block(c, r, to, addr, cnt * es);
                if (rc) return rc;
            }
        }
        reduced(me, c->gen);
        c->phase = 2;
    }
    /* a sender stays until every rank that reads its memory has (what went through its slot is
     * safe there until the slot's next use, which waits for the readers: slot_free) */
    if (!c->lent) {
        /* every block it sent went through its slot */
    } else if (((c->coll == PC_COLL_BCAST_CMA || c->coll == PC_COLL_SCATTER_CMA) && me_root) ||
               c->coll == PC_COLL_ALLTOALL_CMA) {
        rc = wait_flags(c, 1, c->gen, -1, max_polls);
        if (rc <= 0) return rc;
    } else if (c->coll == PC_COLL_GATHER_CMA && !me_root) {
        rc = wait_flags(c, 1, c->gen, root, max_polls);
        if (rc <= 0) return rc;
    }
    c->chunk = 1;
    c->gen++;
    c->phase = 0;
    return 1;
}

/* ------------------------------------------------------------------ allreduce in a region
 *
 * The buffers lie in memory every rank maps (a region the team allocated: rank r's part at
 * region + r * region_bytes). Rank i owns 1/n of the elements: it reduces them in rank order
 * straight from every rank's input into a small block that stays in cache, and writes the block
 * into every rank's output. Nothing else moves: per rank one read of its share of every input
 * (M bytes in all) and one write of its share into every output (M bytes), what a copy costs,
 * where the segment's form moves (5 - 1/n) M. Nobody else reads or writes rank i's share of any
 * buffer, so an in-place call is safe without a barrier between reading and writing: one
 * generation carries the offsets (arrive: this rank's input is ready), reduced says this rank has
 * written its share everywhere, and every rank returns once all have. */
#define PC_MAPPED_BLOCK (32u << 10)
/* The pairs end with this mark ^ the generation: a rank never writes into the peers' memory on
 * what a slot held from an earlier collective (a rank of a rooted collective that checked the
 * root's signature alone may have returned while another rank is on this form) */
#define PC_MAPPED_MARK 0x50434D4150504431ULL /* "PCMAPPD1" */
static _Thread_local char mapped_tmp[PC_MAPPED_BLOCK] __attribute__((aligned(64)));

/* this rank's buffers inside its part of their regions, nothing else wrong with the state */
static int mapped_check(const pc_shm_coll_t *c, size_t es) {
    const pc_shm_header_t *h = c->base;
    if (!es || es > PC_MAPPED_BLOCK || c->nchunks != 1 || h->slot_bytes < 5 * sizeof(uint64_t)) return PC_EINVAL;
    uint64_t nb = c->count * es;
    for (int k = 0; k < 2; k++) {
        uint64_t part = c->region_bytes[k];
        if (!c->region[k] || !part || part > UINT64_MAX / c->nranks || c->count > part / es) return PC_EINVAL;
        if (!nb) continue; /* (an empty buffer's address may lie anywhere: nothing is read there) */
        uintptr_t own = (uintptr_t)c->region[k] + (uint64_t)c->rank * part;
        uintptr_t at = (uintptr_t)(k ? c->dst : c->src);
        if (at < own || at - own > part - nb) return PC_ERANGE;
    }
    uintptr_t s = (uintptr_t)c->src, d = (uintptr_t)c->dst;
    if (s != d && nb && s < d + nb && d < s + nb) return PC_EINVAL; /* overlapping, not in place */
    return PC_OK;
}

static int mapped_run(pc_shm_coll_t *c, size_t es, uint64_t max_polls) {
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    uint32_t n = c->nranks, rank = c->rank;
    uint64_t nb = c->count * es;
    int rc;
    if (c->phase == 0) {
        rc = slot_free(c, max_polls); /* nobody reads this parity's slots of generation gen - 2 */
        if (rc <= 0) return rc;
        uint64_t *mine = pairs(c, rank); /* (region id, offset in the part) of src, then of dst */
        for (int k = 0; k < 2; k++) {
            const char *own = c->region[k] + (uint64_t)rank * c->region_bytes[k];
            mine[2 * k] = c->region_id[k];
            mine[2 * k + 1] = nb ? (uint64_t)((k ? (const char *)c->dst : c->src) - own) : 0;
        }
        mine[4] = PC_MAPPED_MARK ^ c->gen;
        arrive(me, c->gen);
        c->phase = 1;
    }
    if (c->phase == 1) {
        rc = wait_flags(c, 0, c->gen, -1, max_polls);
        if (rc <= 0) return rc;
        const char *src[PC_SHM_MAX_RANKS];
        char *dst[PC_SHM_MAX_RANKS];
        for (uint32_t r = 0; r < n; r++) { /* every rank's offsets, checked against its parts */
            const uint64_t *p = pairs(c, r);
            if (p[4] != (PC_MAPPED_MARK ^ c->gen) || p[0] != c->region_id[0] || p[2] != c->region_id[1])
                return PC_EDISAGREE;
            if (p[1] > c->region_bytes[0] - nb || p[3] > c->region_bytes[1] - nb) return PC_ERANGE;
            src[r] = c->region[0] + (uint64_t)r * c->region_bytes[0] + p[1];
            dst[r] = c->region[1] + (uint64_t)r * c->region_bytes[1] + p[3];
        }
        uint64_t lo = c->count * rank / n, hi = c->count * (rank + 1) / n, per = PC_MAPPED_BLOCK / es;
        const void *ins[PC_SHM_MAX_RANKS];
        int streamed = nb >= PC_STREAM_MIN;
        for (uint64_t at = lo; at < hi; at += per) {
            uint64_t m = min64(per, hi - at), next = at + m, m_next = next < hi ? min64(per, hi - next) : 0;
            for (uint32_t r = 0; r < n; r++) ins[r] = src[r] + at * es;
            rc = pycoll_reduce_n(c->op, c->dtype, mapped_tmp, ins, (int)n, m);
            if (rc) return rc;
            for (uint32_t i = 0; i < n; i++) { /* each rank starts with a different peer */
                uint32_t r = (rank + i) % n;
                if (streamed) /* (while writing to r, the next block of r's input comes in) */
                    stream_copy_ahead(dst[r] + at * es, mapped_tmp, m * es, src[r] + next * es, m_next * es);
                else
                    memcpy(dst[r] + at * es, mapped_tmp, m * es);
            }
        }
        reduced(me, c->gen);
        c->phase = 2;
    }
    rc = wait_flags(c, 1, c->gen, -1, max_polls); /* every share written everywhere */
    if (rc <= 0) return rc;
    c->chunk = 1;
    c->gen++;
    c->phase = 0;
    return 1;
}

/* ------------------------------------------------------------------ single-copy allreduce
 *
 * The mapped allreduce's plan on the ranks' own buffers: rank i owns 1/n of the elements and
 * reduces them, a block at a time, in rank order; the peers' blocks of input come in with
 * process_vm_readv (the kernel copies them into a buffer that stays in cache), and the reduced
 * block goes out into every peer's output with process_vm_writev. Per rank M bytes read from
 * memory and M written, as the mapped form, for 2 (n - 1) system calls per block; the segment's
 * form moves (5 - 1/n) M. No rank touches another's share of any buffer, so in place needs no
 * barrier between reading and writing: one generation carries the addresses (arrive: this
 * rank's input is ready), reduced says this rank has written its share everywhere, and every
 * rank returns once all have. Every rank checks the others' mark and buffer size first
 * (PC_CMA_AR_MARK), so ranks that disagree never read or write past a buffer; an address that is
 * not mapped in the peer fails the system call (PC_ECMA). */
#define PC_CMA_TMP_BYTES (2u << 20) /* the blocks of one step, all inputs: kept in cache */
#define PC_CMA_BLOCK_MIN (16u << 10)
#define PC_CMA_BLOCK_MAX (128u << 10)
static _Thread_local char *cma_tmp;
static _Thread_local uint64_t cma_tmp_bytes;

/* the bytes of one input's block for n ranks (a multiple of 64) */
static uint64_t cma_block(uint32_t n) {
    uint64_t b = PC_CMA_TMP_BYTES / (n ? n : 1);
    b = b < PC_CMA_BLOCK_MIN ? PC_CMA_BLOCK_MIN : b > PC_CMA_BLOCK_MAX ? PC_CMA_BLOCK_MAX : b;
    return b & ~(uint64_t)63;
}

/* what a rank publishes besides its addresses: the form's mark and its buffer's bytes, which every
 * reader checks before it reads or writes anything (ranks that disagree on the count or the dtype,
 * or a rank on another form of allreduce whose slot holds data, never lead to an access past a
 * buffer; the kernel checks only that an address is mapped) */
#define PC_CMA_AR_MARK 0x50434341524D4B31ULL /* "PCCARMK1" */

static int cma_allreduce_check(const pc_shm_coll_t *c, size_t es) {
    const pc_shm_header_t *h = c->base;
    if (!es || es > PC_CMA_BLOCK_MIN || c->nchunks != 1 || h->slot_bytes < 4 * sizeof(uint64_t)) return PC_EINVAL;
    if (c->count > UINT64_MAX / es) return PC_EINVAL;
    uint64_t nb = c->count * es;
    uintptr_t s = (uintptr_t)c->src, d = (uintptr_t)c->dst;
    if (s != d && nb && s < d + nb && d < s + nb) return PC_EINVAL; /* overlapping, not in place */
    return PC_OK;
}

static int write_peer(const pc_shm_coll_t *c, uint32_t r, uint64_t addr, const void *from, uint64_t nbytes) {
    if (!nbytes) return PC_OK;
    uint64_t pid = ctrl(c->base, r)->pid;
    if (!pid || pid > INT_MAX) return PC_ESTATE;
    return pycoll_cma_write((int64_t)pid, from, addr, nbytes) == (int64_t)nbytes ? PC_OK : PC_ECMA;
}

static int cma_allreduce_run(pc_shm_coll_t *c, size_t es, uint64_t max_polls) {
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    uint32_t n = c->nranks, rank = c->rank;
    int rc;
    if (c->phase == 0) {
        rc = slot_free(c, max_polls); /* nobody reads this parity's slots of generation gen - 2 */
        if (rc <= 0) return rc;
        uint64_t *mine = pairs(c, rank);
        mine[0] = (uintptr_t)c->src, mine[1] = (uintptr_t)c->dst;
        mine[2] = PC_CMA_AR_MARK ^ c->gen, mine[3] = c->count * es;
        arrive(me, c->gen);
        c->phase = 1;
    }
    if (c->phase == 1) {
        rc = wait_flags(c, 0, c->gen, -1, max_polls);
        if (rc <= 0) return rc;
        for (uint32_t r = 0; r < n; r++) { /* every rank on this form, with buffers of our size */
            const uint64_t *p = pairs(c, r);
            if (p[2] != (PC_CMA_AR_MARK ^ c->gen) || p[3] != c->count * es) return PC_EDISAGREE;
        }
        uint64_t blk = cma_block(n), per = blk / es;
        uint64_t need = (uint64_t)(n + 1) * blk; /* a block of each peer's input, and the result */
        if (cma_tmp_bytes < need) {
            free(cma_tmp);
            cma_tmp = NULL;
            cma_tmp_bytes = 0;
            if (posix_memalign((void **)&cma_tmp, 64, need)) return PC_ENOMEM;
            cma_tmp_bytes = need;
        }
        uint64_t lo = c->count * rank / n, hi = c->count * (rank + 1) / n;
        char *acc = cma_tmp + (uint64_t)n * blk;
        const void *ins[PC_SHM_MAX_RANKS];
        for (uint64_t at = lo; at < hi; at += per) {
            uint64_t m = min64(per, hi - at), off = at * es;
            for (uint32_t i = 1; i < n; i++) { /* each rank starts with a different peer */
                uint32_t r = (rank + i) % n;
                char *to = cma_tmp + (uint64_t)r * blk;
                rc = read_peer(c, r, to, pairs(c, r)[0] + off, m * es);
                if (rc) return rc;
                ins[r] = to;
            }
            ins[rank] = c->src + off;
            rc = pycoll_reduce_n(c->op, c->dtype, acc, ins, (int)n, m);
            if (rc) return rc;
            for (uint32_t i = 1; i < n; i++) {
                uint32_t r = (rank + i) % n;
                rc = write_peer(c, r, pairs(c, r)[1] + off, acc, m * es);
                if (rc) return rc;
            }
            copy_out(c, es, c->dst + off, acc, m * es);
        }
        reduced(me, c->gen);
        c->phase = 2;
    }
    rc = wait_flags(c, 1, c->gen, -1, max_polls); /* every share written everywhere */
    if (rc <= 0) return rc;
    c->chunk = 1;
    c->gen++;
    c->phase = 0;
    return 1;
}

/* ------------------------------------------------------------------ signatures
 *
 * Ranks that call different collectives, or the same one with a different count, dtype, op or
 * root, would otherwise read each other's slots as if they agreed: a wrong result, silently. So
 * each rank signs every collective when it starts it (sign), and a collective is done only once
 * every rank has arrived at its first generation with the same signature (verify); a rank that
 * waits also looks at the signatures there already (scan), so a disagreement that leaves the
 * ranks waiting on each other fails at once instead of timing out. */
#define PC_PHASE_VERIFY 99
/* the op of an averaging collective in its signature (it reduces as PC_SUM) */
#define PC_SIG_AVG 0xfe

static int base_coll(int coll) {
    switch (coll) {
    case PC_COLL_BCAST_CMA: return PC_COLL_BCAST;
    case PC_COLL_GATHER_CMA: return PC_COLL_GATHER;
    case PC_COLL_SCATTER_CMA: return PC_COLL_SCATTER;
    case PC_COLL_ALLTOALL_CMA: return PC_COLL_ALLTOALL;
    case PC_COLL_ALLREDUCE_MAPPED: return PC_COLL_ALLREDUCE;
    case PC_COLL_ALLREDUCE_CMA: return PC_COLL_ALLREDUCE;
    default: return coll;
    }
}

/* a digest of the block counts every rank must give alike (allgather(v), reduce_scatter(v)) */
static uint64_t counts_digest(const uint64_t *layout, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* (not the displacements, nor the buffer: each rank's own) */
    for (uint32_t r = 0; r < n; r++) h = (h ^ layout[2 * r + 1]) * 0x100000001b3ULL;
    return h;
}

/* the weight of a block sent from rank `from` to rank `to` in a flow (splitmix64 of the pair; odd) */
static uint64_t weight(uint64_t from, uint64_t to) {
    uint64_t z = (from << 32 | to) + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (z ^ (z >> 31)) | 1;
}

/* this rank's flow (see pc_shm_sig_t): what it knows of the blocks' sizes between it and each
 * peer. The root of a gather(v) or scatter(v) alone knows every rank's count, and each rank of an
 * alltoall(v) one row and one column of the matrix: the flows check them all on every rank. */
static uint64_t flow(const pc_shm_coll_t *c) {
    uint64_t f = 0, me = c->rank, root = (uint64_t)c->root;
    switch (base_coll(c->coll)) {
    case PC_COLL_GATHER:
        if (me != root) return c->src_count * weight(me, root);
        if (!c->layout) return 0;
        for (uint32_t r = 0; r < c->nranks; r++)
            if (r != me) f -= c->layout[2 * r + 1] * weight(r, root);
        return f;
    case PC_COLL_SCATTER:
        if (me != root) return 0 - c->count * weight(root, me);
        if (!c->layout) return 0;
        for (uint32_t r = 0; r < c->nranks; r++)
            if (r != me) f += c->layout[2 * r + 1] * weight(root, r);
        return f;
    case PC_COLL_ALLTOALL:
        if (!c->layout || !c->rlayout) return 0;
        for (uint32_t r = 0; r < c->nranks; r++)
            if (r != me) f += c->layout[2 * r + 1] * weight(me, r) - c->rlayout[2 * r + 1] * weight(r, me);
        return f;
    default:
        return 0;
    }
}

static void sign(pc_shm_coll_t *c) {
    int coll = base_coll(c->coll);
    int reduces = coll == PC_COLL_ALLREDUCE || coll == PC_COLL_REDUCE || coll == PC_COLL_REDUCE_SCATTER ||
                  prefix(coll);
    /* the form itself (c->coll): a rank on the single-copy form and one on the segment form of the
     * same collective would read each other's slots wrongly */
    uint64_t what = (uint64_t)c->coll | (uint64_t)(coll == PC_COLL_BARRIER ? 0xff : (c->dtype & 0xff)) << 8 |
                    (uint64_t)(reduces ? (c->avg ? PC_SIG_AVG : (c->op & 0xff)) : 0xff) << 16 |
                    (uint64_t)(rooted(c->coll) ? (uint32_t)c->root : 0xffffffffu) << 32;
    uint64_t agree = 0, count = c->count;
    switch (coll) {
    case PC_COLL_ALLREDUCE: case PC_COLL_BCAST: case PC_COLL_REDUCE: case PC_COLL_SCAN: case PC_COLL_EXSCAN:
        agree = c->count;
        break;
    case PC_COLL_ALLGATHER: agree = counts_digest(c->layout, c->nranks); count = c->src_count; break;
    case PC_COLL_REDUCE_SCATTER: agree = counts_digest(c->layout, c->nranks); break;
    case PC_COLL_GATHER: /* gather (equal blocks, which a rank that goes on eagerly relies on):
                          * the block size, marked, so that a gatherv's root tells them apart */
        if (c->equal) agree = c->src_count | 1ULL << 63;
        count = c->src_count;
        break;
    case PC_COLL_ALLTOALL: count = c->src_count; break;
    case PC_COLL_BARRIER: agree = (uint32_t)c->root; count = 0; break; /* (root: a rejection's mark) */
    default: break; /* scatter: this rank's block, the count */
    }
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    pc_shm_sig_t *s = &me->sig[++me->signs % PC_SIGS];
    s->what = what, s->agree = agree, s->count = count, s->flow = flow(c);
    atomic_store_explicit((_Atomic uint64_t *)&s->gen, c->gen, memory_order_release);
    c->gen0 = c->gen, c->seq = me->signs;
}

/* rank r's signature of the collective that started at gen0: 1 and *out, or 0 if it has not
 * signed that collective (yet). Its entry is where this rank's is when the ranks have signed
 * the same collectives (else any of them). */
static int signature(const pc_shm_coll_t *c, uint32_t r, uint64_t gen0, pc_shm_sig_t *out) {
    const pc_shm_ctrl_t *b = ctrl(c->base, r);
    for (uint64_t i = 0; i < PC_SIGS; i++) {
        const pc_shm_sig_t *s = &b->sig[(c->seq + i) % PC_SIGS];
        if (atomic_load_explicit((_Atomic uint64_t *)&s->gen, memory_order_acquire) != gen0) continue;
        /* (no seqlock needed: an entry is rewritten only PC_SIGS collectives later, and a peer is
         * at most a few signed collectives ahead: see PC_SIGS) */
        out->what = s->what, out->agree = s->agree, out->count = s->count, out->flow = s->flow;
        return 1;
    }
    return 0;
}

/* PC_EMISMATCH if rank r's signature differs from this rank's; PC_EDISAGREE if, at a gather's or
 * scatter's root, r's block is not the size the root's counts give it */
static int compare(const pc_shm_coll_t *c, uint32_t r, const pc_shm_sig_t *mine, const pc_shm_sig_t *theirs) {
    if (theirs->what != mine->what || theirs->agree != mine->agree) return PC_EMISMATCH;
    int coll = base_coll(c->coll);
    if ((coll == PC_COLL_GATHER || coll == PC_COLL_SCATTER) && (int)c->rank == c->root && c->layout &&
        theirs->count != c->layout[2 * r + 1])
        return PC_EDISAGREE;
    return PC_OK;
}

/* every signature of the collective already there: the first that differs from this rank's */
static int scan(const pc_shm_coll_t *c) {
    pc_shm_sig_t mine, theirs;
    if (!signature(c, c->rank, c->gen0, &mine)) return PC_OK;
    for (uint32_t r = 0; r < c->nranks; r++) {
        if (r == c->rank || !signature(c, r, c->gen0, &theirs)) continue;
        int rc = compare(c, r, &mine, &theirs);
        if (rc) return rc;
    }
    return PC_OK;
}

/* Whether this rank waits for every rank's signature (1) or the root's alone (0). The other ranks
 * of a rooted collective wait for nobody but the root (and the slots' previous readers), so every
 * rank's signature would make each call a barrier: where ranks outnumber the cores, every one
 * of them must run again after the last has started before any returns (16 ranks on 2 cores,
 * 4 KiB, three runs each: bcast 0.45-0.56x MPI with it, 0.64-0.83 without; scatter 0.45-0.50
 * and 0.60-0.85; scatterv 0.39-0.54 and 0.64-0.81).
 * So, as off the segment, they check every rank's on the first PC_CHECK_FIRST collectives and
 * on those whose number is a power of two (PYCOLL_CHECK=auto), on all (all), or never (off). A
 * rank that checks the root's alone raises if its call differs from the root's; one whose call
 * matches returns (the root's data, or its own data sent: nothing wrong) while the root and
 * every rank that differs raise, and learns of it at a later call, usually its next (a failed
 * rank's leaving mark: the first such rank's, not always the root's). No rank writes into a peer's
 * memory on what a slot held before (the mapped allreduce's mark), so a rank that returned keeps
 * its result. */
static int checks_every_rank(const pc_shm_coll_t *c) {
    if (!rooted(c->coll) || (int)c->rank == c->root || c->check == PC_CHECK_ALL) return 1;
    if (c->check == PC_CHECK_ROOT) return 0;
    return c->seq <= PC_CHECK_FIRST || !(c->seq & (c->seq - 1));
}

/* A gather's other rank, on a collective where it checks the root's signature alone, with blocks
 * all the size of its own (gather, not gatherv: it knows the chunks without the root's word): it
 * has no output, so it goes on once its pieces are in its slot, waiting for nobody, as an eager
 * send does (where ranks outnumber the cores it need not run again before its next call). It
 * owes the check then (its control block's owed: PC_OWED gathers at most; a gather that starts
 * while as many are owed waits for the root's signature) and makes it at its later calls, as soon
 * as the root has signed that gather (settle): PC_EMISMATCH_EARLIER if the root's call differs,
 * even where no rank took itself for the root. At the end of an eager gather every check of a
 * generation up to two before its last is made (slot_free waited for every rank to finish those),
 * and no collective that checks signatures returns while one is owed: a rank raises within its
 * next two calls, or when its team closes (pycoll_shm_settle). The root checks every rank's
 * signature and block size and raises; where the root failed for another reason after its part
 * (another rank differed, a rejection), a rank whose call matched learns of it within its next
 * three calls (a failed rank's leaving mark: two more gathers may go on without the root). Decided when the collective signs
 * (c->eager). 16 ranks on 2 cores, 4 KiB, 16 runs each: 0.45-0.74x MPI, median 0.57, against
 * 0.40-0.62, median 0.49, with every rank's signature (PYCOLL_CHECK=all); going on without ever
 * checking the root's call gave 0.53-0.77, median 0.63, in the same hour. */
static int goes_eagerly(const pc_shm_coll_t *c) {
    return c->coll == PC_COLL_GATHER && c->equal && (int)c->rank != c->root && !checks_every_rank(c);
}

static int eager_leaf(const pc_shm_coll_t *c) {
    return c->eager;
}

/* Whether rank r went past generation gen0 without a collective of its own starting there: its
 * arrive flag, which it publishes after it signs, is at gen0 or beyond, and its ring holds no
 * signature of gen0 (none is overwritten while a peer may still look for it: see PC_SIGS). Its
 * collectives then took other generations than this rank's, so their calls differ somewhere
 * before; a rank that waited for that signature would wait on a flag already set until the
 * timeout, spinning. */
static int went_past(const pc_shm_coll_t *c, uint32_t r, uint64_t gen0) {
    const pc_shm_ctrl_t *b = ctrl(c->base, r);
    pc_shm_sig_t s;
    return atomic_load_explicit((_Atomic uint64_t *)&b->arrive, memory_order_acquire) >= gen0 &&
           !signature(c, r, gen0, &s); /* (looked at again after the flag: it orders after a signature) */
}

/* a free entry of this rank's owed checks (-1: none) */
static int owed_free(const pc_shm_coll_t *c) {
    const pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    for (int k = 0; k < PC_OWED; k++)
        if (!me->owed[k]) return k;
    return -1;
}

/* whether this rank owes a check (see goes_eagerly) */
static int owes(const pc_shm_coll_t *c) {
    const pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    for (int k = 0; k < PC_OWED; k++)
        if (me->owed[k]) return 1;
    return 0;
}

/* The checks the eager gathers owe (see goes_eagerly), once their root has signed them: 1 made (or
 * nothing owed), 0 a root has not signed yet (after max_polls polls; none: do not wait),
 * PC_EMISMATCH_EARLIER if a root's call differs (owed[0] is that gather then: the error's text
 * reads it). */
static int settle(pc_shm_coll_t *c, uint64_t max_polls) {
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    pc_shm_sig_t mine, theirs;
    uint64_t polls = 0;
    for (int k = 0; k < PC_OWED; k++) {
        uint64_t gen0 = me->owed[k];
        if (!gen0) continue;
        if (!signature(c, c->rank, gen0, &mine)) { /* (gone from the ring: cannot be, see PC_SIGS) */
            me->owed[k] = 0;
            continue;
        }
        uint32_t root = (uint32_t)(mine.what >> 32);
        if (root >= c->nranks) return PC_ESTATE;
        int found;
        while (!(found = signature(c, root, gen0, &theirs)) && !went_past(c, root, gen0) && max_polls) {
            c->wait_rank = root, c->wait_which = 0, c->wait_gen = gen0; /* (one that sleeps: on its arrive) */
            if (!pause_poll(c, &polls, max_polls)) return 0;
        }
        if (!found && went_past(c, root, gen0)) { /* (the root's call of that gather: none) */
            c->wait_rank = UINT32_MAX;
            me->owed[k] = me->owed[0], me->owed[0] = gen0;
            return PC_EMISMATCH_EARLIER;
        }
        if (!found) continue; /* not yet (not waiting): at a later call */
        c->wait_rank = UINT32_MAX;
        if (theirs.what != mine.what || theirs.agree != mine.agree) {
            me->owed[k] = me->owed[0], me->owed[0] = gen0;
            return PC_EMISMATCH_EARLIER;
        }
        me->owed[k] = 0;
    }
    return !owes(c);
}

/* every rank whose signature this rank checks has signed the collective (it is there: a rank signs
 * when it starts) with this rank's signature: 1; 0 not yet; < 0 error. (A rank does not wait for
 * the others to have done anything else: a root whose data the readers still copy is done.) */
static int verify(pc_shm_coll_t *c, uint64_t max_polls) {
    pc_shm_sig_t mine, theirs;
    if (!signature(c, c->rank, c->gen0, &mine)) return PC_ESTATE;
    uint64_t polls = 0, flows = mine.flow;
    int every = checks_every_rank(c);
    for (uint32_t r = 0; r < c->nranks; r++) {
        if (r == c->rank || (!every && (int)r != c->root)) continue;
        while (!signature(c, r, c->gen0, &theirs)) {
            if (went_past(c, r, c->gen0)) {
                c->wait_rank = UINT32_MAX;
                return PC_EMISMATCH;
            }
            /* not there yet: a rank that sleeps waits for r's arrive flag of the collective's first
             * generation, which r publishes after it signed */
            c->wait_rank = r, c->wait_which = 0, c->wait_gen = c->gen0;
            if (!pause_poll(c, &polls, max_polls)) return 0;
        }
        int rc = compare(c, r, &mine, &theirs);
        if (rc) return rc;
        flows += theirs.flow;
    }
    c->wait_rank = UINT32_MAX;
    /* (a block whose two ends disagree on its size; with the root's signature alone, the sizes
     * are the collective's own checks: the root's word, read by each rank) */
    return !every || flows == 0 ? 1 : PC_EDISAGREE;
}

int pycoll_shm_sig(const void *base, uint64_t mapped, uint32_t nranks, uint32_t rank, uint64_t gen0,
                   uint64_t *out) {
    int rc = pycoll_shm_check(base, mapped, nranks);
    if (rc) return rc;
    if (rank >= nranks) return PC_EINVAL;
    pc_shm_coll_t c = {.base = (void *)base, .mapped = mapped, .nranks = nranks, .seq = 0};
    pc_shm_sig_t s;
    if (!signature(&c, rank, gen0, &s)) return 0;
    out[0] = s.what, out[1] = s.agree, out[2] = s.count;
    return 1;
}

int pycoll_shm_last(const void *base, uint64_t mapped, uint32_t nranks, uint32_t rank, uint64_t *out) {
    int rc = pycoll_shm_check(base, mapped, nranks);
    if (rc) return rc;
    if (rank >= nranks) return PC_EINVAL;
    const pc_shm_ctrl_t *b = ctrl((void *)base, rank);
    uint64_t signs = atomic_load_explicit((_Atomic uint64_t *)&b->signs, memory_order_relaxed);
    if (!signs) return 0;
    const pc_shm_sig_t *s = &b->sig[signs % PC_SIGS];
    out[0] = signs, out[1] = s->what, out[2] = s->count;
    out[3] = atomic_load_explicit((_Atomic uint64_t *)&s->gen, memory_order_acquire);
    out[4] = s->agree;
    return 1;
}

static int progress(pc_shm_coll_t *c, uint64_t max_polls);

/* A collective that waits (rc 0) or failed (a peer's header or sizes were not what this rank
 * expected): PC_EMISMATCH instead if a signature there already differs, the cause behind it. */
static int unsigned_by_all(const pc_shm_coll_t *c, int rc) {
    if (rc == 0 || rc == PC_ESTATE || rc == PC_EDISAGREE) {
        int m = scan(c);
        if (m) return m;
    }
    return rc;
}

int pycoll_shm_progress(pc_shm_coll_t *c, uint64_t max_polls) {
    int rc = pycoll_shm_check(c->base, c->mapped, c->nranks);
    if (rc) return rc;
    if (c->rank >= c->nranks || c->coll < 0 || c->coll >= PC_NCOLLS ||
        (rooted(c->coll) && (c->root < 0 || (uint32_t)c->root >= c->nranks)))
        return PC_EINVAL;
    if (c->phase != PC_PHASE_VERIFY) {
        /* a collective with nothing to move takes no generation (but the small ones that travel
         * inline, count 0 too): it neither signs (the next one signs for the same generation)
         * nor waits */
        int signs = c->nchunks != 0 || inline_ok(c, pycoll_dtype_size(c->dtype));
        pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
        if (owes(c)) { /* (as soon as it can: an error shows at once) */
            rc = settle(c, 0);
            if (rc < 0) return rc;
        }
        if (c->chunk == 0 && c->phase == 0 && c->gen0 != c->gen) { /* (once) */
            c->eager = 0;
            if (signs) {
                sign(c);
                c->eager = goes_eagerly(c) && owed_free(c) >= 0;
            }
        }
        rc = progress(c, max_polls);
        if (rc != 1) return signs ? unsigned_by_all(c, rc) : rc;
        if (eager_leaf(c)) {
            /* (the checks it owes of the generations up to two before its last can all be made
             * now: slot_free waited for every rank to finish those, so at most the last two
             * gathers stay owed) */
            rc = settle(c, 0);
            if (rc < 0) return rc;
            me->owed[owed_free(c)] = c->gen0; /* (free at its start: nobody took it since) */
        }
        if (!signs || eager_leaf(c)) return 1;
        c->phase = PC_PHASE_VERIFY;
    }
    rc = verify(c, max_polls);
    if (rc != 1) return unsigned_by_all(c, rc);
    /* a collective that checks signatures does not return while an eager gather's check is owed:
     * the root's call of that gather would otherwise stay unchecked where this rank's next
     * collectives come before the root's signature */
    rc = settle(c, max_polls);
    if (rc != 1) return rc;
    c->phase = 0;
    return 1;
}

static int progress(pc_shm_coll_t *c, uint64_t max_polls) {
    int rc;
    const pc_shm_header_t *h = c->base;
    char *base = c->base;
    pc_shm_ctrl_t *me = ctrl(c->base, c->rank);
    if (c->coll == PC_COLL_BARRIER) {
        if (c->phase == 0) {
            arrive(me, c->gen);
            reduced(me, c->gen); /* reads no slot: done with this generation */
            c->phase = 1;
        }
        rc = wait_flags(c, 0, c->gen, -1, max_polls);
        if (rc <= 0) return rc;
        c->chunk = c->nchunks = 1;
        c->gen++;
        return 1;
    }
    size_t es = pycoll_dtype_size(c->dtype);
    if (single_copy(c->coll)) {
        rc = single_copy_check(c, es);
        return rc ? rc : single_copy_run(c, es, max_polls);
    }
    if (c->coll == PC_COLL_ALLREDUCE_MAPPED) {
        rc = mapped_check(c, es);
        return rc ? rc : mapped_run(c, es, max_polls);
    }
    if (c->coll == PC_COLL_ALLREDUCE_CMA) {
        rc = cma_allreduce_check(c, es);
        return rc ? rc : cma_allreduce_run(c, es, max_polls);
    }
    uint64_t per, need;
    rc = geometry(c, es, &per, &need);
    if (rc) return rc;
    /* the state was not set up (agreed collectives: only more chunks than this rank needs) */
    if (agreed(c->coll) ? c->nchunks < need || c->nchunks > PC_MAX_CHUNKS : c->nchunks != need) return PC_EINVAL;
    if (agreed(c->coll) && c->chunk == 0 && c->phase == 0) c->nchunks = need; /* until they agree */
    if (c->chunk == 0 && inline_ok(c, es)) return inline_small(c, es, max_polls);
    uint64_t hdr = header_bytes(c);
    uint64_t gen0 = c->gen - c->chunk; /* the collective's first generation */
    uint64_t stride = area_stride(c, es);
    const void *ins[PC_SHM_MAX_RANKS];
    while (c->chunk < c->nchunks) {
        uint64_t off = c->chunk * per;
        uint64_t m = blocks(c->coll) ? 0 : c->count - off < per ? c->count - off : per;
        uint64_t parity = c->gen & 1;
        char *slots = base + h->slots_off + parity * c->nranks * h->slot_bytes + ((c->gen >> 1) % PC_AREAS) * stride;
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
                    arrive(me, c->gen);
                    reduced(me, c->gen); /* reads no slot */
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
                arrive(me, c->gen);
                reduced(me, c->gen);
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
                arrive(me, c->gen);
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
                reduced(me, c->gen);
                c->phase = 2;
            }
            if (c->coll == PC_COLL_ALLREDUCE || (int)c->rank == c->root) {
                rc = wait_flags(c, 1, c->gen, -1, max_polls);
                if (rc <= 0) return rc;
                copy_out(c, es, c->dst + off * es, result, m * es);
            }
        } else if (prefix(c->coll)) {
            /* every rank's chunk in its slot; this rank reduces those of the ranks before it (and
             * its own: scan) in rank order into dst, reading its own from the slot too (dst may be
             * src) */
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                memcpy(mine, c->src + off * es, m * es);
                arrive(me, c->gen);
                c->phase = 1;
            }
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            int nin = prefix_inputs(c);
            if (nin > 0 && m) {
                for (int r = 0; r < nin; r++) ins[r] = slots + (uint64_t)r * h->slot_bytes;
                rc = pycoll_reduce_n(c->op, c->dtype, c->dst + off * es, ins, nin, m);
                if (rc) return rc;
            }
            reduced(me, c->gen);
        } else if (c->coll == PC_COLL_ALLGATHER) {
            /* every rank's piece of its block in its slot; everyone copies the others' out */
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                uint64_t mm = piece(c->src_count, c->chunk, per);
                const char *from = mm ? c->src + off * es : NULL;
                if (mm) memcpy(mine, from, mm * es);
                arrive(me, c->gen);
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
                    copy_out(c, es, c->dst + (c->layout[2 * r] + off) * es, slots + r * h->slot_bytes, mr * es);
            }
            reduced(me, c->gen);
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
                arrive(me, c->gen);
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
            reduced(me, c->gen);
        } else if (c->coll == PC_COLL_GATHER) {
            /* every rank but the root copies its piece into its slot and is done with it; the
             * root copies the pieces out into their blocks of dst. The root says at the first
             * chunk how many there are (the others may not know the other blocks) and checks
             * every rank's block size against its layout. A rank writes its first piece without
             * waiting for that word (eager), and reads it before going on (phase 1 of chunk 0). */
            int root = c->root;
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                uint64_t mm = piece(c->src_count, c->chunk, per);
                if (c->chunk == 0) tell(me, gen0, c->nchunks, c->src_count);
                if ((int)c->rank != root) {
                    if (mm) memcpy(mine, c->src + off * es, mm * es);
                    arrive(me, c->gen);
                    if (c->chunk || eager_leaf(c)) reduced(me, c->gen); /* reads no slot */
                } else {
                    arrive(me, c->gen);
                    char *to = c->dst + (c->layout[2 * root] + off) * es;
                    if (mm && to != c->src + off * es) memmove(to, c->src + off * es, mm * es);
                }
                c->phase = 1;
            }
            if (c->phase == 1 && (int)c->rank != root && c->chunk == 0 && !eager_leaf(c)) {
                rc = wait_flags(c, 0, gen0, root, max_polls); /* the root's word on the chunks */
                if (rc <= 0) return rc;
                rc = agree(c, root, gen0);
                if (rc) return rc;
                /* read the root's word: only now may the root reuse it (at generation gen0 + 2) */
                reduced(me, c->gen);
            }
            if ((int)c->rank == root) {
                rc = wait_flags(c, 0, c->gen, -1, max_polls);
                if (rc <= 0) return rc;
                for (uint32_t r = 0; c->chunk == 0 && r < c->nranks; r++) {
                    uint64_t said = atomic_load_explicit(
                        (_Atomic uint64_t *)&ctrl(c->base, r)->info[gen0 & 1][1], memory_order_relaxed);
                    if (said != c->layout[2 * r + 1]) return PC_EDISAGREE;
                }
                for (uint32_t r = 0; r < c->nranks; r++) {
                    uint64_t mr = piece(c->layout[2 * r + 1], c->chunk, per);
                    if ((int)r != root && mr)
                        copy_out(c, es, c->dst + (c->layout[2 * r] + off) * es, slots + r * h->slot_bytes, mr * es);
                }
                reduced(me, c->gen);
            }
        } else if (c->coll == PC_COLL_SCATTER) {
            /* the root's slot: a header of every block's size, then a piece of each block
             * (block b's at b * per); each rank copies its piece out */
            int root = c->root;
            char *slot = slots + (uint64_t)root * h->slot_bytes;
            uint64_t *sizes = (uint64_t *)slot;
            if ((int)c->rank == root) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                for (uint32_t b = 0; b < c->nranks; b++) {
                    uint64_t cnt = c->layout[2 * b + 1], mb = piece(cnt, c->chunk, per);
                    const char *from = c->src + (c->layout[2 * b] + off) * es;
                    sizes[b] = cnt;
                    if ((int)b == root) {
                        if (mb && c->dst + off * es != from) memmove(c->dst + off * es, from, mb * es);
                    } else if (mb) {
                        memcpy(slot + hdr + b * per * es, from, mb * es);
                    }
                }
                if (c->chunk == 0) tell(me, gen0, c->nchunks, c->count);
                arrive(me, c->gen);
                reduced(me, c->gen);
            } else {
                rc = wait_flags(c, 0, c->gen, root, max_polls);
                if (rc <= 0) return rc;
                if (c->chunk == 0) {
                    rc = agree(c, root, gen0);
                    if (rc) return rc;
                }
                if (sizes[c->rank] != c->count) return PC_EDISAGREE; /* the root sends another size */
                uint64_t mm = piece(c->count, c->chunk, per);
                if (mm) copy_out(c, es, c->dst + off * es, slot + hdr + (uint64_t)c->rank * per * es, mm * es);
                arrive(me, c->gen);
                reduced(me, c->gen);
            }
        } else if (c->coll == PC_COLL_ALLTOALL) {
            /* every rank's slot: a header of the sizes of its blocks, then a piece of each (the
             * one for rank b at b * per); every rank copies its piece out of every slot. The
             * ranks agree on the number of chunks at the first (the largest any needs). */
            if (c->phase == 0) {
                rc = slot_free(c, max_polls);
                if (rc <= 0) return rc;
                uint64_t *sizes = (uint64_t *)mine;
                for (uint32_t b = 0; b < c->nranks; b++) {
                    uint64_t cnt = c->layout[2 * b + 1], mb = piece(cnt, c->chunk, per);
                    sizes[b] = cnt;
                    if (mb) memcpy(mine + hdr + b * per * es, c->src + (c->layout[2 * b] + off) * es, mb * es);
                }
                if (c->chunk == 0) tell(me, gen0, c->nchunks, 0);
                arrive(me, c->gen);
                c->phase = 1;
            }
            rc = wait_flags(c, 0, c->gen, -1, max_polls);
            if (rc <= 0) return rc;
            if (c->chunk == 0) {
                rc = agree(c, -1, gen0);
                if (rc) return rc;
            }
            for (uint32_t r = 0; r < c->nranks; r++) {
                const char *slot = slots + r * h->slot_bytes;
                uint64_t cnt = c->rlayout[2 * r + 1], mr = piece(cnt, c->chunk, per);
                if (((const uint64_t *)slot)[c->rank] != cnt) return PC_EDISAGREE; /* r sends another size */
                if (mr) copy_out(c, es, c->dst + (c->rlayout[2 * r] + off) * es, slot + hdr + (uint64_t)c->rank * per * es,
                                 mr * es);
            }
            reduced(me, c->gen);
        } else { /* bcast: the root's slot carries the chunk */
            char *slot = slots + (uint64_t)c->root * h->slot_bytes;
            if ((int)c->rank == c->root) {
                if (c->phase == 0) {
                    rc = slot_free(c, max_polls); /* the readers of generation gen-2 (same slot) */
                    if (rc <= 0) return rc;
                    memcpy(slot, c->dst + off * es, m * es);
                    arrive(me, c->gen);
                    reduced(me, c->gen);
                    c->phase = 1;
                }
            } else {
                rc = wait_flags(c, 0, c->gen, c->root, max_polls);
                if (rc <= 0) return rc;
                copy_out(c, es, c->dst + off * es, slot, m * es);
                arrive(me, c->gen);
                reduced(me, c->gen);
            }
        }
        c->chunk++;
        c->gen++;
        c->phase = 0;
    }
    return 1;
}

int pycoll_shm_settle(pc_shm_coll_t *c, uint64_t max_polls) {
    int rc = pycoll_shm_check(c->base, c->mapped, c->nranks);
    if (rc) return rc;
    if (c->rank >= c->nranks) return PC_EINVAL;
    return settle(c, max_polls);
}

int pycoll_shm_run(pc_shm_coll_t *c, uint64_t *next_gen, uint64_t max_polls) {
    if (!next_gen) return PC_EINVAL;
    c->gen = *next_gen;
    c->chunk = 0;
    c->phase = 0;
    int rc = pycoll_shm_progress(c, max_polls);
    if (rc == 1) *next_gen = c->gen;
    return rc;
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
                    uint64_t khash, uint64_t step, uint64_t nbytes, uint64_t addr, uint64_t seq,
                    const uint8_t *mark) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    if (atomic_load_explicit((_Atomic uint64_t *)&d->state, memory_order_acquire) != PC_DESC_FREE) return 0;
    d->khash = khash;
    d->step = step;
    d->nbytes = nbytes;
    d->flags = mark ? PC_DESC_MARKED : 0;
    if (mark) memcpy(d->mark, mark, PC_DESC_MARK);
    if (nbytes <= PC_DESC_INLINE) { /* the payload in the descriptor: its reader makes no system call */
        memcpy(&d->addr, (const void *)(uintptr_t)addr, nbytes);
    } else {
        d->addr = addr;
        d->seq = seq;
    }
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
                    uint64_t *out, uint8_t *mark) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    uint64_t s = atomic_load_explicit((_Atomic uint64_t *)&d->state, memory_order_acquire);
    if (s != PC_DESC_POSTED) return s > PC_DESC_CONSUMED ? PC_ESTATE : 0;
    uint64_t flags = d->flags; /* (read once: the caller acts on what it was given) */
    if (flags & ~(uint64_t)PC_DESC_MARKED) return PC_ESTATE;
    out[0] = d->khash;
    out[1] = d->step;
    out[2] = d->nbytes;
    out[3] = d->addr;
    out[4] = d->seq;
    out[5] = flags;
    if (mark) {
        if (flags & PC_DESC_MARKED)
            memcpy(mark, d->mark, PC_DESC_MARK);
        else
            memset(mark, 0, PC_DESC_MARK);
    }
    return 1;
}

int64_t pycoll_p2p_read(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                        int64_t pid, void *to, uint64_t addr, uint64_t nbytes) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    if (atomic_load_explicit((_Atomic uint64_t *)&d->state, memory_order_acquire) != PC_DESC_POSTED ||
        d->nbytes != nbytes)
        return PC_ESTATE;
    if (nbytes <= PC_DESC_INLINE) {
        memcpy(to, &d->addr, nbytes);
        return (int64_t)nbytes;
    }
    int64_t got = pycoll_cma_read(pid, to, addr, nbytes);
    if (got < 0) {
        errno = (int)-got;
        return PC_ECMA;
    }
    return got;
}

int pycoll_p2p_consumed(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot) {
    int rc;
    pc_desc_t *d = desc(base, mapped, nranks, src, dst, slot, &rc);
    if (!d) return rc;
    atomic_store_explicit((_Atomic uint64_t *)&d->state, PC_DESC_CONSUMED, memory_order_release);
    return PC_OK;
}

int64_t pycoll_cma_write(int64_t pid, const void *local, uint64_t remote, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
        struct iovec l = {(char *)local + done, n - done};
        struct iovec r = {(void *)(uintptr_t)(remote + done), n - done};
        ssize_t got = process_vm_writev((pid_t)pid, &l, 1, &r, 1, 0);
        if (got < 0) return -errno;
        if (got == 0) return -EFAULT;
        done += (uint64_t)got;
    }
    return (int64_t)done;
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
