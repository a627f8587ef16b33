/* Speculative decoding in the engine (--spec-draft): requests give exactly the tokens they give
 * without it (greedy, seeded sampling with penalties, logprobs, a JSON answer), several at once
 * and with prompts prefilled in chunks, while the stats show drafts checked and agreed with; the
 * KV of rejected drafts is dropped (else the later tokens would differ); alone, a request takes
 * one step fewer for each draft token agreed with; max_tokens and the context bound a draft.
 * csd_generate (`cascadia run`) gives the same tokens with a draft too. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord/engine.h"
#include "coord/generate.h"
#include "model/model.h"
#include "test_synth.h"
#include "test_util.h"

#define MAX_IDS 200
#define N_REQ 6

typedef struct collected {
    int32_t ids[MAX_IDS];
    float logprobs[MAX_IDS];
    int n, end;
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} collected;

static bool on_token(void *ctx, const csd_token_event *ev) {
    collected *c = ctx;
    if (c->n < MAX_IDS) {
        c->logprobs[c->n] = ev->logprob;
        c->ids[c->n++] = ev->id;
    }
    return false;
}

static void on_done(void *ctx, const csd_req_result *res) {
    collected *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->end = res->end;
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void wait_done(collected *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

typedef struct fixture {
    char dir[64];
    csd_model *model;
    csd_pipeline *pipe;
    csd_vocab_bytes *vocab;
    csd_draft_model *draft; /* the engines' draft model; NULL: drafts from the text */
} fixture;

/* Token i of the tiny model's 300 is the byte i below 128; the rest have no bytes. */
static int byte_tokens(void *ctx, int32_t id, uint8_t *out, size_t cap, size_t *len) {
    (void)ctx;
    *len = id < 128 && cap > 0;
    if (*len) out[0] = (uint8_t)id;
    return 0;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/csd-spec-XXXXXX");
    f->model = csd_test_load_tiny(f->dir, 256, 2);
    csd_err err = {0};
    assert_int_equal(csd_local_pipeline_create(&f->pipe, f->model, 8, &err), 0);
    assert_int_equal(csd_vocab_bytes_create(&f->vocab, 300, byte_tokens, NULL, &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    csd_vocab_bytes_destroy(f->vocab);
    f->pipe->ops->destroy(f->pipe);
    csd_model_destroy(f->model);
    assert_int_equal(csd_test_remove_tree(f->dir), 0);
    free(f);
    return 0;
}

/* An engine over the fixture's pipeline: spec_draft draft tokens, a context of max_ctx (0: the
 * model's), 4 slots. */
static csd_engine *engine_with(fixture *f, int spec_draft, int64_t max_ctx) {
    csd_engine_opts o;
    csd_engine_opts_default(&o);
    o.spec_draft = spec_draft;
    o.max_ctx = max_ctx;
    o.parallel = 4;
    o.prefill_chunk = 8; /* prompts prefill over several steps while others decode */
    o.draft_model = f->draft;
    csd_engine *e = NULL;
    csd_err err = {0};
    assert_int_equal(csd_engine_create(&e, &f->pipe, 1, NULL, 0, &o, &err), 0);
    return e;
}

/* Submits a request whose tokens go to c. */
static void submit(csd_engine *e, const int32_t *prompt, int n, const csd_req_params *p,
                   collected *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    csd_req_callbacks cb = {on_token, on_done};
    csd_err err = {0};
    assert_int_equal(csd_engine_submit(e, prompt, n, p, &cb, c, NULL, &err), 0);
}

/* Request i: a prompt that repeats a short pattern (drafts come from the first step on), and
 * its own way of choosing tokens. */
static void request_for(int i, int32_t *prompt, int *n, csd_req_params *p) {
    int period = 3 + i % 3;
    *n = 10 + 3 * i;
    for (int k = 0; k < *n; k++) prompt[k] = (int32_t)(1 + ((k % period) * 37 + i * 11) % 290);
    memset(p, 0, sizeof *p);
    csd_sampler_params_default(&p->sampling);
    p->max_tokens = 60;
    p->ignore_eos = true;
    p->sampling.seed = 7 + (uint64_t)i;
    switch (i % 3) {
    case 0: p->sampling.temperature = 0; break;      /* greedy */
    case 1:                                          /* sampling, penalties, logprobs */
        p->sampling.temperature = 0.8f;
        p->sampling.frequency_penalty = 0.3f;
        p->logprobs = true;
        break;
    default:                                         /* greedy with a repetition penalty */
        p->sampling.temperature = 0;
        p->sampling.repetition_penalty = 1.1f;
        p->sampling.penalty_scope = CSD_PENALTY_OPENAI;
    }
}

/* Runs the N_REQ requests at once (4 slots: two wait) with spec_draft k; their tokens in c. */
static void run_all(fixture *f, int k, collected *c, csd_engine_stats *st) {
    csd_engine *e = engine_with(f, k, 0);
    for (int i = 0; i < N_REQ; i++) {
        int32_t prompt[64];
        int n;
        csd_req_params p;
        request_for(i, prompt, &n, &p);
        submit(e, prompt, n, &p, &c[i]);
    }
    for (int i = 0; i < N_REQ; i++) wait_done(&c[i]);
    csd_engine_get_stats(e, st);
    csd_engine_destroy(e);
}

static void test_same_tokens_as_without(void **state) {
    fixture *f = *state;
    collected plain[N_REQ], spec[N_REQ];
    csd_engine_stats st0, st1;
    run_all(f, 0, plain, &st0);
    run_all(f, 4, spec, &st1);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(plain[i].end, CSD_REQ_END_LENGTH);
        assert_int_equal(spec[i].end, CSD_REQ_END_LENGTH);
        assert_int_equal(spec[i].n, 60);
        if (memcmp(plain[i].ids, spec[i].ids, 60 * sizeof(int32_t)))
            fail_msg("request %d: the tokens differ with speculation", i);
        for (int t = 0; t < 60; t++) /* the same distribution each token was drawn from */
            assert_float_equal(plain[i].logprobs[t], spec[i].logprobs[t], 1e-4);
    }
    assert_int_equal(st0.spec_draft_tokens, 0);
    assert_true(st1.spec_draft_tokens > 0);
    assert_true(st1.spec_accepted_tokens > 0);
    assert_true(st1.spec_accepted_tokens <= st1.spec_draft_tokens);
    assert_int_equal(st1.completion_tokens_total, N_REQ * 60);
    /* (how many steps requests served together take depends on when each was admitted: the
     * saving is asserted exactly for a request alone, test_a_step_saved_per_agreed_token) */
    printf("speculation: %lld of %lld draft tokens agreed; %lld steps instead of %lld\n",
           (long long)st1.spec_accepted_tokens, (long long)st1.spec_draft_tokens,
           (long long)st1.step_count, (long long)st0.step_count);
}

/* A JSON answer (response_format) checks each drafted token against the object so far. */
static void test_json_answer(void **state) {
    fixture *f = *state;
    collected c[2];
    csd_engine_stats st;
    /* a prompt that spells JSON, so drafts are JSON too */
    const char *text = "{\"a\": \"bb\", \"a\": \"bb\", \"a\": \"b";
    int32_t prompt[64];
    int n = (int)strlen(text);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)text[i];
    csd_req_params p;
    memset(&p, 0, sizeof p);
    csd_sampler_params_default(&p.sampling);
    p.sampling.temperature = 0.7f;
    p.sampling.seed = 3;
    p.max_tokens = 80;
    p.json_vocab = f->vocab;
    for (int k = 0; k < 2; k++) {
        csd_engine *e = engine_with(f, k ? 6 : 0, 0);
        submit(e, prompt, n, &p, &c[k]);
        wait_done(&c[k]);
        csd_engine_get_stats(e, &st);
        csd_engine_destroy(e);
    }
    assert_true(st.spec_draft_tokens > 0); /* the speculating run checked drafts */
    assert_int_equal(c[1].end, c[0].end);
    assert_int_equal(c[1].n, c[0].n);
    assert_memory_equal(c[1].ids, c[0].ids, (size_t)c[0].n * sizeof(int32_t));
}

/* One request alone: each agreed draft token saves exactly one step. */
static void test_a_step_saved_per_agreed_token(void **state) {
    fixture *f = *state;
    int64_t steps[2], agreed = 0;
    collected c[2];
    for (int k = 0; k < 2; k++) {
        csd_engine *e = engine_with(f, k ? 5 : 0, 0);
        int32_t prompt[64];
        int n;
        csd_req_params p;
        request_for(0, prompt, &n, &p);
        p.max_tokens = 120;
        submit(e, prompt, n, &p, &c[k]);
        wait_done(&c[k]);
        csd_engine_stats st;
        csd_engine_get_stats(e, &st);
        steps[k] = st.step_count;
        agreed = st.spec_accepted_tokens;
        csd_engine_destroy(e);
    }
    assert_int_equal(c[1].n, 120);
    assert_memory_equal(c[0].ids, c[1].ids, 120 * sizeof(int32_t));
    assert_true(agreed > 0);
    assert_int_equal(steps[0] - steps[1], agreed);
}

/* Runs request i (max_tokens: max) on e. */
static void run_one(csd_engine *e, int i, int64_t max, collected *c) {
    int32_t prompt[64];
    int n;
    csd_req_params p;
    request_for(i, prompt, &n, &p);
    p.max_tokens = max;
    submit(e, prompt, n, &p, c);
    wait_done(c);
    assert_int_equal(c->end, CSD_REQ_END_LENGTH);
}

/* Requests one after another on one engine: a request's prompt is never taken for a draft of the
 * one before it. (The step entry that carried the last draft of one, when its answer ended within
 * that draft, is reused for the next one's prompt; among the answer lengths below some end so.) */
static void test_one_after_another(void **state) {
    fixture *f = *state;
    collected alone, first, second;
    csd_engine *plain = engine_with(f, 0, 0);
    run_one(plain, 1, 30, &alone);
    csd_engine_destroy(plain);
    csd_engine *e = engine_with(f, 4, 0);
    for (int64_t max = 20; max < 36; max++) {
        run_one(e, 0, max, &first);
        run_one(e, 1, 30, &second);
        if (memcmp(second.ids, alone.ids, 30 * sizeof(int32_t)))
            fail_msg("after a first answer of %lld tokens the second one differs", (long long)max);
    }
    csd_engine_destroy(e);
}

/* Near max_tokens and the context a draft is cut short: a request asked for 2 tokens gets 2, and
 * one whose prompt nearly fills the context ends there, as without speculation. */
static void test_bounds(void **state) {
    fixture *f = *state;
    csd_engine *e = engine_with(f, 16, 40);
    int32_t prompt[38];
    for (int i = 0; i < 38; i++) prompt[i] = 5 + i % 2;
    const struct {
        int n_prompt;
        int64_t max_tokens;
        int expect;
    } cases[] = {{10, 2, 2}, {36, 100, 4}, {10, 100, 30}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        csd_req_params p;
        memset(&p, 0, sizeof p);
        csd_sampler_params_default(&p.sampling);
        p.sampling.temperature = 0;
        p.max_tokens = cases[i].max_tokens;
        p.ignore_eos = true;
        collected c;
        submit(e, prompt, cases[i].n_prompt, &p, &c);
        wait_done(&c);
        assert_int_equal(c.end, CSD_REQ_END_LENGTH);
        assert_int_equal(c.n, cases[i].expect);
    }
    csd_engine_destroy(e);
}

/* csd_generate (`cascadia run`): the same tokens with a draft, greedy and sampled. */
typedef struct gen_ids {
    int32_t ids[MAX_IDS];
    int n;
} gen_ids;

static bool gen_token(void *ctx, int32_t id, const float *logits) {
    (void)logits;
    gen_ids *g = ctx;
    if (g->n < MAX_IDS) g->ids[g->n++] = id;
    return false;
}

/* Request i through csd_generate, 100 tokens, without a draft (got[0]) and with up to 4 draft
 * tokens (got[1]), from the text or from draft_model when it is set. */
static void generate_both(fixture *f, int i, csd_draft_model *draft_model, gen_ids *got,
                          csd_gen_stats *st) {
    int32_t prompt[64];
    int n;
    csd_req_params rp;
    request_for(i, prompt, &n, &rp);
    for (int k = 0; k < 2; k++) {
        csd_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.sampling = rp.sampling;
        gp.max_tokens = 100;
        gp.ignore_eos = true;
        gp.spec_draft = k ? 4 : 0;
        gp.draft_model = draft_model;
        got[k].n = 0;
        csd_err err = {0};
        if (csd_generate(f->pipe, 1, prompt, n, &gp, gen_token, &got[k], &st[k], &err))
            fail_msg("generate: %s", err.msg);
    }
}

static void test_generate_same_tokens(void **state) {
    fixture *f = *state;
    int64_t drafted = 0;
    for (int i = 0; i < 3; i++) {
        gen_ids got[2];
        csd_gen_stats st[2];
        generate_both(f, i, NULL, got, st);
        assert_int_equal(got[1].n, 100);
        if (memcmp(got[0].ids, got[1].ids, 100 * sizeof(int32_t)))
            fail_msg("request %d: csd_generate's tokens differ with a draft", i);
        assert_int_equal(st[0].spec_draft_tokens, 0);
        drafted += st[1].spec_draft_tokens;
        if (i == 0) assert_true(st[1].spec_accepted_tokens > 0); /* greedy */
    }
    assert_true(drafted > 0);
}

/* ---- drafts from a draft model (draft_model.h) ---- */

/* A draft model over a tiny model of weights from seed (11: the served model's own). */
typedef struct drafter {
    char dir[64];
    csd_model *model;
} drafter;

static csd_draft_model *drafter_open(drafter *dr, uint64_t seed) {
    snprintf(dr->dir, sizeof dr->dir, "/tmp/csd-specd-XXXXXX");
    assert_non_null(mkdtemp(dr->dir));
    assert_int_equal(rmdir(dr->dir), 0); /* csd_test_write_tiny makes it */
    csd_test_write_tiny(dr->dir, 4, 2, seed);
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = 2;
    opts.max_ctx = 256;
    csd_err err = {0};
    if (csd_model_load_hf(&dr->model, dr->dir, &opts, &err)) fail_msg("load: %s", err.msg);
    csd_draft_model *d = NULL;
    if (csd_draft_model_create(&d, dr->model, 4, 4, 0, 300, &err)) fail_msg("%s", err.msg);
    return d;
}

static void drafter_close(drafter *dr, csd_draft_model *d) {
    csd_draft_model_destroy(d);
    csd_model_destroy(dr->model);
    assert_int_equal(csd_test_remove_tree(dr->dir), 0);
}

/* With a draft model the requests give the tokens they give without a draft: one with the served
 * model's weights agrees with nearly every greedy draft token; one with other weights often
 * disagrees, and its drafts' KV is dropped. Alone, a request saves a step per agreed token. */
static void test_draft_model_same_tokens(void **state) {
    fixture *f = *state;
    collected plain[N_REQ], spec[N_REQ];
    csd_engine_stats st0, st1;
    double agreed[2];
    run_all(f, 0, plain, &st0);
    for (uint64_t seed = 11; seed <= 12; seed++) {
        drafter dr;
        f->draft = drafter_open(&dr, seed);
        run_all(f, 4, spec, &st1);
        for (int i = 0; i < N_REQ; i++) {
            assert_int_equal(spec[i].n, 60);
            if (memcmp(plain[i].ids, spec[i].ids, 60 * sizeof(int32_t)))
                fail_msg("seed %d, request %d: the tokens differ with a draft model", (int)seed,
                         i);
        }
        printf("draft model of seed %d: %lld of %lld draft tokens agreed\n", (int)seed,
               (long long)st1.spec_accepted_tokens, (long long)st1.spec_draft_tokens);
        assert_true(st1.spec_draft_tokens > 0);
        assert_true(st1.spec_accepted_tokens < st1.spec_draft_tokens); /* some were dropped */
        agreed[seed - 11] = (double)st1.spec_accepted_tokens / (double)st1.spec_draft_tokens;
        /* drafts that keep failing shrink to 1 token (csd_draft_next_k): 4 per step would make
         * over 1000 here */
        if (seed == 12) assert_true(st1.spec_draft_tokens < 2 * N_REQ * 60);
        drafter_close(&dr, f->draft);
        f->draft = NULL;
    }
    /* (the greedy drafts miss the sampled requests' draws and the penalised ones' choices) */
    assert_true(agreed[0] > 1.5 * agreed[1]);
}

static void test_draft_model_saves_steps(void **state) {
    fixture *f = *state;
    drafter dr;
    csd_draft_model *d = drafter_open(&dr, 11);
    int64_t steps[2], agreed = 0, drafted = 0;
    collected c[2];
    for (int k = 0; k < 2; k++) {
        f->draft = k ? d : NULL;
        csd_engine *e = engine_with(f, k ? 5 : 0, 0);
        run_one(e, 0, 120, &c[k]); /* greedy */
        csd_engine_stats st;
        csd_engine_get_stats(e, &st);
        steps[k] = st.step_count;
        agreed = st.spec_accepted_tokens;
        drafted = st.spec_draft_tokens;
        csd_engine_destroy(e);
    }
    f->draft = NULL;
    assert_memory_equal(c[0].ids, c[1].ids, 120 * sizeof(int32_t));
    assert_true(agreed * 10 >= drafted * 9); /* the same weights: the same greedy choices */
    assert_int_equal(steps[0] - steps[1], agreed);
    /* csd_generate with it: the same tokens, sampled too */
    for (int i = 0; i < 2; i++) {
        gen_ids got[2];
        csd_gen_stats st[2];
        generate_both(f, i, d, got, st);
        assert_int_equal(got[1].n, 100);
        assert_memory_equal(got[0].ids, got[1].ids, 100 * sizeof(int32_t));
        assert_true(st[1].spec_draft_tokens > 0);
    }
    drafter_close(&dr, d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_tokens_as_without),
        cmocka_unit_test(test_json_answer),
        cmocka_unit_test(test_a_step_saved_per_agreed_token),
        cmocka_unit_test(test_one_after_another),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_generate_same_tokens),
        cmocka_unit_test(test_draft_model_same_tokens),
        cmocka_unit_test(test_draft_model_saves_steps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
