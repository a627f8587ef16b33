/* test_http_server: the HTTP layer before a model is ready (no engine): /health and the API answer
 * 503 with Retry-After, /metrics says not ready, and routing, methods, the API key and the body
 * limit give 404/405/401/413 with OpenAI error bodies; the connection limits (all, per IP
 * address) and the idle timeout hold. With an engine but without the tokens' bytes, constrained
 * answers (response_format JSON, forced tool calls) are a 400 naming the field. Loopback,
 * ephemeral port, bounded waits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "coord/engine.h"
#include "coord/pipeline.h"
#include "core/alloc.h"
#include "http/server.h"
#include "test_synth.h"
#include "test_util.h"
#include "tok/tokenizer.h"

/* A tiny SentencePiece-style tokenizer (the server only needs one to exist here). */
static const char tiny_tok[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, "
    "\"content\": \"<s>\", \"special\": true}], \"normalizer\": null, \"pre_tokenizer\": null, "
    "\"decoder\": null, \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": "
    "{\"<unk>\": 0, \"<s>\": 1, \"a\": 2, \"b\": 3}, \"merges\": []}}";

typedef struct fixture {
    csd_tok *tok;
    csd_http_server *srv;
    int port;
} fixture;

static int setup(void **state) {
    fixture *f = csd_alloc(sizeof *f);
    csd_err err = {0};
    if (csd_tok_load_mem(&f->tok, tiny_tok, strlen(tiny_tok), NULL, 0, &err)) {
        printf("tokenizer: %s\n", err.msg);
        return -1;
    }
    csd_http_opts o;
    csd_http_opts_default(&o);
    o.port = 0;
    o.api_key = "k3y";
    o.model_name = "tiny";
    o.max_body = 1024;
    if (csd_http_server_create(&f->srv, &o, f->tok, NULL, &err)) {
        printf("server: %s\n", err.msg);
        return -1;
    }
    f->port = csd_http_server_port(f->srv);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    csd_http_server_destroy(f->srv);
    csd_tok_destroy(f->tok);
    csd_free(f);
    return 0;
}

/* Sends req (a whole HTTP/1.1 request) and reads the response until the server closes. The status,
 * or 0 when the server closed the connection without an answer. */
/* A TCP connection to the server on port (loopback). */
static int connect_local(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static int roundtrip(int port, const char *req, char *resp, size_t cap) {
    int fd = connect_local(port);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t len = strlen(req);
    size_t n = 0;
    bool sent = send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len; /* no: closed unanswered */
    while (sent && n + 1 < cap) {
        ssize_t r = recv(fd, resp + n, cap - 1 - n, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    resp[n] = 0;
    close(fd);
    int status = 0;
    sscanf(resp, "HTTP/1.%*d %d", &status);
    return status;
}

static const char *body_of(const char *resp) {
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

static void test_health_loading(void **state) {
    fixture *f = *state;
    char resp[8192];
    int st = roundtrip(f->port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       resp, sizeof resp);
    assert_int_equal(st, 503);
    assert_string_equal(body_of(resp), "{\"status\":\"loading\"}");
    assert_non_null(strcasestr(resp, "\r\nRetry-After: "));
}

static void test_api_loading(void **state) {
    fixture *f = *state;
    char resp[8192];
    const char *req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Authorization: Bearer k3y\r\nContent-Type: application/json\r\n"
                      "Content-Length: 2\r\n\r\n{}";
    assert_int_equal(roundtrip(f->port, req, resp, sizeof resp), 503);
    assert_non_null(strcasestr(resp, "\r\nRetry-After: "));
    assert_non_null(strstr(body_of(resp), "\"error\""));
}

static void test_metrics_not_ready(void **state) {
    fixture *f = *state;
    char resp[16384];
    assert_int_equal(roundtrip(f->port,
                               "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               resp, sizeof resp),
                     200);
    assert_non_null(strstr(resp, "\ncascadia_ready 0\n"));
    assert_non_null(strstr(resp, "# TYPE cascadia_requests_total counter\n"));
    assert_non_null(strstr(resp, "cascadia_time_to_first_token_seconds_count 0\n"));
}

/* After csd_http_server_drain: /health and new generation requests get 503 shutting down (with
 * Connection: close, even to a client that asked to keep it), /metrics still answers and shows the
 * drain, and a refused request does not stay counted in flight. */
static void test_drain_refuses_new_requests(void **state) {
    (void)state;
    void *own; /* a server of its own: the group's must not drain */
    assert_int_equal(setup(&own), 0);
    fixture *f = own;
    char resp[16384];
    csd_http_server_drain(f->srv);
    assert_int_equal(roundtrip(f->port,
                               "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               resp, sizeof resp),
                     503);
    assert_string_equal(body_of(resp), "{\"status\":\"shutting_down\"}");
    const char *req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      "Authorization: Bearer k3y\r\nContent-Type: application/json\r\n"
                      "Content-Length: 2\r\n\r\n{}";
    assert_int_equal(roundtrip(f->port, req, resp, sizeof resp), 503);
    assert_non_null(strstr(body_of(resp), "\"code\":\"server_shutting_down\""));
    assert_non_null(strcasestr(resp, "\r\nConnection: close\r\n"));
    /* the count drops once MHD has completed the request, just after the client saw it */
    for (int i = 0; i < 500 && csd_http_server_in_flight(f->srv) > 0; i++) usleep(10000);
    assert_int_equal(csd_http_server_in_flight(f->srv), 0);
    assert_int_equal(roundtrip(f->port,
                               "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               resp, sizeof resp),
                     200);
    assert_non_null(strstr(resp, "\ncascadia_draining 1\n"));
    assert_non_null(strstr(resp, "\ncascadia_http_requests_in_flight 0\n"));
    teardown(&own);
}

static void test_routes_methods_auth_limits(void **state) {
    fixture *f = *state;
    char resp[8192];
    assert_int_equal(roundtrip(f->port,
                               "GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               resp, sizeof resp),
                     404);
    assert_non_null(strstr(body_of(resp), "\"type\":\"invalid_request_error\""));
    assert_int_equal(roundtrip(f->port,
                               "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: Bearer k3y\r\n\r\n",
                               resp, sizeof resp),
                     405);
    assert_non_null(strcasestr(resp, "\r\nAllow: POST"));
    assert_int_equal(roundtrip(f->port,
                               "DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               resp, sizeof resp),
                     405);
    /* no key, a wrong key, a key without Bearer */
    assert_int_equal(roundtrip(f->port,
                               "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               resp, sizeof resp),
                     401);
    assert_non_null(strstr(body_of(resp), "invalid_api_key"));
    assert_int_equal(roundtrip(f->port,
                               "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: Bearer k3yy\r\n\r\n",
                               resp, sizeof resp),
                     401);
    assert_int_equal(roundtrip(f->port,
                               "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: k3y\r\n\r\n",
                               resp, sizeof resp),
                     401);
    assert_int_equal(roundtrip(f->port,
                               "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: Bearer k3y\r\n\r\n",
                               resp, sizeof resp),
                     200);
    assert_non_null(strstr(body_of(resp), "\"id\":\"tiny\""));
    assert_int_equal(roundtrip(f->port,
                               "GET /v1/models/other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: Bearer k3y\r\n\r\n",
                               resp, sizeof resp),
                     404);
    assert_non_null(strstr(body_of(resp), "model_not_found"));
    /* body limit (1024 here): declared far beyond, and actually sent beyond */
    assert_int_equal(roundtrip(f->port,
                               "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: Bearer k3y\r\nContent-Length: 100000000\r\n\r\n",
                               resp, sizeof resp),
                     413);
    /* a Content-Length that is not a plain number (libmicrohttpd parses it before we see it), or
     * one beyond 64 bits */
    const char *bad_lengths[] = {"abc", "-1", "+5", "0x2", "2x"};
    for (int i = 0; i < (int)(sizeof bad_lengths / sizeof *bad_lengths); i++) {
        char req[256];
        snprintf(req, sizeof req,
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 "Authorization: Bearer k3y\r\nContent-Length: %s\r\n\r\n{}",
                 bad_lengths[i]);
        assert_int_equal(roundtrip(f->port, req, resp, sizeof resp), 400);
    }
    assert_int_equal(roundtrip(f->port,
                               "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Authorization: Bearer k3y\r\n"
                               "Content-Length: 99999999999999999999999\r\n\r\n{}",
                               resp, sizeof resp),
                     413);
    char big[4096];
    int n = snprintf(big, sizeof big,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Authorization: Bearer k3y\r\nContent-Length: 2000\r\n\r\n");
    memset(big + n, 'x', 2000);
    big[n + 2000] = 0;
    assert_int_equal(roundtrip(f->port, big, resp, sizeof resp), 413);
    assert_non_null(strstr(body_of(resp), "request_too_large"));
}

/* A server of its own (no API key) with the given connection options. */
static csd_http_server *limited_server(const fixture *f, int max_conns, int per_ip, int idle_s) {
    csd_http_opts o;
    csd_http_opts_default(&o);
    o.port = 0;
    o.model_name = "tiny";
    o.max_connections = max_conns;
    o.max_per_ip = per_ip;
    o.idle_timeout_s = idle_s;
    csd_http_server *srv = NULL;
    csd_err err = {0};
    if (csd_http_server_create(&srv, &o, f->tok, NULL, &err)) printf("server: %s\n", err.msg);
    assert_non_null(srv);
    return srv;
}

/* A connection that has sent the start of a request and then nothing more. */
static int idle_client(int port) {
    int fd = connect_local(port);
    assert_int_equal(send(fd, "GET /health HTTP/1.1\r\n", 22, MSG_NOSIGNAL), 22);
    return fd;
}

/* Waits up to timeout_ms for the server to close fd (EOF or reset): 1 if it did, 0 if not. */
static int closed_by_server(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) <= 0) return 0;
    char c;
    return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Sends req until it is answered (up to 5 s: the server frees a place on its own time). */
static int roundtrip_retry(int port, const char *req, char *resp, size_t cap) {
    int status = 0;
    for (int i = 0; i < 50 && status == 0; i++) {
        status = roundtrip(port, req, resp, cap);
        if (status == 0) usleep(100 * 1000);
    }
    return status;
}

/* Connects to the test server and sends the head of a chunked POST. */
static int chunked_client(int port) {
    int fd = connect_local(port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Authorization: Bearer k3y\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_int_equal(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    return fd;
}

/* Sends n chunks of 1000 bytes; false once the server has stopped taking them. */
static bool send_chunks(int fd, int n) {
    char chunk[1024];
    int len = snprintf(chunk, sizeof chunk, "3e8\r\n");
    memset(chunk + len, 'x', 1000);
    memcpy(chunk + len + 1000, "\r\n", 2);
    len += 1002;
    for (int i = 0; i < n; i++)
        if (send(fd, chunk, (size_t)len, MSG_NOSIGNAL) != len) return false;
    return true;
}

/* A body without a length (chunked) is held to the limit too (1024 here): a little over it is
 * read and answered 413; one that goes on beyond 16 times the limit is not read to its end (a
 * client could send forever), the connection is closed unanswered. */
static void test_chunked_body_limits(void **state) {
    const fixture *f = *state;
    int fd = chunked_client(f->port);
    assert_true(send_chunks(fd, 2));
    assert_int_equal(send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL), 5);
    char resp[4096];
    ssize_t n = recv(fd, resp, sizeof resp - 1, 0);
    assert_true(n > 0);
    resp[n] = 0;
    int status = 0;
    sscanf(resp, "HTTP/1.%*d %d", &status);
    assert_int_equal(status, 413);
    close(fd);

    fd = chunked_client(f->port);
    send_chunks(fd, 64); /* 64000 bytes and no end: may fail once the server has closed */
    assert_true(closed_by_server(fd, 10000));
    n = recv(fd, resp, sizeof resp - 1, MSG_DONTWAIT);
    assert_true(n <= 0); /* nothing was answered */
    close(fd);
}

static const char health_req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/* With two places held by idle clients, a third connection is closed unanswered; once they have
 * gone the server answers again. The idle timeout is a minute here, so that a slow moment on a
 * loaded machine cannot free a place before the third arrives. */
static void test_connection_limit(void **state) {
    csd_http_server *srv = limited_server(*state, 2, 0, 60);
    int port = csd_http_server_port(srv);
    int idle[2] = {idle_client(port), idle_client(port)};
    char resp[4096];
    assert_int_equal(roundtrip(port, health_req, resp, sizeof resp), 0);
    assert_string_equal(resp, "");
    for (int i = 0; i < 2; i++) close(idle[i]);
    assert_int_equal(roundtrip_retry(port, health_req, resp, sizeof resp), 503); /* no engine */
    csd_http_server_destroy(srv);
}

/* The idle timeout (1 s) closes a connection that went quiet, a second after it did. */
static void test_idle_timeout(void **state) {
    csd_http_server *srv = limited_server(*state, 8, 0, 1);
    int port = csd_http_server_port(srv);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int fd = idle_client(port);
    assert_true(closed_by_server(fd, 30000));
    assert_true(seconds_since(&t0) >= 0.5); /* the timeout closed it, not something else */
    close(fd);
    char resp[4096];
    assert_int_equal(roundtrip_retry(port, health_req, resp, sizeof resp), 503);
    csd_http_server_destroy(srv);
}

/* With one place per address, a second connection from 127.0.0.1 is closed unanswered, and a
 * new one is served once the first has gone. */
static void test_per_ip_limit(void **state) {
    csd_http_server *srv = limited_server(*state, 8, 1, 60);
    int port = csd_http_server_port(srv);
    int first = idle_client(port);
    char resp[4096];
    assert_int_equal(roundtrip(port, health_req, resp, sizeof resp), 0);
    assert_string_equal(resp, "");
    assert_false(closed_by_server(first, 0)); /* the first one keeps its place */
    close(first);
    assert_int_equal(roundtrip_retry(port, health_req, resp, sizeof resp), 503);
    csd_http_server_destroy(srv);
}

/* Options beyond their bounds are refused with a message, not clamped. */
static void test_connection_options_refused(void **state) {
    const fixture *f = *state;
    csd_http_opts o;
    csd_http_opts_default(&o);
    o.port = 0;
    o.model_name = "tiny";
    csd_http_server *srv = NULL;
    csd_err err = {0};
    o.max_connections = CSD_HTTP_MAX_CONNECTIONS_LIMIT + 1;
    assert_int_equal(csd_http_server_create(&srv, &o, f->tok, NULL, &err), CSD_ERANGE);
    assert_non_null(strstr(err.msg, "max connections"));
    csd_http_opts_default(&o);
    o.port = 0;
    o.model_name = "tiny";
    o.max_per_ip = o.max_connections + 1;
    assert_int_equal(csd_http_server_create(&srv, &o, f->tok, NULL, &err), CSD_ERANGE);
    assert_non_null(strstr(err.msg, "per IP address"));
    csd_http_opts_default(&o);
    o.port = 0;
    o.model_name = "tiny";
    o.idle_timeout_s = CSD_HTTP_IDLE_TIMEOUT_LIMIT + 1;
    assert_int_equal(csd_http_server_create(&srv, &o, f->tok, NULL, &err), CSD_ERANGE);
    assert_non_null(strstr(err.msg, "idle timeout"));
    assert_null(srv);
}

/* A ready server whose options have no json_vocab (a build of the server without the tokens'
 * bytes): what constrained decoding needs is missing, so such requests are a 400 naming the
 * field, while a plain one is taken. */
static void test_constrained_without_vocab(void **state) {
    fixture *f = *state;
    char dir[64] = "/tmp/csd-http-XXXXXX";
    csd_model *model = csd_test_load_tiny(dir, 64, 1);
    csd_pipeline *pipe = NULL;
    csd_engine *engine = NULL;
    csd_err err = {0};
    assert_int_equal(csd_local_pipeline_create(&pipe, model, 2, &err), 0);
    csd_engine_opts eo;
    csd_engine_opts_default(&eo);
    assert_int_equal(csd_engine_create(&engine, &pipe, 1, NULL, 0, &eo, &err), 0);
    csd_http_opts o;
    csd_http_opts_default(&o);
    o.port = 0;
    o.model_name = "tiny";
    csd_http_server *srv = NULL;
    assert_int_equal(csd_http_server_create(&srv, &o, f->tok, NULL, &err), 0);
    csd_http_server_set_engine(srv, engine);
    static const char *const cases[][3] = {
        {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":1}", ""},
        {"/v1/completions",
         "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"}}",
         "\"param\":\"response_format\""},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\"}",
         "\"param\":\"tool_choice\""},
    };
    int port = csd_http_server_port(srv);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char req[1024], resp[8192];
        snprintf(req, sizeof req,
                 "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                 cases[i][0], strlen(cases[i][1]), cases[i][1]);
        int st = roundtrip(port, req, resp, sizeof resp);
        if (!*cases[i][2] && st != 200) fail_msg("case %zu: %d %s", i, st, body_of(resp));
        if (*cases[i][2] && (st != 400 || !strstr(body_of(resp), cases[i][2])))
            fail_msg("case %zu: %d %s", i, st, body_of(resp));
        if (*cases[i][2] && !strstr(body_of(resp), "not available on this server"))
            fail_msg("case %zu: %s", i, body_of(resp));
    }
    csd_http_server_destroy(srv);
    csd_engine_destroy(engine);
    pipe->ops->destroy(pipe);
    csd_model_destroy(model);
    assert_int_equal(csd_test_remove_tree(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_loading),
        cmocka_unit_test(test_api_loading),
        cmocka_unit_test(test_metrics_not_ready),
        cmocka_unit_test(test_drain_refuses_new_requests),
        cmocka_unit_test(test_routes_methods_auth_limits),
        cmocka_unit_test(test_chunked_body_limits),
        cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_per_ip_limit),
        cmocka_unit_test(test_connection_options_refused),
        cmocka_unit_test(test_constrained_without_vocab),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
