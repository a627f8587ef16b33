/* A request that starts from a cached prompt prefix which a stage no longer holds (a worker evicted
 * the cached request to make room) computes its whole prompt instead of failing: the user gets an
 * answer, not an error. The stage is tests/fake_stage.h's, refusing every COPY_PREFIX as a worker
 * does whose source is gone, and then each FORWARD that counts on the copied positions: the cached
 * prompt and a choice of `n` copying another's. A request that a stage refuses again after starting
 * over fails: it starts over once. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coord/engine.h"
#include "fake_stage.h"

#define N_DOC 20
#define N_GEN 3

typedef struct outcome {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int n_tokens;
    int n_unexpected; /* tokens other than the fake stage's (counted: the engine's thread) */
    csd_req_result res;
} outcome;

static bool on_token(void *ctx, const csd_token_event *ev) {
    outcome *o = ctx;
    o->n_unexpected += ev->id != FAKE_STAGE_ANSWER;
    o->n_tokens++;
    return false;
}

static void on_done(void *ctx, const csd_req_result *res) {
    outcome *o = ctx;
    pthread_mutex_lock(&o->mu);
    o->res = *res;
    o->done = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void outcome_init(outcome *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
}

static void outcome_wait(outcome *o) {
    pthread_mutex_lock(&o->mu);
    while (!o->done) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    assert_int_equal(o->n_unexpected, 0);
}

static csd_req_params greedy(void) {
    csd_req_params p;
    memset(&p, 0, sizeof p);
    csd_sampler_params_default(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = N_GEN;
    p.ignore_eos = true;
    return p;
}

/* Submits prompt[0..n) for N_GEN greedy tokens and waits for its end. */
static void run(csd_engine *e, const int32_t *prompt, int n, outcome *o) {
    outcome_init(o);
    csd_req_params p = greedy();
    csd_req_callbacks cb = {on_token, on_done};
    csd_err err = {0};
    assert_int_equal(csd_engine_submit(e, prompt, n, &p, &cb, o, NULL, &err), 0);
    outcome_wait(o);
}

static csd_engine *engine_over(csd_pipeline *p, int parallel) {
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.parallel = parallel;
    o.prefix_cache = 2;
    o.prefix_min = 8;
    csd_engine *e = NULL;
    csd_err err = {0};
    if (csd_engine_create(&e, &p, 1, NULL, 0, &o, &err)) fail_msg("engine: %s", err.msg);
    return e;
}

/* A fleet over a fake stage that refuses every copy (and what `refusal` names, when set). */
static csd_pipeline *refusing_fleet(fake_stage *fs, const char *(*refusal)(uint32_t, int *)) {
    memset(fs, 0, sizeof *fs);
    fs->answer_pings = true;
    fs->refuse_copies = true;
    fs->refusal = refusal;
    return fake_stage_fleet(fs, 10000);
}

/* A document, then the same document with a question after it: the second copies the first's
 * N_DOC positions from the prefix cache. */
static void prompts(int32_t *doc, int32_t *asked) {
    for (int i = 0; i < N_DOC + 4; i++) asked[i] = (int32_t)(1 + (i * 7) % (FAKE_STAGE_VOCAB - 1));
    memcpy(doc, asked, N_DOC * sizeof *doc);
}

/* Runs the document (its prompt KV then held in the prefix cache); asked gets the longer prompt. */
static void run_document(csd_engine *e, int32_t *asked) {
    int32_t doc[N_DOC];
    prompts(doc, asked);
    outcome first;
    run(e, doc, N_DOC, &first);
    assert_int_equal(first.res.end, CSD_REQ_END_LENGTH);
}

static void test_refused_copy_recomputes(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = refusing_fleet(&fs, NULL);
    csd_engine *e = engine_over(p, 1);
    int32_t asked[N_DOC + 4];
    run_document(e, asked);
    outcome second;
    int tokens_before = atomic_load(&fs.tokens);
    run(e, asked, N_DOC + 4, &second);
    assert_int_equal(atomic_load(&fs.copies), 1); /* the copy was tried, and refused */
    /* the 4 tokens after the copy (refused), then the whole prompt, then N_GEN - 1 decode steps */
    assert_int_equal(atomic_load(&fs.tokens) - tokens_before, 4 + (N_DOC + 4) + (N_GEN - 1));
    assert_int_equal(second.res.end, CSD_REQ_END_LENGTH); /* an answer, not the refusal */
    assert_string_equal(second.res.message, "");
    assert_int_equal(second.n_tokens, N_GEN);
    assert_int_equal(second.res.cached_tokens, 0); /* every prompt token was computed */
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_hits, 0); /* a copy counts once a token came from it */
    assert_int_equal(st.prefix_tokens, 0);
    assert_int_equal(st.prefix_refused, 1);
    /* the entry the stage no longer held is gone; the second prompt took its place */
    assert_int_equal(st.prefix_entries, 1);
    outcome third;
    run(e, asked, N_DOC + 4, &third); /* copies from the second, and recomputes again */
    assert_int_equal(third.res.end, CSD_REQ_END_LENGTH);
    assert_int_equal(atomic_load(&fs.copies), 2);
    csd_engine_destroy(e);
    fake_stage_done(p, &fs);
}

/* n choices of one prompt: the second copies the first's prompt KV (no cache involved), the stage
 * refuses the copy, and the second computes the prompt itself instead of copying again. */
static void test_refused_group_copy_recomputes(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = refusing_fleet(&fs, NULL);
    csd_engine *e = engine_over(p, 2);
    int32_t doc[N_DOC], asked[N_DOC + 4];
    prompts(doc, asked);
    outcome o[2];
    void *ctx[2] = {&o[0], &o[1]};
    outcome_init(&o[0]);
    outcome_init(&o[1]);
    csd_req_params rp[2] = {greedy(), greedy()};
    csd_req_callbacks cb = {on_token, on_done};
    csd_err err = {0};
    assert_int_equal(csd_engine_submit_group(e, doc, N_DOC, rp, 2, &cb, ctx, NULL, &err), 0);
    outcome_wait(&o[0]);
    outcome_wait(&o[1]);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(o[i].res.end, CSD_REQ_END_LENGTH);
        assert_int_equal(o[i].n_tokens, N_GEN);
        assert_int_equal(o[i].res.cached_tokens, 0);
    }
    assert_int_equal(atomic_load(&fs.copies), 1); /* tried once; not again after the refusal */
    /* the first: its prompt; the second: 1 token after the copy (refused), then its prompt */
    assert_int_equal(atomic_load(&fs.tokens), 2 * (N_DOC + N_GEN - 1) + 1);
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_refused, 1);
    csd_engine_destroy(e);
    fake_stage_done(p, &fs);
}

/* Refuses every request but the first one the stage sees (once per process: the test runs once):
 * what starts over is refused again. */
static const char *refuse_all_but_first(uint32_t request_id, int *code) {
    static _Atomic uint32_t first;
    uint32_t none = 0;
    atomic_compare_exchange_strong(&first, &none, request_id);
    *code = CSD_EFULL;
    return request_id == atomic_load(&first) ? NULL : "the stage's KV cache is full";
}

static void test_second_refusal_fails(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = refusing_fleet(&fs, refuse_all_but_first);
    csd_engine *e = engine_over(p, 1);
    int32_t asked[N_DOC + 4];
    run_document(e, asked);
    outcome second;
    run(e, asked, N_DOC + 4, &second);
    assert_int_equal(second.res.end, CSD_REQ_END_ERROR);
    assert_int_equal(second.res.code, CSD_EFULL);
    assert_non_null(strstr(second.res.message, "KV cache is full")); /* the second refusal's */
    assert_int_equal(second.n_tokens, 0);
    csd_engine_stats st;
    csd_engine_get_stats(e, &st);
    assert_int_equal(st.prefix_refused, 1); /* started over once, not again and again */
    csd_engine_destroy(e);
    fake_stage_done(p, &fs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_copy_recomputes),
        cmocka_unit_test(test_refused_group_copy_recomputes),
        cmocka_unit_test(test_second_refusal_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
