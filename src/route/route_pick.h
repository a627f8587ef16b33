/* route_pick: which upstream a request goes to, and in what order waiting requests get a slot.
 * Pure bookkeeping with no I/O, no clock and no locks (the caller holds its own lock and passes
 * the time in), so every rule is unit-tested alone: the upstream with the most free slots wins
 * (ties: round robin), never more than max in flight anywhere, upstreams marked down are avoided,
 * and waiters are served first come, first served. See docs/route.md. */
#ifndef CSD_ROUTE_PICK_H
#define CSD_ROUTE_PICK_H

#include <stdbool.h>
#include <stdint.h>

/* Upstreams one router spreads over (a bit each in a request's `tried` mask). */
#define CSD_ROUTE_MAX_UPSTREAMS 32
/* Requests one upstream may hold at once (--max). */
#define CSD_ROUTE_MAX_IN_FLIGHT 1024

/* What csd_route_pick answers besides an upstream's index. */
enum csd_route_pick_result {
    CSD_ROUTE_PICK_BUSY = -1, /* an upstream is left to try, but none has a free slot: wait */
    CSD_ROUTE_PICK_NONE = -2, /* every upstream has been tried: the request fails */
};

/* Per-upstream counters, all under the caller's lock. */
typedef struct csd_route_upstream_state {
    int max;           /* slots (--max), 1..CSD_ROUTE_MAX_IN_FLIGHT */
    int in_flight;     /* slots taken now, 0..max */
    int peak;          /* the most in_flight ever was */
    double down_until; /* seconds on the caller's clock; avoided before it */
} csd_route_upstream_state;

typedef struct csd_route_slots {
    int n;         /* upstreams, 1..CSD_ROUTE_MAX_UPSTREAMS */
    unsigned next; /* round-robin cursor: where a tie is looked for first */
    csd_route_upstream_state up[CSD_ROUTE_MAX_UPSTREAMS];
} csd_route_slots;

/* A request waiting for a slot: lives on its connection thread's stack, linked into the queue. */
typedef struct csd_route_waiter {
    struct csd_route_waiter *prev, *next;
    uint32_t tried; /* bit i: upstream i already failed this request (never again) */
    bool queued;    /* in the queue now */
    int granted;    /* set when it leaves the queue: an upstream (its slot taken) or
                      * CSD_ROUTE_PICK_NONE; CSD_ROUTE_PICK_BUSY while it waits */
} csd_route_waiter;

/* First come, first served. Requests that failed over rejoin at the front (they already waited). */
typedef struct csd_route_queue {
    csd_route_waiter *head, *tail;
    int count; /* waiters in it now */
    int max;   /* what csd_route_queue_push_back admits (--queue); push_front is not bounded */
} csd_route_queue;

/* ---- slots ---- */

/* n upstreams with max[i] slots each; all up, none taken. */
void csd_route_slots_init(csd_route_slots *s, int n, const int *max);
/* The best upstream for a request that already failed on `tried`, its slot not yet taken: the one
 * with the most free slots among those not tried and not down at `now` (ties: the first from the
 * round-robin cursor on). When every untried upstream is down, the down ones are candidates too:
 * a mark is a guess, and trying is better than failing unasked. CSD_ROUTE_PICK_BUSY when the
 * candidates are all full, CSD_ROUTE_PICK_NONE when nothing is left to try. */
int csd_route_pick(const csd_route_slots *s, uint32_t tried, double now);
/* Takes a slot on upstream i (i from csd_route_pick, with a free slot) and moves the cursor past
 * it. */
void csd_route_take(csd_route_slots *s, int i);
/* Gives a slot of upstream i back. */
void csd_route_release(csd_route_slots *s, int i);
/* Avoids upstream i until `until` (its connection failed). */
void csd_route_mark_down(csd_route_slots *s, int i, double until);
bool csd_route_is_down(const csd_route_slots *s, int i, double now);

/* ---- the queue ---- */

void csd_route_queue_init(csd_route_queue *q, int max);
/* Appends w at the tail. false (w untouched) when max waiters already wait. */
bool csd_route_queue_push_back(csd_route_queue *q, csd_route_waiter *w);
/* Puts w at the head, whatever the bound: a request failing over was admitted already. */
void csd_route_queue_push_front(csd_route_queue *q, csd_route_waiter *w);
/* Takes w out (it must be queued). */
void csd_route_queue_remove(csd_route_queue *q, csd_route_waiter *w);
/* Gives slots to waiters in queue order: each that can start now gets its upstream's slot
 * (granted >= 0) and leaves the queue; one with nothing left to try leaves it with
 * CSD_ROUTE_PICK_NONE; one whose untried upstreams are all full stays, and those behind it may
 * still start elsewhere. Returns how many left the queue. */
int csd_route_dispatch(csd_route_slots *s, csd_route_queue *q, double now);

#endif
