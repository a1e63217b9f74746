"""cffi build script for pycoll's UCX binding (pycoll._ucx), run by setuptools at install when the
UCX headers are available (the ``libucx-cu12`` wheel, a build requirement on Linux).

API mode against the wheel's headers, with no link to libucp and no RPATH: the build environment
is temporary, so the library is found at run time by :mod:`pycoll.tl.ucx.loader`, which loads a
libucp (MPICH's if already in the process, else the wheel's) with RTLD_GLOBAL before importing
this module.
"""

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def ucx_include_dir():
    """The UCX headers of the libucx wheel, or None."""
    try:
        import libucx  # noqa: PLC0415 - optional: the UCX wheel
    except ImportError:
        return None
    inc = os.path.join(os.path.dirname(libucx.__file__), "include")
    return inc if os.path.isfile(os.path.join(inc, "ucp", "api", "ucp.h")) else None


CDEF = """
typedef struct ucp_context *ucp_context_h;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_ep *ucp_ep_h;
typedef struct { void *buffer; size_t length; } ucp_dt_iov_t;
typedef struct { uint64_t sender_tag; size_t length; } ucp_tag_recv_info_t;

#define UCS_OK ...
#define UCS_INPROGRESS ...
#define UCS_ERR_MESSAGE_TRUNCATED ...
#define UCS_ERR_CANCELED ...

void pc_ucx_version(unsigned *major, unsigned *minor, unsigned *release);
void pc_ucx_header_version(unsigned *major, unsigned *minor);
const char *pc_ucx_status_string(int status);
int pc_ucx_init(unsigned api_major, unsigned api_minor, const char *settings, ucp_context_h *ctx,
                ucp_worker_h *worker);
void pc_ucx_fini(ucp_context_h ctx, ucp_worker_h worker);
int pc_ucx_address(ucp_worker_h worker, void *out, size_t cap, size_t *len);
int pc_ucx_ep_create(ucp_worker_h worker, const void *address, int peer_mode, int *err, ucp_ep_h *ep);
void *pc_ucx_ep_close(ucp_ep_h ep, int force, int *status);
void *pc_ucx_ep_flush(ucp_ep_h ep, int *status);
int pc_ucx_first_error(const int *flags, int n);
void *pc_ucx_send(ucp_ep_h ep, const void *buf, size_t n, uint64_t tag, int *status);
void *pc_ucx_send2(ucp_ep_h ep, ucp_dt_iov_t *iov, const void *hdr, size_t hlen, const void *buf,
                   size_t n, uint64_t tag, int *status);
void *pc_ucx_recv(ucp_worker_h worker, void *buf, size_t n, uint64_t tag, uint64_t mask,
                  ucp_tag_recv_info_t *info, int *status);
void *pc_ucx_recv2(ucp_worker_h worker, ucp_dt_iov_t *iov, void *hdr, size_t hlen, void *buf, size_t n,
                   uint64_t tag, uint64_t mask, ucp_tag_recv_info_t *info, int *status);
int pc_ucx_probe(ucp_worker_h worker, uint64_t tag, uint64_t mask, int remove, void **msg,
                 uint64_t *sender_tag, size_t *length);
void *pc_ucx_msg_recv(ucp_worker_h worker, void *msg, ucp_dt_iov_t *iov, void *hdr, size_t hlen,
                      void *buf, size_t n, ucp_tag_recv_info_t *info, int *status);
int pc_ucx_test(void *req, int is_recv, ucp_tag_recv_info_t *info);
void pc_ucx_cancel(ucp_worker_h worker, void *req);
unsigned pc_ucx_progress(ucp_worker_h worker, int max);
int pc_ucx_print_info(ucp_context_h ctx, ucp_worker_h worker, const char *path);

"""
for _name in ("exec.h", "exec_ucx.h"):  # the executor's records, shared with exec_ucx.c
    with open(os.path.join(HERE, _name)) as _header:
        CDEF += "".join(line for line in _header if not line.startswith("#"))
CDEF += """
void pc_exec_start(pc_exec_t *e, uint64_t base);
void pc_exec_did(pc_exec_t *e, int i);
int pc_exec_progress(pc_exec_t *e);
int pc_exec_run(pc_exec_t *e, uint64_t base, int64_t spin_ns, int yield_every);
int pc_exec_repeat(pc_exec_t *e, uint64_t base, int iters);
void pc_exec_abort(pc_exec_t *e);
int pc_exec_reap(pc_exec_t *e);
"""

INCLUDE = ucx_include_dir()

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
if INCLUDE is not None:
    source = ""
    for name in ("ucx.c", "exec_ucx.c"):  # the binding, then the program executor
        with open(os.path.join(HERE, name)) as f:
            source += f.read() + "\n"
    ffibuilder.set_source(
        "pycoll._ucx",
        source,
        include_dirs=[INCLUDE, HERE],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-function"],
    )

if __name__ == "__main__":
    if INCLUDE is None:
        raise SystemExit("UCX headers not found: pip install libucx-cu12")
    ffibuilder.compile(verbose=True)
