/* The serving engine: concurrent requests give exactly the tokens they give alone (continuous
 * batching is invisible to a user), max_tokens and EOS end requests, cancel frees a request, a
 * full engine refuses with CSD_EFULL (a group of requests: all of it or none), and prompts beyond
 * the context are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "coord/engine.h"
#include "core/alloc.h"
#include "model/model.h"
#include "test_synth.h"
#include "test_util.h"

typedef struct collected {
    int32_t ids[256];
    int n;
    int end;
    int64_t completion_tokens;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int stop_after; /* on_token asks to stop after this many (0: never) */
    int64_t cached_tokens;
    bool hold;      /* on_token waits at its first token until release(): the request keeps its
                     * slot however fast the machine is */
} collected;

static bool on_token(void *ctx, const csd_token_event *ev) {
    collected *c = ctx;
    pthread_mutex_lock(&c->mu);
    while (c->hold) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (c->n < 256) c->ids[c->n++] = ev->id;
    return c->stop_after && c->n >= c->stop_after;
}

static void on_done(void *ctx, const csd_req_result *res) {
    collected *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->end = res->end;
    c->completion_tokens = res->completion_tokens;
    c->cached_tokens = res->cached_tokens;
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void release(collected *c) {
    pthread_mutex_lock(&c->mu);
    c->hold = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void wait_done(collected *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void collected_init(collected *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

typedef struct fixture {
    char dir[64];
    csd_model *model;
    csd_pipeline *pipe;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/csd-engine-XXXXXX");
    f->model = csd_test_load_tiny(f->dir, 128, 2);
    csd_err err = {0};
    assert_int_equal(csd_local_pipeline_create(&f->pipe, f->model, 8, &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    f->pipe->ops->destroy(f->pipe);
    csd_model_destroy(f->model);
    assert_int_equal(csd_test_remove_tree(f->dir), 0);
    free(f);
    return 0;
}

static csd_req_params params_for(int i, int64_t max_tokens) {
    csd_req_params p;
    memset(&p, 0, sizeof p);
    csd_sampler_params_default(&p.sampling);
    p.sampling.temperature = i % 2 ? 0.9f : 0.0f; /* half greedy, half seeded sampling */
    p.sampling.seed = 100 + (uint64_t)i;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
}

static void prompt_for(int i, int32_t *prompt, int *n) {
    *n = 3 + i * 5; /* different lengths: requests are at different phases in every step */
    for (int k = 0; k < *n; k++) prompt[k] = (int32_t)(1 + (k * 7 + i * 13) % 290);
}

static void run_alone(csd_pipeline *pipe, int i, collected *c) {
    csd_engine *e = NULL;
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = 1;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &pipe, 1, NULL, 0, &o, &err), 0);
    int32_t prompt[64];
    int n;
    prompt_for(i, prompt, &n);
    csd_req_params p = params_for(i, 12);
    csd_req_callbacks cb = {on_token, on_done};
    collected_init(c);
    assert_int_equal(csd_engine_submit(e, prompt, n, &p, &cb, c, NULL, &err), 0);
    wait_done(c);
    csd_engine_destroy(e);
}

static void test_concurrent_equals_alone(void **state) {
    fixture *f = *state;
    enum { N = 6 };
    collected alone[N], together[N];
    for (int i = 0; i < N; i++) run_alone(f->pipe, i, &alone[i]);
    csd_engine *e = NULL;
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = 4;        /* 6 requests on 4 slots: two wait in the queue */
    o.prefill_chunk = 8;   /* prompts prefill over several steps while others decode */
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, NULL, 0, &o, &err), 0);
    csd_req_callbacks cb = {on_token, on_done};
    for (int i = 0; i < N; i++) {
        int32_t prompt[64];
        int n;
        prompt_for(i, prompt, &n);
        csd_req_params p = params_for(i, 12);
        collected_init(&together[i]);
        assert_int_equal(csd_engine_submit(e, prompt, n, &p, &cb, &together[i], NULL, &err), 0);
    }
    for (int i = 0; i < N; i++) {
        wait_done(&together[i]);
        assert_int_equal(together[i].end, CSD_REQ_END_LENGTH);
        assert_int_equal(together[i].n, 12);
        assert_int_equal(alone[i].n, 12);
        assert_memory_equal(together[i].ids, alone[i].ids, 12 * sizeof(int32_t));
    }
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.requests_total, N);
    assert_int_equal(st.completion_tokens_total, N * 12);
    assert_true(st.step_count < N * 12); /* batched: fewer steps than tokens */
    csd_engine_destroy(e);
}

static void test_stop_eog_and_cancel(void **state) {
    fixture *f = *state;
    csd_engine *e = NULL;
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    csd_err err = {0};
    int32_t prompt[8] = {1, 5, 9, 14};
    /* first learn the greedy continuation, then declare its 3rd token end-of-generation */
    collected probe;
    run_alone(f->pipe, 0, &probe);
    int32_t eog = probe.ids[2];
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, &eog, 1, &o, &err), 0);
    csd_req_callbacks cb = {on_token, on_done};
    int32_t p0[64];
    int n0;
    prompt_for(0, p0, &n0);
    csd_req_params p = params_for(0, 50);
    p.ignore_eos = false;
    collected c;
    collected_init(&c);
    assert_int_equal(csd_engine_submit(e, p0, n0, &p, &cb, &c, NULL, &err), 0);
    wait_done(&c);
    assert_int_equal(c.end, CSD_REQ_END_STOP);
    assert_true(c.n <= 3 && c.ids[c.n - 1] == eog);
    /* on_token asking to stop (a stop string) */
    collected s;
    collected_init(&s);
    s.stop_after = 4;
    p = params_for(1, 50);
    assert_int_equal(csd_engine_submit(e, prompt, 4, &p, &cb, &s, NULL, &err), 0);
    wait_done(&s);
    assert_int_equal(s.end, CSD_REQ_END_STOP);
    assert_int_equal(s.n, 4);
    /* cancel a long request */
    collected k;
    collected_init(&k);
    uint64_t id = 0;
    p = params_for(1, 100000);
    p.max_tokens = 100; /* context is 128: a long run */
    k.hold = true; /* held at its first token, so the cancel comes before its end on any machine */
    int rc = csd_engine_submit(e, prompt, 4, &p, &cb, &k, &id, &err);
    csd_engine_cancel(e, id);
    release(&k);
    assert_int_equal(rc, 0);
    wait_done(&k);
    assert_int_equal(k.end, CSD_REQ_END_CANCELLED);
    assert_true(k.n < 100);
    csd_engine_destroy(e);
}

/* An engine over the fixture's pipeline with one slot and queue_max queue places. */
static csd_engine *one_slot_engine(fixture *f, int queue_max) {
    csd_engine *e = NULL;
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = 1;
    o.queue_max = queue_max;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, NULL, 0, &o, &err), 0);
    return e;
}

static void test_refusals(void **state) {
    fixture *f = *state;
    csd_engine *e = one_slot_engine(f, 1);
    csd_err err = {0};
    csd_req_callbacks cb = {on_token, on_done};
    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = 5;
    csd_req_params p = params_for(0, 100);
    collected c[3];
    for (int i = 0; i < 3; i++) collected_init(&c[i]);
    assert_int_equal(csd_engine_submit(e, prompt, 200, &p, &cb, &c[0], NULL, &err), CSD_ERANGE);
    assert_int_equal(csd_engine_submit(e, prompt, 4, &p, &cb, &c[0], NULL, &err), 0);
    assert_int_equal(csd_engine_submit(e, prompt, 4, &p, &cb, &c[1], NULL, &err), 0);
    int rc = csd_engine_submit(e, prompt, 4, &p, &cb, &c[2], NULL, &err);
    int accepted = 2 + (rc == 0);
    if (rc) assert_int_equal(rc, CSD_EFULL); /* one slot + one queued: the third is refused */
    int32_t bad = 999999;
    collected x;
    collected_init(&x);
    assert_int_equal(csd_engine_submit(e, &bad, 1, &p, &cb, &x, NULL, &err), CSD_ERANGE);
    for (int i = 0; i < accepted; i++) wait_done(&c[i]);
    csd_engine_destroy(e);
}

/* A group (OpenAI's n) is queued whole or not at all: with one slot and two queue places, one
 * long request leaves room for two more, so a group of three is refused without queuing any of
 * it, and a group of two is taken; its members are requests of their own (their own ids, one can
 * be cancelled alone). */
static void test_group_all_or_none(void **state) {
    fixture *f = *state;
    csd_engine *e = one_slot_engine(f, 2);
    csd_err err = {0};
    assert_int_equal(csd_engine_capacity(e), 3);
    csd_req_callbacks cb = {on_token, on_done};
    int32_t prompt[4] = {5, 6, 7, 8};
    csd_req_params p[3] = {params_for(0, 100), params_for(1, 100), params_for(2, 100)};
    collected c[4];
    void *ctx[3] = {&c[1], &c[2], &c[3]};
    for (int i = 0; i < 4; i++) collected_init(&c[i]);
    c[0].hold = true; /* it holds the slot (100 tokens of a fast fake pipeline may not) */
    assert_int_equal(csd_engine_submit(e, prompt, 4, &p[0], &cb, &c[0], NULL, &err), 0);
    csd_engine_stats before, after;
    csd_engine_get_stats(e, &before);
    uint64_t ids[3] = {0};
    int rc3 = csd_engine_submit_group(e, prompt, 4, p, 3, &cb, ctx, ids, &err);
    csd_engine_get_stats(e, &after);
    int rc2 = csd_engine_submit_group(e, prompt, 4, p, 2, &cb, ctx, ids, &err);
    if (rc2 == 0) csd_engine_cancel(e, ids[1]);
    release(&c[0]); /* before any assert: a failed one must not leave the engine's thread held */
    assert_int_equal(rc3, CSD_EFULL);
    assert_int_equal(after.requests_total, before.requests_total); /* none of it queued */
    assert_int_equal(after.requests_rejected, before.requests_rejected + 3);
    assert_int_equal(rc2, 0);
    assert_true(ids[0] != 0 && ids[1] != 0 && ids[0] != ids[1]);
    for (int i = 0; i < 3; i++) wait_done(&c[i]);
    assert_int_equal(c[0].end, CSD_REQ_END_LENGTH);
    assert_int_equal(c[1].end, CSD_REQ_END_LENGTH);
    assert_int_equal(c[1].n, 100);
    assert_int_equal(c[2].end, CSD_REQ_END_CANCELLED);
    assert_false(c[3].done); /* never given: no callback */
    assert_int_equal(csd_engine_submit_group(e, prompt, 4, p, 0, &cb, ctx, ids, &err), CSD_EINVAL);
    csd_engine_destroy(e);
}

/* Runs a group of n (parallel n, no prefix cache, prompts in chunks of 5 tokens so that the
 * members wait over several steps) of one prompt, params[i] each, to the end. */
static void run_group(fixture *f, const int32_t *prompt, int n_prompt, const csd_req_params *p,
                      int n, collected *c, csd_engine_stats *st) {
    csd_engine *e = NULL;
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = n;
    o.prefix_cache = 0;
    o.prefill_chunk = 5;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, NULL, 0, &o, &err), 0);
    csd_req_callbacks cb = {on_token, on_done};
    void *ctx[3];
    for (int i = 0; i < n; i++) {
        collected_init(&c[i]);
        ctx[i] = &c[i];
    }
    assert_int_equal(csd_engine_submit_group(e, prompt, n_prompt, p, n, &cb, ctx, NULL, &err), 0);
    for (int i = 0; i < n; i++) wait_done(&c[i]);
    csd_engine_get_stats(e, st);
    csd_engine_destroy(e);
}

/* A group's members copy their leader's prompt KV instead of computing it (every position but
 * the last), and each still gives the tokens it gives alone. */
static void test_group_shares_prompt(void **state) {
    fixture *f = *state;
    int32_t prompt[24];
    for (int k = 0; k < 24; k++) prompt[k] = (int32_t)(1 + (k * 11) % 290);
    csd_req_params p[3] = {params_for(1, 12), params_for(3, 12), params_for(5, 12)}; /* sampled */
    collected alone[3], grouped[3];
    csd_engine_stats st;
    for (int i = 0; i < 3; i++) {
        run_group(f, prompt, 24, &p[i], 1, &alone[i], &st);
        assert_int_equal(st.prefix_tokens, 0);
    }
    run_group(f, prompt, 24, p, 3, grouped, &st);
    assert_int_equal(st.prefix_hits, 2);
    assert_int_equal(st.prefix_tokens, 2 * 23);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(grouped[i].n, 12);
        assert_memory_equal(grouped[i].ids, alone[i].ids, 12 * sizeof(int32_t));
        assert_int_equal(grouped[i].cached_tokens, i ? 23 : 0);
    }
    assert_memory_not_equal(alone[0].ids, alone[1].ids, 12 * sizeof(int32_t)); /* seeds matter */
}

/* Runs prompt through e and waits: the tokens and how many prompt tokens came from the cache. */
static void run_prompt(csd_engine *e, const int32_t *prompt, int n, collected *c) {
    csd_err err = {0};
    csd_req_params p = params_for(0, 10);
    csd_req_callbacks cb = {on_token, on_done};
    collected_init(c);
    assert_int_equal(csd_engine_submit(e, prompt, n, &p, &cb, c, NULL, &err), 0);
    wait_done(c);
    assert_int_equal(c->n, 10);
}

static void test_prefix_cache(void **state) {
    fixture *f = *state;
    int32_t doc[48], other[48];
    for (int i = 0; i < 48; i++) doc[i] = (int32_t)(1 + (i * 11) % 280);
    memcpy(other, doc, sizeof doc);
    for (int i = 30; i < 48; i++)
        other[i] = (int32_t)(2 + (i * 5) % 250); /* same first 30 tokens */
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    csd_err err = {0};
    /* without a cache: the reference outputs */
    csd_engine *plain = NULL;
    collected want_doc, want_other;
    assert_int_equal(csd_engine_create(&plain, &f->pipe, 1, NULL, 0, &o, &err), 0);
    run_prompt(plain, doc, 48, &want_doc);
    run_prompt(plain, other, 48, &want_other);
    assert_int_equal(want_doc.cached_tokens, 0);
    csd_engine_destroy(plain);
    /* with a cache: the same outputs, computed from the cached prefix */
    csd_engine *e = NULL;
    o.prefix_cache = 2;
    o.prefix_min = 8;
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, NULL, 0, &o, &err), 0);
    collected cold, warm, partial;
    run_prompt(e, doc, 48, &cold);
    assert_int_equal(cold.cached_tokens, 0);
    run_prompt(e, doc, 48, &warm);
    assert_int_equal(warm.cached_tokens, 47); /* all but the last prompt token */
    assert_memory_equal(warm.ids, want_doc.ids, 10 * sizeof(int32_t));
    run_prompt(e, other, 48, &partial);
    assert_int_equal(partial.cached_tokens, 30);
    assert_memory_equal(partial.ids, want_other.ids, 10 * sizeof(int32_t));
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_hits, 2);
    assert_int_equal(st.prefix_tokens, 77);
    assert_true(st.prefix_entries >= 1 && st.prefix_entries <= 2);
    csd_engine_destroy(e);
}

/* Token i of the tiny model's 300 is the byte i below 128; the rest have no bytes (as special
 * tokens). */
static int byte_tokens(void *ctx, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    (void)ctx;
    *len = id < 128 && cap > 0;
    if (*len) out[0] = (uint8_t)id;
    return 0;
}

/* An engine whose end-of-generation id is 'x', and the byte tokens' table (*v). */
static csd_engine *json_engine(fixture *f, csd_vocab_bytes **v) {
    csd_err err = {0};
    assert_int_equal(csd_vocab_bytes_create(v, 300, byte_tokens, NULL, &err), 0);
    int32_t eog[1] = {'x'};
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    csd_engine *e = NULL;
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, eog, 1, &o, &err), 0);
    return e;
}

/* response_format json_object: sampled answers are one JSON object, ended when it closes, never at
 * an end-of-generation token that is plain text ('x' here, favoured so that it comes up). */
static void test_json_object(void **state) {
    fixture *f = *state;
    csd_vocab_bytes *v = NULL;
    csd_err err = {0};
    csd_engine *e = json_engine(f, &v);
    int32_t prompt[4] = {1, 2, 3, 4};
    int closed = 0, with_x = 0;
    for (int seed = 1; seed <= 6; seed++) {
        csd_req_params p = params_for(1, 100);
        p.sampling.seed = (uint64_t)seed;
        p.ignore_eos = false;
        p.json_vocab = v;
        p.sampling.n_logit_bias = 3; /* '"' and '}' close strings and objects within the budget */
        p.sampling.logit_bias[0] = (csd_logit_bias){'"', 3.0f};
        p.sampling.logit_bias[1] = (csd_logit_bias){'}', 3.0f};
        p.sampling.logit_bias[2] = (csd_logit_bias){'x', 4.0f};
        csd_req_callbacks cb = {on_token, on_done};
        collected c;
        collected_init(&c);
        assert_int_equal(csd_engine_submit(e, prompt, 4, &p, &cb, &c, NULL, &err), 0);
        wait_done(&c);
        char text[257];
        for (int i = 0; i < c.n; i++) text[i] = (char)c.ids[i];
        text[c.n] = '\0';
        for (int i = 0; i < c.n; i++) with_x += c.ids[i] == 'x';
        if (c.end == CSD_REQ_END_LENGTH) {
            assert_int_equal(c.n, 100);
            continue;
        }
        assert_int_equal(c.end, CSD_REQ_END_STOP);
        json_error_t je;
        json_t *obj = json_loadb(text, (size_t)c.n, 0, &je);
        if (!json_is_object(obj))
            fail_msg("seed %d: not one JSON object: %s (%s)", seed, text, je.text);
        json_decref(obj);
        closed++;
    }
    assert_true(closed > 0); /* else nothing above was checked */
    assert_true(with_x > 0);
    csd_engine_destroy(e);
    csd_vocab_bytes_destroy(v);
}

/* response_format json_object, greedy: the best token is taken when the JSON allows it, without
 * masking the vocabulary; else the best allowed one. 'x' (plain text) is favoured, so both come
 * up: every answer is JSON, token by token, and one that ended by itself is one whole object. */
static void test_json_object_greedy(void **state) {
    fixture *f = *state;
    csd_vocab_bytes *v = NULL;
    csd_err err = {0};
    csd_engine *e = json_engine(f, &v);
    int closed = 0;
    for (int k = 0; k < 4; k++) {
        int32_t prompt[4] = {1 + k, 2, 3, 4};
        csd_req_params p = params_for(1, 100);
        p.sampling.temperature = 0.0f;
        p.ignore_eos = false;
        p.json_vocab = v;
        p.sampling.n_logit_bias = 3;
        p.sampling.logit_bias[0] = (csd_logit_bias){'"', 2.0f + (float)k};
        p.sampling.logit_bias[1] = (csd_logit_bias){'}', 2.0f + (float)k};
        p.sampling.logit_bias[2] = (csd_logit_bias){'x', 6.0f};
        csd_req_callbacks cb = {on_token, on_done};
        collected c;
        collected_init(&c);
        assert_int_equal(csd_engine_submit(e, prompt, 4, &p, &cb, &c, NULL, &err), 0);
        wait_done(&c);
        csd_json_accept a;
        csd_json_accept_init(&a);
        for (int i = 0; i < c.n; i++)
            if (!csd_json_accept_token(&a, v, c.ids[i]))
                fail_msg("prompt %d: token %d ('%c') is not JSON after the ones before", k, i,
                         (char)c.ids[i]);
        if (c.end == CSD_REQ_END_STOP) {
            assert_true(csd_json_accept_done(&a));
            closed++;
        } else {
            assert_int_equal(c.end, CSD_REQ_END_LENGTH);
        }
    }
    assert_true(closed > 0); /* else the end of an object was never checked */
    csd_engine_destroy(e);
    csd_vocab_bytes_destroy(v);
}

/* response_format json_schema: each answer is valid against the schema, and a request keeps its
 * own copy of it (the caller's is destroyed right after submit). */
static void test_json_schema(void **state) {
    fixture *f = *state;
    csd_vocab_bytes *v = NULL;
    csd_err err = {0};
    csd_engine *e = json_engine(f, &v);
    json_t *raw = json_loads("{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":"
                             "\"boolean\"},\"c\":{\"enum\":[\"red\",\"green\"]}},"
                             "\"required\":[\"ok\",\"c\"]}", 0, NULL);
    assert_non_null(raw);
    int32_t prompt[4] = {1, 2, 3, 4};
    int closed = 0;
    for (int seed = 1; seed <= 4; seed++) {
        csd_json_schema *schema = NULL;
        assert_int_equal(csd_json_schema_compile(&schema, raw, &err), 0);
        csd_req_params p = params_for(1, 100);
        p.sampling.seed = (uint64_t)seed;
        p.json_vocab = v;
        p.json_schema = schema;
        csd_req_callbacks cb = {on_token, on_done};
        collected c;
        collected_init(&c);
        assert_int_equal(csd_engine_submit(e, prompt, 4, &p, &cb, &c, NULL, &err), 0);
        memset((void *)schema->nodes, 0xA5, schema->size - sizeof *schema); /* not read again */
        csd_json_schema_destroy(schema);
        wait_done(&c);
        if (c.end == CSD_REQ_END_LENGTH) continue;
        assert_int_equal(c.end, CSD_REQ_END_STOP);
        char text[257];
        for (int i = 0; i < c.n; i++) text[i] = (char)c.ids[i];
        text[c.n] = '\0';
        json_t *obj = json_loadb(text, (size_t)c.n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
        const char *color = json_string_value(json_object_get(obj, "c"));
        if (json_object_size(obj) != 2 || !json_is_boolean(json_object_get(obj, "ok")) || !color ||
            (strcmp(color, "red") && strcmp(color, "green")))
            fail_msg("seed %d: not valid against the schema: %s", seed, text);
        json_decref(obj);
        closed++;
    }
    assert_true(closed > 0); /* else nothing above was checked */
    json_decref(raw);
    csd_engine_destroy(e);
    csd_vocab_bytes_destroy(v);
}

/* A pipeline that lets two steps overlap, as a fleet with two micro-batches does: each step is
 * computed by the in-process pipeline when it begins and handed back when it ends, in order. It
 * counts the tokens it is sent, and those sent after `cancelled` is set. */
typedef struct overlap_pipe {
    csd_pipeline base;
    csd_pipeline *in;
    int rc[2];
    csd_err err[2];
    int head, count;
    atomic_bool cancelled;     /* set by the test when it cancels the watched one */
    long hold_at;              /* > 0: a step begun once this many tokens were sent waits for the
                                * cancel (however slowly the test's thread is scheduled) */
    atomic_long sent, sent_after_cancel;
} overlap_pipe;

static int overlap_open(csd_pipeline *p, uint32_t r, int64_t max_ctx, csd_err *err) {
    overlap_pipe *o = (overlap_pipe *)p;
    return o->in->ops->open(o->in, r, max_ctx, err);
}

static int overlap_begin(csd_pipeline *p, const csd_step_entry *en, int n, float *logits,
                         csd_err *err) {
    (void)err;
    overlap_pipe *o = (overlap_pipe *)p;
    assert_true(o->count < 2); /* the engine keeps to max_in_flight */
    while (o->hold_at > 0 && atomic_load(&o->sent) >= o->hold_at && !atomic_load(&o->cancelled))
        usleep(100);
    for (int i = 0; i < n; i++) {
        atomic_fetch_add(&o->sent, en[i].n);
        if (atomic_load(&o->cancelled)) atomic_fetch_add(&o->sent_after_cancel, en[i].n);
    }
    int slot = (o->head + o->count++) % 2;
    csd_err_clear(&o->err[slot]);
    int rc = o->in->ops->step_begin(o->in, en, n, logits, &o->err[slot]);
    o->rc[slot] = rc ? rc : o->in->ops->step_end(o->in, NULL, &o->err[slot]);
    return 0;
}

static int overlap_end(csd_pipeline *p, csd_err *entry_err, csd_err *err) {
    (void)entry_err;
    overlap_pipe *o = (overlap_pipe *)p;
    int slot = o->head;
    o->head = (o->head + 1) % 2;
    o->count--;
    if (o->rc[slot] && err) *err = o->err[slot];
    return o->rc[slot];
}

static int overlap_truncate(csd_pipeline *p, uint32_t r, int64_t pos, csd_err *err) {
    overlap_pipe *o = (overlap_pipe *)p;
    return o->in->ops->truncate(o->in, r, pos, err);
}

static int overlap_copy(csd_pipeline *p, uint32_t src, uint32_t dst, int64_t n, csd_err *err) {
    overlap_pipe *o = (overlap_pipe *)p;
    return o->in->ops->copy_prefix(o->in, src, dst, n, err);
}

static void overlap_close(csd_pipeline *p, uint32_t r) {
    overlap_pipe *o = (overlap_pipe *)p;
    o->in->ops->close(o->in, r);
}

static const csd_pipeline_ops overlap_ops = {.open = overlap_open,
                                             .step_begin = overlap_begin,
                                             .step_end = overlap_end,
                                             .truncate = overlap_truncate,
                                             .copy_prefix = overlap_copy,
                                             .close = overlap_close};

/* A client that goes away while its long prompt is being computed, over a pipeline with two
 * steps in flight: the rest of the prompt is not computed (at most the chunks the engine had
 * already picked), and no token is generated for it. (A prompt whose chunks always had one in
 * flight used to be computed to its end, then sampled, for nobody.) */
static void test_cancel_mid_prompt_with_steps_in_flight(void **state) {
    fixture *f = *state;
    overlap_pipe o;
    memset(&o, 0, sizeof o);
    o.base = *f->pipe;
    o.base.ops = &overlap_ops;
    o.base.max_in_flight = 2;
    o.in = f->pipe;
    o.hold_at = 6;
    csd_pipeline *pipe = &o.base;
    csd_engine_opts opts;
    csd_engine_opts_default(&opts);
    opts.prefill_chunk = 2;
    csd_engine *e = NULL;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &pipe, 1, NULL, 0, &opts, &err), 0);
    int32_t prompt[120];
    for (int i = 0; i < 120; i++) prompt[i] = 1 + (i * 7) % 290;
    csd_req_params p = params_for(0, 4);
    csd_req_callbacks cb = {on_token, on_done};
    collected c;
    collected_init(&c);
    uint64_t id = 0;
    assert_int_equal(csd_engine_submit(e, prompt, 120, &p, &cb, &c, &id, &err), 0);
    while (atomic_load(&o.sent) < 6) usleep(100);
    atomic_store(&o.cancelled, true);
    csd_engine_cancel(e, id);
    wait_done(&c);
    assert_int_equal(c.end, CSD_REQ_END_CANCELLED);
    assert_int_equal(c.n, 0);
    long after = atomic_load(&o.sent_after_cancel);
    if (after > 2 * opts.prefill_chunk)
        fail_msg("%ld prompt tokens computed after the cancel (of %ld sent)", after,
                 atomic_load(&o.sent));
    csd_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_equals_alone),
        cmocka_unit_test(test_stop_eog_and_cancel),
        cmocka_unit_test(test_cancel_mid_prompt_with_steps_in_flight),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_group_all_or_none),
        cmocka_unit_test(test_group_shares_prompt),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_json_object_greedy),
        cmocka_unit_test(test_json_schema),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
