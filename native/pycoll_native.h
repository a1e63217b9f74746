/* pycoll native code: reduction kernels and the shared-memory collectives.
 *
 * Everything here is called through cffi (pycoll/_native), which releases the GIL around calls.
 * Nothing a peer writes into a segment is trusted: pycoll_shm_check() validates the header and
 * every state machine re-checks it before using offsets read from the segment.
 */
#ifndef PYCOLL_NATIVE_H
#define PYCOLL_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* dtypes and ops: keep in sync with pycoll/dtypes.py (DTYPE_CODES) and pycoll/ops.py (OP_CODES) */
enum { PC_INT8, PC_INT16, PC_INT32, PC_INT64, PC_UINT8, PC_UINT16, PC_UINT32, PC_UINT64,
       PC_FLOAT16, PC_BFLOAT16, PC_FLOAT32, PC_FLOAT64, PC_COMPLEX64, PC_COMPLEX128, PC_BOOL,
       PC_NDTYPES };
enum { PC_SUM, PC_PROD, PC_MIN, PC_MAX, PC_BAND, PC_BOR, PC_BXOR, PC_LAND, PC_LOR, PC_LXOR,
       PC_NOPS };

/* error codes (negative) */
#define PC_OK 0
#define PC_EINVAL -1      /* bad dtype/op/argument */
#define PC_EHEADER -2     /* the segment header is not valid */
#define PC_ERANGE -3      /* an offset or size read from the segment is out of bounds */
#define PC_ESTATE -4      /* a peer's control block holds an impossible value */
#define PC_EDISAGREE -5   /* the ranks disagree on the blocks of a collective (their sizes) */
#define PC_ECMA -6        /* reading or writing a peer's memory (process_vm_readv/writev) failed */
#define PC_EMISMATCH -7   /* the ranks called different collectives, or the same one with other
                           * arguments (count, dtype, op, root): their signatures differ */
#define PC_ENOMEM -8      /* a native work buffer could not be allocated */
#define PC_EMISMATCH_EARLIER -9 /* an earlier gather this rank went on from without waiting for
                                 * the root (eager) differs from the root's call */

int pycoll_reduce(int op, int dtype, void *out, const void *a, const void *b, size_t n);
int pycoll_reduce_n(int op, int dtype, void *out, const void *const *ins, int nin, size_t n);
size_t pycoll_dtype_size(int dtype);

/* ------------------------------------------------------------------ shared segment */
#define PC_SHM_MAGIC 0x314D48534C4F4350ULL /* "PCOLSHM1" */
#define PC_SHM_VERSION 10 /* 10: point-to-point descriptors of 128 bytes that carry a mark */
#define PC_SHM_MAX_RANKS 1024
#define PC_LINE 64

/* A spinning wait's pause between polls: a hyperthread sibling (or the vCPU beside it) keeps the
 * core's resources for its work. */
static inline void pc_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t nranks;
    uint64_t total_bytes;   /* size of the mapping */
    uint64_t slot_bytes;    /* bytes of one data slot */
    uint64_t ctrl_off;      /* nranks control blocks of PC_CTRL_BYTES */
    uint64_t slots_off;     /* 2 * nranks slots (double buffered) */
    uint64_t result_off;    /* 2 result areas of slot_bytes */
    uint64_t creator_pid;
    uint64_t p2p_off;       /* nranks x nranks rings of PC_RING descriptors (sender x receiver) */
} pc_shm_header_t;

/* point-to-point: one descriptor ring per (sender, receiver); the receiver copies the payload
 * straight out of the sender's memory (process_vm_readv) and marks the descriptor consumed. A
 * marked message (PC_DESC_MARKED in flags) carries its call's mark (exec.h's PC_MARK_BYTES, see
 * pycoll.tl.marks) in the descriptor's second cache line; an unmarked one leaves mark as it was. */
#define PC_RING 64
enum { PC_DESC_FREE = 0, PC_DESC_POSTED = 1, PC_DESC_CONSUMED = 2 };
enum { PC_DESC_MARKED = 1 }; /* flags: the message carries a mark (no other bit is valid) */
#define PC_DESC_MARK 32      /* bytes of a mark (PC_MARK_BYTES) */
typedef struct {
    uint64_t state;         /* atomic: PC_DESC_* */
    uint64_t khash, step, nbytes, addr, seq;
    uint64_t pad[2];
    uint64_t flags;         /* PC_DESC_MARKED or 0 */
    uint64_t pad2[3];
    uint8_t mark[PC_DESC_MARK];
} pc_desc_t;
/* a payload of at most this many bytes is in the descriptor, from addr on (over seq and pad) */
#define PC_DESC_INLINE 32

/* Post a message (mark: its PC_DESC_MARK bytes, or NULL: unmarked) in a FREE descriptor: 1, 0 when
 * the descriptor is not free (the ring is full), or < 0. */
int pycoll_p2p_post(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                    uint64_t khash, uint64_t step, uint64_t nbytes, uint64_t addr, uint64_t seq,
                    const uint8_t *mark);
int pycoll_p2p_state(const void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst,
                     uint32_t slot); /* the state, or < 0 */
int pycoll_p2p_free(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot);
int pycoll_p2p_take(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                    uint64_t *out, uint8_t *mark);
    /* copies khash, step, nbytes, addr, seq, flags of a POSTED descriptor into out (6 words) and its
     * mark into mark (PC_DESC_MARK bytes; zeros for an unmarked message; NULL: not copied): 1, 0
     * when the descriptor is not posted, PC_ESTATE for a state or flags no sender writes */
int64_t pycoll_p2p_read(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                        int64_t pid, void *to, uint64_t addr, uint64_t nbytes);
    /* copies the payload of a POSTED descriptor of nbytes into to (from the descriptor, or out of
     * process pid's memory at addr); nbytes, or a PC_E* code (PC_ECMA: errno says why) */
int pycoll_p2p_consumed(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot);

#define PC_CTRL_BYTES 640
#define PC_INLINE (PC_LINE - 24) /* bytes of inline data: 40 */
/* A collective's signature: what each rank says it calls, written when it starts the collective
 * (first generation gen0), in entry (its number of signed collectives) % PC_SIGS of its control
 * block; a rank compares the others' (or, on the other ranks of a rooted collective, the root's:
 * see pc_shm_coll_t's check) with its own before it returns. No rank writes a slot of generation
 * g before every rank is done with g - 2, and every collective that signs takes a generation, so
 * a rank is at most a few signed collectives ahead of another and an entry is not overwritten
 * while a peer may still read it. */
#define PC_SIGS 8
/* pc_shm_coll_t's check (PYCOLL_CHECK): auto, all, or off (the root's signature alone) */
enum { PC_CHECK_AUTO = 0, PC_CHECK_ALL = 1, PC_CHECK_ROOT = 2 };
/* under auto, the other ranks of a rooted collective check every rank's signature on a segment's
 * first PC_CHECK_FIRST collectives and on those whose number is a power of two */
#define PC_CHECK_FIRST 8
#define PC_LEFT_WHY 48
/* eager gathers a rank may have gone on from before it has checked their root's call */
#define PC_OWED 2
enum { PC_LEFT_HERE = 0, PC_LEFT_EXITED = 1, PC_LEFT_RAISED = 2, PC_LEFT_CLOSED = 3, PC_LEFT_FAILED = 4,
       PC_LEFT_REVOKED = 5 };
typedef struct {
    uint64_t gen;           /* the collective's first generation (atomic; written last) */
    uint64_t what;          /* collective | dtype << 8 | op << 16 | root << 32 (0xff.. where none) */
    uint64_t agree;         /* what every rank must give alike: the count, a digest of the counts, or a
                             * barrier's root (0; REJECTED of pycoll.calls: a call that failed its checks) */
    uint64_t count;         /* this rank's own count (elements), for the root's checks and messages */
    uint64_t flow;          /* gather, scatter, alltoall: the weighted sizes of the blocks this rank
                             * sends minus those of the blocks it expects (mod 2^64; each (sender,
                             * receiver) pair has its own pseudo-random weight): over the ranks they
                             * sum to 0 when the two ends of every block agree on its size */
} pc_shm_sig_t;
typedef struct {
    uint64_t arrive;        /* generation whose slot data this rank has written (atomic) */
    uint32_t arrive_sleepers;  /* ranks asleep in the kernel on arrive (futex; atomic) */
    /* Small allreduce and reduce data (bcast, scan, exscan: on 2 ranks, or with nothing to move)
     * travels inline, on the arrive flag's cache line (a reader gets flag and data in one miss),
     * with a header the readers check: its size in bytes and the generation it belongs to.
     * Written before arrive is published. */
    uint32_t inline_bytes;
    uint64_t inline_gen;
    char inline_data[PC_INLINE];
    uint64_t reduced;       /* generation whose result part this rank has written (atomic) */
    uint32_t reduced_sleepers; /* ranks asleep on reduced */
    char pad1[PC_LINE - 12];
    uint64_t pid;           /* process id, for liveness checks */
    uint64_t attached;      /* 1 once the rank mapped the segment (atomic) */
    /* what this rank says of the collective whose first generation has parity p, written before
     * it publishes that generation's arrive flag: the chunks it needs and its block's elements
     * (gather, scatter, alltoall: the ranks agree on the number of chunks from these) */
    uint64_t info[2][2];
    pc_shm_sig_t sig[PC_SIGS];
    uint64_t signs;         /* collectives this rank has signed (written by this rank only) */
    /* the first generations of the gathers (up to PC_OWED) this rank went on from without the
     * root's signature (eager), until it has compared that signature with its own; 0: none (this
     * rank only; after PC_EMISMATCH_EARLIER, owed[0] is the gather whose calls differ) */
    uint64_t owed[PC_OWED];
    /* How this rank left (PC_LEFT_*; 0 while it is here), written once by the rank itself at
     * interpreter exit, on an uncaught exception, when it closes the team or when a collective
     * failed on it (the segment is unusable then), after left_why (a NUL-terminated text: the
     * error). Its peers read it while they wait for it: a rank whose process stays alive after it
     * left (inside MPI_Finalize, or its launcher) is not waited for until the timeout. */
    uint64_t left;
    char left_why[PC_LEFT_WHY];
    char pad2[PC_CTRL_BYTES - 2 * PC_LINE - 16 - 32 - PC_SIGS * 40 - 16 - 8 * PC_OWED - PC_LEFT_WHY];
} pc_shm_ctrl_t;

uint64_t pycoll_shm_layout(uint32_t nranks, uint64_t slot_bytes, pc_shm_header_t *out);
int pycoll_shm_init(void *base, uint64_t total, const pc_shm_header_t *layout);
int pycoll_shm_check(const void *base, uint64_t mapped, uint32_t nranks);
void pycoll_shm_attach(void *base, uint32_t rank, uint64_t pid);
uint64_t pycoll_shm_load(const void *base, uint32_t rank, int which); /* arrive, reduced, attached, pid, left, owed */
/* Rank `rank`'s last signed collective, for diagnostics (read while it may change): out = (its
 * number among the collectives it signed, what, count, first generation, agree); 0 if it signed
 * none. */
int pycoll_shm_last(const void *base, uint64_t mapped, uint32_t nranks, uint32_t rank, uint64_t *out);
/* This rank leaves (how: PC_LEFT_*; why: a text, cut to PC_LEFT_WHY - 1 bytes): written once,
 * the first call wins (but PC_LEFT_REVOKED replaces PC_LEFT_FAILED); wakes the peers asleep on its
 * flags so they look at it at once. */
void pycoll_shm_leave(void *base, uint32_t rank, uint64_t how, const char *why);
/* Rank `rank`'s left_why into out (PC_LEFT_WHY bytes, NUL-terminated); its left value. */
uint64_t pycoll_shm_left(const void *base, uint32_t rank, char *out);
/* Rank `rank`'s signature of the collective whose first generation is gen0 into out (what, agree,
 * count): 1 if it signed that collective, 0 if not (not there yet, or gone on), < 0 error. */
int pycoll_shm_sig(const void *base, uint64_t mapped, uint32_t nranks, uint32_t rank, uint64_t gen0,
                   uint64_t *out);

/* One collective on the segment, advanced by pycoll_shm_progress() without blocking for long.
 * Collectives on one segment run one at a time, in the same order on every rank; gen counts
 * chunks over all of them and must be equal on every rank.
 *
 * Flags: arrive = g once this rank's slot holds its data of generation g; reduced = g once this
 * rank has read everything it reads of generation g's slots (and written its part of the
 * result). Every collective publishes both for each of its generations, and a rank writes its
 * slot of generation g only once every rank's reduced flag is at g - 2 (the same slot). */
enum { PC_COLL_ALLREDUCE, PC_COLL_BCAST, PC_COLL_BARRIER, PC_COLL_REDUCE, PC_COLL_ALLGATHER,
       PC_COLL_REDUCE_SCATTER, PC_COLL_GATHER, PC_COLL_SCATTER, PC_COLL_ALLTOALL,
       /* single copy: each rank reads what it receives straight out of the sender's buffer
        * (process_vm_readv); the segment carries only the addresses and sizes, in one generation */
       PC_COLL_BCAST_CMA, PC_COLL_GATHER_CMA, PC_COLL_SCATTER_CMA, PC_COLL_ALLTOALL_CMA,
       /* allreduce of buffers in memory every rank maps (a region: see region below): each rank
        * reduces its 1/n straight from the ranks' inputs and writes it into every rank's output;
        * the segment carries only the offsets, in one generation */
       PC_COLL_ALLREDUCE_MAPPED,
       /* prefix reductions: every rank's chunk in its slot; rank r reduces slots 0..r (exscan:
        * 0..r-1; rank 0's dst is left as it was) in rank order into its dst */
       PC_COLL_SCAN, PC_COLL_EXSCAN,
       /* single-copy allreduce of the ranks' own buffers: each rank reduces its 1/n, reading the
        * peers' inputs with process_vm_readv a block at a time, and writes each reduced block
        * into every rank's output (process_vm_writev); the segment carries the addresses */
       PC_COLL_ALLREDUCE_CMA, PC_NCOLLS };
typedef struct {
    void *base;
    uint64_t mapped;
    uint32_t rank, nranks;
    int coll, op, dtype, root;
    const char *src;
    char *dst;
    uint64_t count;         /* elements */
    uint64_t gen;           /* generation of the chunk in progress (first chunk: gen0 + 1) */
    uint64_t chunk;         /* index of the chunk in progress */
    uint64_t nchunks;
    int phase;
    uint64_t spins;         /* polls of flags that found them not ready (statistics) */
    /* Blocks of the block collectives: block r is layout[2r] (offset) and layout[2r+1] (count),
     * in elements, of the whole buffer: allgather(v) and gather(v) (root only: NULL elsewhere)
     * blocks of dst (count elements), this rank's block the size of src (src_count elements);
     * reduce_scatter(v) and scatter(v) (root only) blocks of src (src_count elements), this
     * rank's block the size of dst (count); alltoall(v) sends blocks of src (layout) and receives
     * blocks of dst (rlayout). */
    const uint64_t *layout;
    uint64_t src_count;
    const uint64_t *rlayout;
    /* the flag the last call found not ready: rank wait_rank's arrive (0) or reduced (1) flag, to
     * reach generation wait_gen (for pycoll_shm_sleep); wait_rank >= nranks: none */
    uint32_t wait_rank;
    int wait_which;
    uint64_t wait_gen;
    /* give the core away (sched_yield) every yield_every polls of a flag that is not ready: ranks
     * that outnumber the cores wait this way (0: never, spin only) */
    uint32_t yield_every;
    /* the collective's first generation and its number among the collectives this rank signed
     * (set when it signs, at its start) */
    uint64_t gen0, seq;
    /* the collective averages (op is PC_SUM, the caller divides): its signature says so */
    int avg;
    /* single-copy scatter(v) and alltoall(v): a block of at most this many bytes travels through
     * the sender's slot (copied in and out, while it has room) instead of being read from the
     * sender's memory; the sender says which in the pair it publishes, so the readers follow it
     * whatever their own setting (0: every block is read from the sender's memory) */
    uint64_t inline_max;
    /* set by the collective: this rank published a block that a peer reads from its memory, so it
     * waits for its readers before it returns */
    int lent;
    /* PC_COLL_ALLREDUCE_MAPPED: the regions src ([0]) and dst ([1]) lie in (in this rank's part):
     * this process's mapping of each (nranks parts of region_bytes, rank r's at region + r *
     * region_bytes) and its id (equal on every rank: a peer that names another is an error) */
    char *region[2];
    uint64_t region_bytes[2], region_id[2];
    /* whose signatures the other ranks of a rooted collective (bcast, reduce, gather(v),
     * scatter(v)) wait for before they return (PC_CHECK_*): every rank's, or the root's alone. The
     * root, and every rank of the other collectives, waits for every rank's: it waits for their
     * data anyway. */
    int check;
    /* gather: every block is the size of this rank's (not gatherv): the chunks are known to all */
    int equal;
    /* set by the collective when it signs: this rank goes on without the root's signature (a
     * gather's other rank: see eager_leaf in shm.c) */
    int eager;
} pc_shm_coll_t;

uint64_t pycoll_shm_chunks(const pc_shm_coll_t *c);
uint64_t pycoll_shm_area(const pc_shm_coll_t *c, uint64_t gen);
/* 1 done, 0 waiting, <0 error. A collective signs at its start, and is done only once every rank's
 * signature matches its own (else PC_EMISMATCH, as soon as a signature that differs is seen). */
int pycoll_shm_progress(pc_shm_coll_t *c, uint64_t max_polls);
/* The checks this rank owes of the gathers it went on from without their root (see goes_eagerly
 * in shm.c), made now where the roots have signed them (waiting up to max_polls polls): 1 none
 * owed any more, 0 some root has not signed yet, PC_EMISMATCH_EARLIER a root's call differs. For
 * a team that closes: its last gathers are checked too. */
int pycoll_shm_settle(pc_shm_coll_t *c, uint64_t max_polls);
/* Start c (bound to its buffers) at generation *next_gen and progress it, in one call: the express
 * lane of a collective run again on the same buffers. As progress; when done, *next_gen is the
 * generation after it. */
int pycoll_shm_run(pc_shm_coll_t *c, uint64_t *next_gen, uint64_t max_polls);
/* Sleep in the kernel (futex) until the flag the last progress call waited for changes, or
 * timeout_ns pass: 1 it is ready now, 0 not yet, < 0 error. The rank that sets a flag wakes its
 * sleepers. */
int pycoll_shm_sleep(pc_shm_coll_t *c, uint64_t timeout_ns);

/* ------------------------------------------------------------------ cross-memory attach */
int64_t pycoll_cma_read(int64_t pid, void *local, uint64_t remote, uint64_t n);
int64_t pycoll_cma_write(int64_t pid, const void *local, uint64_t remote, uint64_t n);

/* ------------------------------------------------------------------ the simulator's event loop */
#include "sim.h"

/* ------------------------------------------------------------------ programs over shared memory */
#include "exec_shm.h"
/* pc_sx_early for a message that carried mark (NULL: none): where e->mark is set, a message of the
 * collective (not of its agreement exchange) whose mark is not e->mark, or that has none or another
 * length, is refused, and its receive fails with PC_ST_MARK when it is issued (its mark in
 * e->marks, its length in e->got; see exec_shm.c). */
int pc_sx_early_marked(pc_sx_t *e, int32_t src, int agree, uint64_t step, const void *data, uint64_t nbytes,
                       const uint8_t *mark);

#endif
