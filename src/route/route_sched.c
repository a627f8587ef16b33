/* route_sched: slots and the queue under one lock (see route_sched.h). */
#include "route_sched.h"

#include <string.h>

#include "core/clock.h"
#include "core/err.h"

/* How long a waiter sleeps before it asks whether its client is still there (ms). */
#define WAIT_POLL_MS 50

int csd_route_sched_init(csd_route_sched *s, int n, const int *max, int queue_max) {
    memset(s, 0, sizeof *s);
    if (pthread_mutex_init(&s->mu, NULL)) return CSD_EIO;
    if (pthread_cond_init(&s->cv, NULL)) {
        pthread_mutex_destroy(&s->mu);
        return CSD_EIO;
    }
    csd_route_slots_init(&s->slots, n, max);
    csd_route_queue_init(&s->queue, queue_max);
    return 0;
}

void csd_route_sched_fini(csd_route_sched *s) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

/* mu held: the waiter got its answer from dispatch; counts an attempt on a granted upstream. */
static int granted(csd_route_sched *s, const csd_route_waiter *w) {
    if (w->granted >= 0) {
        s->requests[w->granted]++;
        return w->granted;
    }
    return CSD_ENOTFOUND;
}

/* mu held: leaves the queue without a slot. */
static int give_up(csd_route_sched *s, csd_route_waiter *w, int code) {
    csd_route_queue_remove(&s->queue, w);
    if (code == CSD_ETIMEOUT) s->timeouts++;
    /* leaving may let one behind it start (it waited on an upstream this one had not tried) */
    if (csd_route_dispatch(&s->slots, &s->queue, csd_now_s())) pthread_cond_broadcast(&s->cv);
    return code;
}

int csd_route_sched_acquire(csd_route_sched *s, csd_route_waiter *w, bool retry, double deadline,
                            const csd_route_abort *ab) {
    pthread_mutex_lock(&s->mu);
    double now = csd_now_s();
    /* first come, first served: a new request starts at once only when nobody waits */
    int r =
        s->queue.count && !retry ? CSD_ROUTE_PICK_BUSY : csd_route_pick(&s->slots, w->tried, now);
    if (r >= 0 || r == CSD_ROUTE_PICK_NONE) {
        if (r >= 0) csd_route_take(&s->slots, r);
        w->granted = r;
        r = granted(s, w);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    if (retry) {
        csd_route_queue_push_front(&s->queue, w);
    } else if (!csd_route_queue_push_back(&s->queue, w)) {
        s->rejected++;
        pthread_mutex_unlock(&s->mu);
        return CSD_EFULL;
    }
    /* those before it may be waiting for upstreams they have not tried: a free slot elsewhere
     * is this one's */
    if (csd_route_dispatch(&s->slots, &s->queue, now)) pthread_cond_broadcast(&s->cv);
    int rc = 0;
    while (w->queued) {
        if (ab && ab->stop(ab->ctx)) {
            rc = give_up(s, w, CSD_ECANCELED);
            break;
        }
        if (csd_now_s() >= deadline) {
            rc = give_up(s, w, CSD_ETIMEOUT);
            break;
        }
        struct timespec ts = csd_realtime_in_ms(WAIT_POLL_MS);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        /* a down mark may have expired meanwhile: look again without waiting for a release */
        if (w->queued && csd_route_dispatch(&s->slots, &s->queue, csd_now_s()))
            pthread_cond_broadcast(&s->cv);
    }
    if (!rc) rc = granted(s, w);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void csd_route_sched_release(csd_route_sched *s, int i, bool failed, bool down) {
    pthread_mutex_lock(&s->mu);
    double now = csd_now_s();
    csd_route_release(&s->slots, i);
    if (failed) s->failures[i]++;
    if (down) csd_route_mark_down(&s->slots, i, now + CSD_ROUTE_DOWN_S);
    if (csd_route_dispatch(&s->slots, &s->queue, now)) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void csd_route_sched_count_failure(csd_route_sched *s, int i) {
    pthread_mutex_lock(&s->mu);
    s->failures[i]++;
    pthread_mutex_unlock(&s->mu);
}

bool csd_route_sched_any_up(csd_route_sched *s) {
    pthread_mutex_lock(&s->mu);
    double now = csd_now_s();
    bool up = false;
    for (int i = 0; i < s->slots.n && !up; i++) up = !csd_route_is_down(&s->slots, i, now);
    pthread_mutex_unlock(&s->mu);
    return up;
}

void csd_route_sched_stats(csd_route_sched *s, csd_route_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    double now = csd_now_s();
    out->n = s->slots.n;
    for (int i = 0; i < s->slots.n; i++) {
        const csd_route_upstream_state *u = &s->slots.up[i];
        out->up[i] = (csd_route_upstream_stats){
            u->max,         u->in_flight,  u->peak, csd_route_is_down(&s->slots, i, now),
            s->requests[i], s->failures[i]};
    }
    out->queue_depth = s->queue.count;
    out->rejected = s->rejected;
    out->timeouts = s->timeouts;
    pthread_mutex_unlock(&s->mu);
}
