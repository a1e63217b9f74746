/* The simulator's event loop in C (pycoll.sim.engine.run's common case: links not shared, no
 * deaths, no timeline, no payload): the same events in the same order, so the same times to the
 * bit. Each rank issues its program's instructions in order once those they wait for are done; a
 * send books the sender's link out and the receiver's link in after what is booked there and
 * arrives alpha later; a receive is done once posted and its message arrived (messages between
 * two ranks match by step, in order); a reduction or copy holds the rank. A binary heap of
 * completions ordered by (time, sequence number), as the Python loop's heapq of tuples.
 *
 * Every array is the caller's (checked by it: pycoll.sim.engine.Compact); instructions of rank r
 * are [ioff[r], ioff[r + 1]) of the flat arrays, its dependents' index list first[foff[r] + i]..,
 * into dependents[doff[r] + ...] (instruction indices local to the rank). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pycoll_native.h"

enum { K_SEND, K_RECV, K_REDUCE, K_COPY, K_AVG };

typedef struct {
    double t;
    int64_t seq;
    int32_t r, i;
} ev_t;

typedef struct {
    ev_t *a;
    int64_t n, cap;
} heap_t;

static int ev_less(const ev_t *x, const ev_t *y) { return x->t < y->t || (x->t == y->t && x->seq < y->seq); }

static int heap_push(heap_t *h, double t, int64_t seq, int32_t r, int32_t i) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 1024;
        ev_t *a = realloc(h->a, (size_t)cap * sizeof(ev_t));
        if (!a) return -1;
        h->a = a, h->cap = cap;
    }
    int64_t k = h->n++;
    ev_t e = {t, seq, r, i};
    while (k > 0) {
        int64_t up = (k - 1) / 2;
        if (!ev_less(&e, &h->a[up])) break;
        h->a[k] = h->a[up];
        k = up;
    }
    h->a[k] = e;
    return 0;
}

static ev_t heap_pop(heap_t *h) {
    ev_t top = h->a[0], last = h->a[--h->n];
    int64_t k = 0, n = h->n;
    for (;;) {
        int64_t c = 2 * k + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_less(&h->a[c + 1], &h->a[c])) c++;
        if (!ev_less(&h->a[c], &last)) break;
        h->a[k] = h->a[c];
        k = c;
    }
    if (n) h->a[k] = last;
    return top;
}

/* The queues of one (receiver, sender, step): the arrivals no receive was posted for yet, or the
 * receives (instruction, when posted) no message came for yet: never both. Items are linked in a
 * pool; a table entry whose queue empties is removed (linear probing, backward-shift deletion). */
typedef struct {
    double v;
    int32_t instr, next;
} item_t;

typedef struct {
    uint64_t key; /* 0: empty */
    int32_t head, tail;
    int8_t waiting;
} slot_t;

typedef struct {
    slot_t *s;
    uint64_t mask, used;
    item_t *items;
    int32_t nitems, capitems, free;
} box_t;

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int box_grow(box_t *b) {
    uint64_t cap = b->s ? 2 * (b->mask + 1) : 1024;
    slot_t *old = b->s, *s = calloc(cap, sizeof(slot_t));
    if (!s) return -1;
    uint64_t oldcap = old ? b->mask + 1 : 0;
    b->s = s, b->mask = cap - 1;
    for (uint64_t k = 0; k < oldcap; k++) {
        if (!old[k].key) continue;
        uint64_t h = mix(old[k].key) & b->mask;
        while (s[h].key) h = (h + 1) & b->mask;
        s[h] = old[k];
    }
    free(old);
    return 0;
}

static slot_t *box_find(box_t *b, uint64_t key) {
    for (uint64_t h = mix(key) & b->mask;; h = (h + 1) & b->mask) {
        if (b->s[h].key == key) return &b->s[h];
        if (!b->s[h].key) return NULL;
    }
}

static slot_t *box_add(box_t *b, uint64_t key, int waiting) {
    if ((b->used + 1) * 2 > b->mask + 1 && box_grow(b)) return NULL;
    uint64_t h = mix(key) & b->mask;
    while (b->s[h].key) h = (h + 1) & b->mask;
    b->s[h].key = key, b->s[h].head = b->s[h].tail = -1, b->s[h].waiting = (int8_t)waiting;
    b->used++;
    return &b->s[h];
}

static void box_remove(box_t *b, slot_t *slot) {
    uint64_t hole = (uint64_t)(slot - b->s);
    b->s[hole].key = 0;
    b->used--;
    for (uint64_t k = (hole + 1) & b->mask; b->s[k].key; k = (k + 1) & b->mask) {
        uint64_t home = mix(b->s[k].key) & b->mask;
        /* move k back into the hole unless its home lies cyclically in (hole, k] */
        if (((k - home) & b->mask) >= ((k - hole) & b->mask)) {
            b->s[hole] = b->s[k];
            b->s[k].key = 0;
            hole = k;
        }
    }
}

static int item_append(box_t *b, slot_t *slot, double v, int32_t instr) {
    int32_t it = b->free;
    if (it >= 0) {
        b->free = b->items[it].next;
    } else {
        if (b->nitems == b->capitems) {
            if (b->capitems > INT32_MAX / 2) return -1;
            int32_t cap = b->capitems ? 2 * b->capitems : 1024;
            item_t *items = realloc(b->items, (size_t)cap * sizeof(item_t));
            if (!items) return -1;
            b->items = items, b->capitems = cap;
        }
        it = b->nitems++;
    }
    b->items[it].v = v, b->items[it].instr = instr, b->items[it].next = -1;
    if (slot->tail >= 0) b->items[slot->tail].next = it;
    else slot->head = it;
    slot->tail = it;
    return 0;
}

/* the first item of slot's queue, taken out (the slot is removed when its queue empties) */
static item_t item_take(box_t *b, slot_t *slot) {
    int32_t it = slot->head;
    item_t out = b->items[it];
    slot->head = out.next;
    b->items[it].next = b->free;
    b->free = it;
    if (slot->head < 0) box_remove(b, slot);
    return out;
}

static uint64_t box_key(int32_t receiver, int32_t sender, int32_t step) {
    return ((uint64_t)(uint32_t)receiver << 42 | (uint64_t)(uint32_t)sender << 21 | (uint64_t)(uint32_t)step) + 1;
}

int pycoll_sim_run(int32_t n, const int64_t *ioff, const int8_t *kinds, const int32_t *peers,
                   const int32_t *steps, const int64_t *nbytes, const int32_t *ndeps, const int64_t *foff,
                   const int32_t *first, const int64_t *doff, const int32_t *dependents,
                   const pc_sim_machine_t *m, const double *starts, const double *factor, double *finish,
                   int64_t *left, int64_t *stats) {
    if (n < 1 || n >= (1 << 21)) return PC_EINVAL;
    int64_t total = ioff[n];
    int32_t *rem = malloc((size_t)(total ? total : 1) * sizeof(int32_t));
    int32_t *nxt = calloc((size_t)n, sizeof(int32_t));
    double *tx_free = calloc((size_t)n, sizeof(double)), *rx_free = calloc((size_t)n, sizeof(double));
    double *cpu_free = malloc((size_t)n * sizeof(double));
    heap_t heap = {0};
    box_t box = {0};
    box.free = -1;
    int rc = PC_ENOMEM;
    if (!rem || !nxt || !tx_free || !rx_free || !cpu_free || box_grow(&box)) goto out;
    memcpy(rem, ndeps, (size_t)total * sizeof(int32_t));
    for (int32_t r = 0; r < n; r++) { /* everything indexed below, checked first */
        finish[r] = cpu_free[r] = starts[r];
        int64_t count = ioff[r + 1] - ioff[r], ndep = doff[r + 1] - doff[r];
        left[r] = count;
        if (count < 0 || count >= INT32_MAX || ndep < 0 || foff[r + 1] - foff[r] != count + 1) goto bad;
        const int32_t *fr = first + foff[r], *dep = dependents + doff[r];
        if (fr[0] != 0 || fr[count] != ndep) goto bad;
        for (int64_t i = 0; i < count; i++) {
            int64_t k = ioff[r] + i;
            if (kinds[k] < K_SEND || kinds[k] > K_AVG || fr[i + 1] < fr[i] || ndeps[k] < 0 || nbytes[k] < 0) goto bad;
            if ((kinds[k] == K_SEND || kinds[k] == K_RECV) && /* every step must fit its key's bits */
                (steps[k] < 0 || steps[k] >= (1 << 21) || peers[k] < 0 || peers[k] >= n))
                goto bad;
        }
        for (int64_t j = 0; j < ndep; j++)
            if (dep[j] < 0 || dep[j] >= count) goto bad;
    }
    int64_t seq = n, events = 0, messages = 0, sent = 0;
    const double o = m->overhead;
    int32_t r = 0;
    double t = 0.0;
    int starting = 1; /* the ranks' first instructions, in rank order, before any completion */
    for (;;) {
        if (starting) {
            if (r == n) {
                starting = 0;
                continue;
            }
            t = starts[r];
        } else {
            if (!heap.n) break;
            ev_t e = heap_pop(&heap);
            t = e.t, r = e.r;
            int32_t i = e.i;
            events++;
            left[r]--;
            if (t > finish[r]) finish[r] = t;
            const int32_t *dep = dependents + doff[r];
            int32_t *rr = rem + ioff[r];
            for (int32_t k = first[foff[r] + i]; k < first[foff[r] + i + 1]; k++) rr[dep[k]]--;
        }
        /* issue rank r's next instructions in order while their dependencies are done */
        const int64_t base = ioff[r];
        const int32_t count = (int32_t)(ioff[r + 1] - base);
        const double f = factor[r];
        int32_t i = nxt[r];
        while (i < count && rem[base + i] == 0) {
            const int64_t g = base + i;
            const int k = kinds[g];
            if (k == K_SEND) {
                int32_t d = peers[g];
                int64_t nb = nbytes[g];
                double post = o + (double)nb * m->overhead_per_byte; /* LogGOPS's o + nO */
                double t0 = (t > cpu_free[r] ? t : cpu_free[r]) + post * f;
                cpu_free[r] = t0;
                int near = m->ppn > 1 && r / m->ppn == d / m->ppn;
                double alpha = near ? m->node_alpha : m->alpha, per_byte = near ? m->node_per_byte : m->per_byte;
                if (m->rendezvous_bytes && nb >= m->rendezvous_bytes) alpha += m->rendezvous;
                messages++;
                sent += nb;
                seq++;
                double b = tx_free[r];
                if (b < t0) b = t0;
                if (b < rx_free[d]) b = rx_free[d];
                double end = b + (double)nb * per_byte * f;
                tx_free[r] = rx_free[d] = end > b + m->gap ? end : b + m->gap; /* LogGP's g */
                if (heap_push(&heap, end, seq, r, i)) goto out;
                /* deliver: to the receive posted for it, or to the mailbox */
                double arrival = end + alpha;
                uint64_t key = box_key(d, r, steps[g]);
                slot_t *slot = box_find(&box, key);
                if (slot && slot->waiting) {
                    item_t w = item_take(&box, slot);
                    seq++;
                    if (heap_push(&heap, arrival > w.v ? arrival : w.v, seq, d, w.instr)) goto out;
                } else {
                    if (!slot && !(slot = box_add(&box, key, 0))) goto out;
                    if (item_append(&box, slot, arrival, -1)) goto out;
                }
            } else if (k == K_RECV) {
                double post = o + (double)nbytes[g] * m->overhead_per_byte; /* LogGOPS's o + nO */
                double t0 = (t > cpu_free[r] ? t : cpu_free[r]) + post * f;
                cpu_free[r] = t0;
                uint64_t key = box_key(r, peers[g], steps[g]);
                slot_t *slot = box_find(&box, key);
                if (slot && !slot->waiting) {
                    item_t a = item_take(&box, slot);
                    seq++;
                    if (heap_push(&heap, a.v > t0 ? a.v : t0, seq, r, i)) goto out;
                } else {
                    if (!slot && !(slot = box_add(&box, key, 1))) goto out;
                    if (item_append(&box, slot, t0, i)) goto out;
                }
            } else {
                double bw = k == K_REDUCE ? m->reduce_bw : m->copy_bw;
                double t0 = t > cpu_free[r] ? t : cpu_free[r];
                double end = t0 + (isinf(bw) ? 0.0 : (double)nbytes[g] / bw) * f;
                cpu_free[r] = end;
                seq++;
                if (heap_push(&heap, end, seq, r, i)) goto out;
            }
            i++;
        }
        nxt[r] = i;
        if (starting) r++;
    }
    stats[0] = events, stats[1] = messages, stats[2] = sent;
    rc = PC_OK;
    goto out;
bad:
    rc = PC_EINVAL;
out:
    free(rem), free(nxt), free(tx_free), free(rx_free), free(cpu_free), free(heap.a), free(box.s), free(box.items);
    return rc;
}
