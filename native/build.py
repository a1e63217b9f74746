"""cffi build script for pycoll's native module (pycoll._native), run by setuptools at install.

API mode: the C sources in this folder are compiled into an extension module; cffi releases the
GIL around every call, so long copies and reductions let other Python threads run.
"""

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))

CDEF = """
#define PC_CTRL_BYTES ...
size_t pycoll_dtype_size(int dtype);
int pycoll_reduce(int op, int dtype, void *out, const void *a, const void *b, size_t n);
int pycoll_reduce_n(int op, int dtype, void *out, const void *const *ins, int nin, size_t n);

typedef struct {
    uint64_t magic; uint32_t version; uint32_t nranks; uint64_t total_bytes; uint64_t slot_bytes;
    uint64_t ctrl_off; uint64_t slots_off; uint64_t result_off; uint64_t creator_pid; uint64_t p2p_off;
} pc_shm_header_t;

typedef struct {
    void *base; uint64_t mapped; uint32_t rank, nranks;
    int coll, op, dtype, root;
    const char *src; char *dst; uint64_t count;
    uint64_t gen; uint64_t chunk; uint64_t nchunks; int phase; uint64_t spins;
    const uint64_t *layout; uint64_t src_count;
    const uint64_t *rlayout; uint32_t wait_rank; int wait_which; uint64_t wait_gen;
    uint32_t yield_every; uint64_t gen0, seq; int avg;
    uint64_t inline_max; int lent;
    char *region[2]; uint64_t region_bytes[2], region_id[2]; int check, equal, eager;
} pc_shm_coll_t;

uint64_t pycoll_shm_layout(uint32_t nranks, uint64_t slot_bytes, pc_shm_header_t *out);
int pycoll_shm_init(void *base, uint64_t total, const pc_shm_header_t *layout);
int pycoll_shm_check(const void *base, uint64_t mapped, uint32_t nranks);
void pycoll_shm_attach(void *base, uint32_t rank, uint64_t pid);
uint64_t pycoll_shm_load(const void *base, uint32_t rank, int which);
int pycoll_shm_last(const void *base, uint64_t mapped, uint32_t nranks, uint32_t rank, uint64_t *out);
void pycoll_shm_leave(void *base, uint32_t rank, uint64_t how, const char *why);
uint64_t pycoll_shm_left(const void *base, uint32_t rank, char *out);
int pycoll_shm_sig(const void *base, uint64_t mapped, uint32_t nranks, uint32_t rank, uint64_t gen0,
                   uint64_t *out);
uint64_t pycoll_shm_chunks(const pc_shm_coll_t *c);
uint64_t pycoll_shm_area(const pc_shm_coll_t *c, uint64_t gen);
int pycoll_shm_progress(pc_shm_coll_t *c, uint64_t max_polls);
int pycoll_shm_settle(pc_shm_coll_t *c, uint64_t max_polls);
int pycoll_shm_run(pc_shm_coll_t *c, uint64_t *next_gen, uint64_t max_polls);
int pycoll_shm_sleep(pc_shm_coll_t *c, uint64_t timeout_ns);
int64_t pycoll_cma_read(int64_t pid, void *local, uint64_t remote, uint64_t n);
int64_t pycoll_cma_write(int64_t pid, const void *local, uint64_t remote, uint64_t n);
int pycoll_p2p_post(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                    uint64_t khash, uint64_t step, uint64_t nbytes, uint64_t addr, uint64_t seq,
                    const uint8_t *mark);
int pycoll_p2p_state(const void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst,
                     uint32_t slot);
int pycoll_p2p_free(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot);
int pycoll_p2p_take(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst, uint32_t slot,
                    uint64_t *out, uint8_t *mark);
int64_t pycoll_p2p_read(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst,
                        uint32_t slot, int64_t pid, void *to, uint64_t addr, uint64_t nbytes);
int pycoll_p2p_consumed(void *base, uint64_t mapped, uint32_t nranks, uint32_t src, uint32_t dst,
                        uint32_t slot);

"""

ffibuilder = FFI()
# the simulator's records (shared with sim.c), the shared-memory program executor's (exec_shm.c)
for _name in ("sim.h", "exec.h", "exec_shm.h"):
    with open(os.path.join(HERE, _name)) as _header:
        CDEF += "".join(line for line in _header if not line.startswith("#"))
# (declared in pycoll_native.h, after exec_shm.h's pc_sx_t)
CDEF += """
int pc_sx_early_marked(pc_sx_t *e, int32_t src, int agree, uint64_t step, const void *data, uint64_t nbytes,
                       const uint8_t *mark);
"""

ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "pycoll._native",
    '#include "pycoll_native.h"',
    sources=[os.path.relpath(os.path.join(HERE, f), os.getcwd())
             for f in ("reduce.c", "shm.c", "sim.c", "exec_shm.c")],
    include_dirs=[os.path.relpath(HERE, os.getcwd())],
    # (no fused multiply-adds: the simulator's C loop must round as Python does, on every CPU)
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function", "-ffp-contract=off"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
