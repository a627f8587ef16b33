/* route_pick: slot choice and the waiting queue (see route_pick.h). */
#include "route_pick.h"

#include <stddef.h>
#include <string.h>

void csd_route_slots_init(csd_route_slots *s, int n, const int *max) {
    memset(s, 0, sizeof *s);
    s->n = n < 0 ? 0 : n > CSD_ROUTE_MAX_UPSTREAMS ? CSD_ROUTE_MAX_UPSTREAMS : n;
    for (int i = 0; i < s->n; i++) s->up[i].max = max[i];
}

bool csd_route_is_down(const csd_route_slots *s, int i, double now) {
    return now < s->up[i].down_until;
}

/* The best candidate (most free slots, ties from the cursor on) among the untried ones, taking
 * down upstreams only when allow_down. -1 when none has a free slot; *any tells whether there was a
 * candidate at all. */
static int best_free(const csd_route_slots *s, uint32_t tried, double now, bool allow_down,
                     bool *any) {
    int best = -1, best_free_slots = 0;
    *any = false;
    for (int k = 0; k < s->n; k++) {
        int i = (int)((s->next + (unsigned)k) % (unsigned)s->n);
        if (tried & (UINT32_C(1) << i)) continue;
        if (!allow_down && csd_route_is_down(s, i, now)) continue;
        *any = true;
        int free_slots = s->up[i].max - s->up[i].in_flight;
        if (free_slots > best_free_slots) { /* strictly more: the first from the cursor wins ties */
            best = i;
            best_free_slots = free_slots;
        }
    }
    return best;
}

int csd_route_pick(const csd_route_slots *s, uint32_t tried, double now) {
    bool any = false;
    int i = best_free(s, tried, now, false, &any);
    if (i >= 0) return i;
    if (any) return CSD_ROUTE_PICK_BUSY; /* an upstream that is up will free a slot: wait for it */
    i = best_free(s, tried, now, true, &any);
    if (i >= 0) return i;
    return any ? CSD_ROUTE_PICK_BUSY : CSD_ROUTE_PICK_NONE;
}

void csd_route_take(csd_route_slots *s, int i) {
    csd_route_upstream_state *u = &s->up[i];
    if (u->in_flight < u->max) u->in_flight++;
    if (u->in_flight > u->peak) u->peak = u->in_flight;
    s->next = (unsigned)(i + 1) % (unsigned)s->n;
}

void csd_route_release(csd_route_slots *s, int i) {
    if (s->up[i].in_flight > 0) s->up[i].in_flight--;
}

void csd_route_mark_down(csd_route_slots *s, int i, double until) {
    if (until > s->up[i].down_until) s->up[i].down_until = until;
}

/* ---- the queue ---- */

void csd_route_queue_init(csd_route_queue *q, int max) {
    memset(q, 0, sizeof *q);
    q->max = max < 0 ? 0 : max;
}

bool csd_route_queue_push_back(csd_route_queue *q, csd_route_waiter *w) {
    if (q->count >= q->max) return false;
    w->next = NULL;
    w->prev = q->tail;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    q->count++;
    w->queued = true;
    w->granted = CSD_ROUTE_PICK_BUSY;
    return true;
}

void csd_route_queue_push_front(csd_route_queue *q, csd_route_waiter *w) {
    w->prev = NULL;
    w->next = q->head;
    if (q->head)
        q->head->prev = w;
    else
        q->tail = w;
    q->head = w;
    q->count++;
    w->queued = true;
    w->granted = CSD_ROUTE_PICK_BUSY;
}

void csd_route_queue_remove(csd_route_queue *q, csd_route_waiter *w) {
    if (!w->queued) return;
    if (w->prev)
        w->prev->next = w->next;
    else
        q->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    w->prev = w->next = NULL;
    w->queued = false;
    q->count--;
}

int csd_route_dispatch(csd_route_slots *s, csd_route_queue *q, double now) {
    int left = 0;
    for (csd_route_waiter *w = q->head, *next; w; w = next) {
        next = w->next;
        int r = csd_route_pick(s, w->tried, now);
        if (r == CSD_ROUTE_PICK_BUSY) continue;
        if (r >= 0) csd_route_take(s, r);
        csd_route_queue_remove(q, w);
        w->granted = r;
        left++;
    }
    return left;
}
