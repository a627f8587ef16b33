/* A fleet pipeline over one worker that goes away and comes back on the same port: the
 * reconnector brings the chain back and it serves again, also after a first attempt met a
 * listener that accepts and never answers the handshake. Meanwhile another thread keeps asking
 * for the timing `cascadia bench --fleet` prints (it sends STATS on the links). The reconnector
 * rewrites the link table without the senders' lock while the fleet is down, so the timing must
 * not touch a link then: the ThreadSanitizer pass of scripts/test reports it as a race here if it
 * does. The silent listener holds a half-made link for longer than the timing's own wait, so the
 * timing reads the table while it is being rewritten in every run. The worker serves a whole tiny
 * synthetic model in this process, in insecure mode. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coord/fleet_pipeline.h"
#include "core/clock.h"
#include "stage/stage_server.h"
#include "test_synth.h"
#include "test_util.h"

#define MAX_CTX 32
#define OUTAGES 2
#define HANDSHAKE_MS 2500 /* the link's handshake limit: longer than the timing's 2 s wait */
#define RECONNECT_WAIT_MS 3500 /* a reconnect attempt (once a second) and its handshake limit */

typedef struct worker {
    csd_stage_server *server;
    pthread_t thread;
} worker;

static void *serve(void *arg) {
    worker *w = arg;
    csd_err err = {0};
    csd_stage_server_run(w->server, &err);
    return NULL;
}

/* The model's identity on the links: random, so that no other test's coordinator can take this
 * worker (or this fleet another test's worker) when a freed port is bound again. */
static uint8_t model_hash[CSD_WIRE_HASH_SIZE];

/* Starts a worker for model on 127.0.0.1:port (0: any free port); returns the port bound. */
static uint16_t worker_start(worker *w, csd_model *model, uint16_t port) {
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", (unsigned)port);
    csd_stage_opts so;
    memset(&so, 0, sizeof so);
    so.listen = listen;
    so.link.insecure = true;
    so.max_requests = 4;
    memcpy(so.model_hash, model_hash, sizeof model_hash);
    csd_err err = {0};
    if (csd_stage_server_create(&w->server, model, &so, &err)) fail_msg("worker: %s", err.msg);
    assert_int_equal(pthread_create(&w->thread, NULL, serve, w), 0);
    return csd_stage_server_port(w->server);
}

static void worker_stop(worker *w) {
    csd_stage_server_stop(w->server);
    pthread_join(w->thread, NULL);
    csd_stage_server_destroy(w->server);
    w->server = NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits up to ms for the pipeline to be (or stop being) ready. */
static bool wait_ready(csd_pipeline *p, bool want, int ms) {
    for (int waited = 0; waited < ms; waited += 20) {
        if (p->ops->ready(p) == want) return true;
        sleep_ms(20);
    }
    return p->ops->ready(p) == want;
}

/* A listener on 127.0.0.1:port that lets connections in (the kernel's backlog) and never
 * answers: a worker that hangs before its handshake. */
static int silent_listener(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 8), 0);
    return fd;
}

typedef struct timing_reader {
    csd_pipeline *pipe;
    atomic_bool stop;
    atomic_int reads;
} timing_reader;

static void *read_timing(void *arg) {
    timing_reader *r = arg;
    while (!atomic_load(&r->stop)) {
        csd_fleet_timing t;
        csd_fleet_pipeline_timing(r->pipe, &t);
        atomic_fetch_add(&r->reads, 1);
        sleep_ms(1);
    }
    return NULL;
}

/* One token through the whole chain: the fleet serves (opens, steps, closes) after a reconnect. */
static void one_step(csd_pipeline *p, uint32_t req, float *logits) {
    csd_err err = {0};
    if (p->ops->open(p, req, MAX_CTX, &err)) fail_msg("open: %s", err.msg);
    int32_t id = 1;
    csd_step_entry e = {.req = req, .ids = &id, .n = 1, .want_logits = true};
    if (p->ops->step_begin(p, &e, 1, logits, &err) || p->ops->step_end(p, NULL, &err))
        fail_msg("step: %s", err.msg);
    p->ops->close(p, req);
}

static void test_timing_read_while_fleet_reconnects(void **state) {
    (void)state;
    char dir[] = "/tmp/csd-fleet-XXXXXX";
    csd_model *model = csd_test_load_tiny(dir, MAX_CTX, 1);
    const csd_model_config *cfg = csd_model_cfg(model);
    assert_true(sodium_init() >= 0);
    randombytes_buf(model_hash, sizeof model_hash);
    worker w;
    uint16_t port = worker_start(&w, model, 0);

    csd_fleet_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.addrs[0], sizeof o.addrs[0], "127.0.0.1:%u", (unsigned)port);
    o.n_addrs = 1;
    o.layer_ranges[0][1] = (uint32_t)cfg->n_layers;
    o.cfg = *cfg;
    memcpy(o.model_hash, model_hash, sizeof model_hash);
    o.link.insecure = true;
    o.link.timeout_ms = HANDSHAKE_MS;
    o.hidden_dtype = CSD_DTYPE_F16;
    o.max_ctx = MAX_CTX;
    csd_pipeline *p = NULL;
    csd_err err = {0};
    if (csd_fleet_pipeline_create(&p, &o, NULL, 4, &err)) fail_msg("fleet: %s", err.msg);
    float *logits = calloc((size_t)cfg->vocab_size, sizeof *logits);
    assert_non_null(logits);
    one_step(p, 1, logits);

    timing_reader r = {.pipe = p};
    pthread_t reader;
    assert_int_equal(pthread_create(&reader, NULL, read_timing, &r), 0);
    for (int i = 0; i < OUTAGES; i++) {
        worker_stop(&w);
        assert_true(wait_ready(p, false, 10000));
        /* while the fleet is down the timing asks no stage, so it waits for no answer */
        uint64_t t0 = csd_now_ns();
        csd_fleet_timing t;
        csd_fleet_pipeline_timing(p, &t);
        assert_true(csd_now_ns() - t0 < 5000000000ull);
        if (i == 0) { /* the reconnector's next attempt stalls in the handshake */
            int silent = silent_listener(port);
            sleep_ms(RECONNECT_WAIT_MS);
            close(silent);
        }
        assert_int_equal(worker_start(&w, model, port), port);
        assert_true(wait_ready(p, true, 15000)); /* the reconnector tries once a second */
        one_step(p, (uint32_t)(2 + i), logits);
    }
    atomic_store(&r.stop, true);
    pthread_join(reader, NULL);
    assert_true(atomic_load(&r.reads) > 0);

    p->ops->destroy(p);
    worker_stop(&w);
    free(logits);
    csd_model_destroy(model);
    assert_int_equal(csd_test_remove_tree(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timing_read_while_fleet_reconnects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
