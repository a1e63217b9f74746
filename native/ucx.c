/* Thin C helpers over UCX's UCP tag API for pycoll.tl.ucx (built by native/ucx_build.py).
 *
 * The module is compiled against the libucx-cu12 wheel's headers but NOT linked to libucp: the
 * symbols are resolved when the module is imported, from a libucp that pycoll.tl.ucx.loader has
 * already loaded with RTLD_GLOBAL (MPICH's own copy if mpi4py loaded it first, else the wheel's).
 *
 * Every operation returns a request pointer or NULL and stores a status in *status:
 * UCS_OK (finished at once, nothing to free), UCS_INPROGRESS (a request: test it with
 * pc_ucx_test, which frees it once finished), or an error code (nothing to free).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

static void pc_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    *(int *)arg = (int)status;
}

static void *pc_ucx_result(ucs_status_ptr_t p, int *status)
{
    if (p == NULL) {
        *status = UCS_OK;
        return NULL;
    }
    if (UCS_PTR_IS_ERR(p)) {
        *status = UCS_PTR_STATUS(p);
        return NULL;
    }
    *status = UCS_INPROGRESS;
    return p;
}

static void pc_ucx_version(unsigned *major, unsigned *minor, unsigned *release)
{
    ucp_get_version(major, minor, release);
}

static void pc_ucx_header_version(unsigned *major, unsigned *minor)
{
    *major = UCP_API_MAJOR;
    *minor = UCP_API_MINOR;
}

static const char *pc_ucx_status_string(int status)
{
    return ucs_status_string((ucs_status_t)status);
}

/* Apply "NAME=VALUE" lines of settings (UCX names without the UCX_ prefix) to config, each only
 * where the environment does not set UCX_NAME (the user's word wins). A setting this UCX does not
 * know is skipped. The number applied. */
static int pc_ucx_apply_defaults(ucp_config_t *config, const char *settings)
{
    char line[256], env[272];
    const char *p = settings, *end, *eq;
    size_t n;
    int applied = 0;

    while (p != NULL && *p != '\0') {
        end = strchr(p, '\n');
        n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n > 0 && n < sizeof(line)) {
            memcpy(line, p, n);
            line[n] = '\0';
            eq = strchr(line, '=');
            if (eq != NULL && eq != line) {
                line[eq - line] = '\0';
                snprintf(env, sizeof(env), "UCX_%s", line);
                if (getenv(env) == NULL && ucp_config_modify(config, line, eq + 1) == UCS_OK)
                    applied++;
            }
        }
        p = end != NULL ? end + 1 : NULL;
    }
    return applied;
}

/* A context with the tag feature and one single-threaded worker; settings as for
 * pc_ucx_apply_defaults (may be empty). */
static int pc_ucx_init(unsigned api_major, unsigned api_minor, const char *settings, ucp_context_h *ctx,
                       ucp_worker_h *worker)
{
    ucp_config_t *config;
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucs_status_t st;

    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK)
        return st;
    pc_ucx_apply_defaults(config, settings);
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    st = ucp_init_version(api_major, api_minor, &params, config, ctx);
    ucp_config_release(config);
    if (st != UCS_OK)
        return st;
    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(*ctx, &wparams, worker);
    if (st != UCS_OK) {
        ucp_cleanup(*ctx);
        *ctx = NULL;
    }
    return st;
}

static void pc_ucx_fini(ucp_context_h ctx, ucp_worker_h worker)
{
    if (worker != NULL)
        ucp_worker_destroy(worker);
    if (ctx != NULL)
        ucp_cleanup(ctx);
}

/* Copy the worker's address into out (at most cap bytes); its length in *len. */
static int pc_ucx_address(ucp_worker_h worker, void *out, size_t cap, size_t *len)
{
    ucp_address_t *addr;
    ucs_status_t st = ucp_worker_get_address(worker, &addr, len);
    if (st != UCS_OK)
        return st;
    if (*len > cap) {
        ucp_worker_release_address(worker, addr);
        return UCS_ERR_BUFFER_TOO_SMALL;
    }
    memcpy(out, addr, *len);
    ucp_worker_release_address(worker, addr);
    return UCS_OK;
}

/* An endpoint to a remote worker; a transport error on it is stored in *err (with peer_mode, UCP's
 * peer error handling mode; without it, UCP's default mode). */
static int pc_ucx_ep_create(ucp_worker_h worker, const void *address, int peer_mode, int *err, ucp_ep_h *ep)
{
    ucp_ep_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = (const ucp_address_t *)address;
    params.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = pc_ucx_err_cb;
    params.err_handler.arg = err;
    return ucp_ep_create(worker, &params, ep);
}

static void *pc_ucx_ep_close(ucp_ep_h ep, int force, int *status)
{
    ucp_request_param_t param;
    memset(&param, 0, sizeof(param));
    if (force) {
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    return pc_ucx_result(ucp_ep_close_nbx(ep, &param), status);
}

/* Start flushing ep: done once every operation issued on it completed at the peer (which needs
 * the connection established: UCX's TCP transport connects lazily). */
static void *pc_ucx_ep_flush(ucp_ep_h ep, int *status)
{
    ucp_request_param_t param;
    memset(&param, 0, sizeof(param));
    return pc_ucx_result(ucp_ep_flush_nbx(ep, &param), status);
}

/* The index of the first nonzero error flag, or -1. */
static int pc_ucx_first_error(const int *flags, int n)
{
    for (int i = 0; i < n; i++)
        if (flags[i])
            return i;
    return -1;
}

static void *pc_ucx_send(ucp_ep_h ep, const void *buf, size_t n, uint64_t tag, int *status)
{
    ucp_request_param_t param;
    param.op_attr_mask = 0;
    return pc_ucx_result(ucp_tag_send_nbx(ep, buf, n, tag, &param), status);
}

/* Send a header and a payload as one message (an IOV; iov must live until completion). */
static void *pc_ucx_send2(ucp_ep_h ep, ucp_dt_iov_t *iov, const void *hdr, size_t hlen, const void *buf,
                          size_t n, uint64_t tag, int *status)
{
    ucp_request_param_t param;
    iov[0].buffer = (void *)hdr;
    iov[0].length = hlen;
    iov[1].buffer = (void *)buf;
    iov[1].length = n;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    return pc_ucx_result(ucp_tag_send_nbx(ep, iov, 2, tag, &param), status);
}

static void *pc_ucx_recv(ucp_worker_h worker, void *buf, size_t n, uint64_t tag, uint64_t mask,
                         ucp_tag_recv_info_t *info, int *status)
{
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO;
    param.recv_info.tag_info = info;
    return pc_ucx_result(ucp_tag_recv_nbx(worker, buf, n, tag, mask, &param), status);
}

/* Receive a header then a payload, as one message (an IOV; iov must live until completion). */
static void *pc_ucx_recv2(ucp_worker_h worker, ucp_dt_iov_t *iov, void *hdr, size_t hlen, void *buf, size_t n,
                          uint64_t tag, uint64_t mask, ucp_tag_recv_info_t *info, int *status)
{
    ucp_request_param_t param;
    iov[0].buffer = hdr;
    iov[0].length = hlen;
    iov[1].buffer = buf;
    iov[1].length = n;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FIELD_DATATYPE;
    param.recv_info.tag_info = info;
    param.datatype = ucp_dt_make_iov();
    return pc_ucx_result(ucp_tag_recv_nbx(worker, iov, 2, tag, mask, &param), status);
}

/* Whether a message matching (tag, mask) waits unreceived; with remove, take it: *msg is then its
 * handle for pc_ucx_msg_recv. */
static int pc_ucx_probe(ucp_worker_h worker, uint64_t tag, uint64_t mask, int remove, void **msg,
                        uint64_t *sender_tag, size_t *length)
{
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m = ucp_tag_probe_nb(worker, tag, mask, remove, &info);
    if (m == NULL)
        return 0;
    *msg = m;
    *sender_tag = info.sender_tag;
    *length = info.length;
    return 1;
}

/* Receive a probed message: into buf (hlen == 0) or a header then buf (an IOV). */
static void *pc_ucx_msg_recv(ucp_worker_h worker, void *msg, ucp_dt_iov_t *iov, void *hdr, size_t hlen,
                             void *buf, size_t n, ucp_tag_recv_info_t *info, int *status)
{
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO;
    param.recv_info.tag_info = info;
    if (hlen == 0)
        return pc_ucx_result(ucp_tag_msg_recv_nbx(worker, buf, n, (ucp_tag_message_h)msg, &param), status);
    iov[0].buffer = hdr;
    iov[0].length = hlen;
    iov[1].buffer = buf;
    iov[1].length = n;
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    return pc_ucx_result(ucp_tag_msg_recv_nbx(worker, iov, 2, (ucp_tag_message_h)msg, &param), status);
}

/* UCS_INPROGRESS while req runs; else its final status, after which req is freed (receives: the
 * received length and tag are stored in *info first). */
static int pc_ucx_test(void *req, int is_recv, ucp_tag_recv_info_t *info)
{
    ucs_status_t st = ucp_request_check_status(req);
    if (st == UCS_INPROGRESS)
        return st;
    if (is_recv)
        ucp_tag_recv_request_test(req, info);
    ucp_request_free(req);
    return st;
}

static void pc_ucx_cancel(ucp_worker_h worker, void *req)
{
    ucp_request_cancel(worker, req);
}

/* Progress the worker until it has nothing more to do (at most max rounds); total events. */
static unsigned pc_ucx_progress(ucp_worker_h worker, int max)
{
    unsigned total = 0, n;
    while (max-- > 0 && (n = ucp_worker_progress(worker)) != 0)
        total += n;
    return total;
}

/* ucp_context_print_info into a file (the path). */
static int pc_ucx_print_info(ucp_context_h ctx, ucp_worker_h worker, const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    ucp_context_print_info(ctx, f);
    if (worker != NULL)
        ucp_worker_print_info(worker, f);
    fclose(f);
    return 0;
}
