/* route_sched: the thread-safe side of route_pick: one lock over the slots and the queue, a
 * condition variable that waiting connection threads sleep on, and the counters /metrics shows.
 * A request acquires a slot (at once, or after waiting its turn in the queue), and releases it
 * when its answer has ended. No sockets here: whether a waiting client is still there is asked
 * through a callback. See docs/route.md. */
#ifndef CSD_ROUTE_SCHED_H
#define CSD_ROUTE_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "route_pick.h"
#include "route_proxy.h"

/* Seconds an upstream whose connection failed is avoided ("down"). */
#define CSD_ROUTE_DOWN_S 5.0

/* Per-upstream counters, copied out under the lock for /metrics. */
typedef struct csd_route_upstream_stats {
    int max, in_flight, peak;
    bool down;
    long long requests; /* attempts sent to it (a request that fails over counts on each) */
    long long failures; /* attempts that failed: no connection, 429/5xx, or broken mid-answer */
} csd_route_upstream_stats;

typedef struct csd_route_stats {
    int n;
    csd_route_upstream_stats up[CSD_ROUTE_MAX_UPSTREAMS];
    int queue_depth;
    long long rejected; /* 429: the queue was full */
    long long timeouts; /* 503: waited --queue-timeout in the queue */
} csd_route_stats;

typedef struct csd_route_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast whenever a waiter may have been granted a slot */
    csd_route_slots slots;
    csd_route_queue queue;
    long long requests[CSD_ROUTE_MAX_UPSTREAMS];
    long long failures[CSD_ROUTE_MAX_UPSTREAMS];
    long long rejected, timeouts;
} csd_route_sched;

/* n upstreams of max[i] slots, at most queue_max waiting. 0 or CSD_EIO (pthread). */
int csd_route_sched_init(csd_route_sched *s, int n, const int *max, int queue_max);
void csd_route_sched_fini(csd_route_sched *s);
/* A slot for w (w->tried: the upstreams that already failed this request): its upstream's index,
 * its slot taken. A first attempt joins the back of the queue when it cannot start at once (or
 * others wait before it); a retry (failover) joins the front. Waits until `deadline` (seconds,
 * csd_now_s's clock), asking ab between waits. Negative on failure: CSD_EFULL (the queue is full),
 * CSD_ETIMEOUT (the deadline passed), CSD_ECANCELED (ab said stop), CSD_ENOTFOUND (every upstream
 * has failed this request). */
int csd_route_sched_acquire(csd_route_sched *s, csd_route_waiter *w, bool retry, double deadline,
                            const csd_route_abort *ab);
/* Gives back upstream i's slot. failed: the attempt failed (counted); down: its connection failed,
 * so it is avoided for CSD_ROUTE_DOWN_S. */
void csd_route_sched_release(csd_route_sched *s, int i, bool failed, bool down);
/* Counts a failure of upstream i after its slot was given back (an answer broken mid-way). */
void csd_route_sched_count_failure(csd_route_sched *s, int i);
/* Whether at least one upstream is not marked down now (/health). */
bool csd_route_sched_any_up(csd_route_sched *s);
void csd_route_sched_stats(csd_route_sched *s, csd_route_stats *out);

#endif
