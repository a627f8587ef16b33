/* The draft model of speculative decoding (draft_model.h): a draft is the model's own greedy
 * continuation of the text, also after the text moved on by a partly agreed draft or went back;
 * drafts for several requests in one call equal their drafts alone; a slot keeps what it computed
 * (the text's next draft costs about k positions, a finished request's prompt serves the next
 * one that starts the same, and requests of one call that start the same compute it once);
 * slots run out by the least recently used; the draft model's context and the served model's
 * vocabulary bound a draft, and so does its confidence (p_min); a draft's length follows its
 * success. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/draft_model.h"
#include "model/model.h"
#include "model/quality.h"
#include "test_synth.h"
#include "test_util.h"

#define CTX 64

typedef struct fixture {
    char dir[64];
    csd_model *model;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/csd-draft-XXXXXX");
    f->model = csd_test_load_tiny(f->dir, CTX, 2);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    csd_model_destroy(f->model);
    assert_int_equal(csd_test_remove_tree(f->dir), 0);
    free(f);
    return 0;
}

/* The model's greedy continuation of text, k tokens, computed afresh one token at a time, with
 * the probability the model gives each token in p[i] when p is not NULL. */
static void greedy_probs(csd_model *m, const int32_t *text, int64_t n, int k, int32_t *out,
                         double *p) {
    csd_kv *kv = csd_test_new_kv(m);
    int64_t vocab = csd_model_cfg(m)->vocab_size;
    float *logits = malloc((size_t)vocab * sizeof(float));
    double *logp = malloc((size_t)vocab * sizeof(double));
    csd_err err = {0};
    if (csd_model_forward_seq(m, kv, text, NULL, n, logits, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < k; i++) {
        out[i] = (int32_t)csd_quality_argmax(logits, vocab);
        if (p) {
            csd_quality_log_softmax(logits, vocab, logp);
            p[i] = exp(logp[out[i]]);
        }
        if (i + 1 < k && csd_model_forward_seq(m, kv, &out[i], NULL, 1, logits, &err))
            fail_msg("%s", err.msg);
    }
    free(logp);
    free(logits);
    csd_kv_destroy(kv);
}

static void greedy(csd_model *m, const int32_t *text, int64_t n, int k, int32_t *out) {
    greedy_probs(m, text, n, k, out, NULL);
}

static csd_draft_model *new_draft(fixture *f, int slots, int64_t vocab_limit) {
    /* (a call drafts for as many requests as there are slots) */
    csd_draft_model *d = NULL;
    csd_err err = {0};
    if (csd_draft_model_create(&d, f->model, slots, slots, 0, vocab_limit, &err))
        fail_msg("draft model: %s", err.msg);
    return d;
}

/* One job's draft of k tokens after text; returns how many it wrote. */
static int propose(csd_draft_model *d, uint64_t key, const int32_t *text, int64_t n, int k,
                   int32_t *out) {
    csd_draft_job job = {key, text, n, out, k};
    csd_err err = {0};
    if (csd_draft_model_propose(d, &job, 1, &err)) fail_msg("propose: %s", err.msg);
    return job.k;
}

static void prompt_for(int i, int32_t *text, int n) {
    for (int t = 0; t < n; t++) text[t] = (int32_t)(1 + (t * 37 + i * 101) % 290);
}

/* A draft is the greedy continuation; as the text moves on (a partly agreed draft, then a token of
 * the served model's own) or goes back, the next draft is again the text's greedy continuation,
 * at the cost of the positions the slot did not hold. */
static void test_follows_the_text(void **state) {
    fixture *f = *state;
    csd_draft_model *d = new_draft(f, 2, 300);
    int32_t text[CTX], got[8], want[8];
    int64_t n = 12;
    prompt_for(0, text, (int)n);
    assert_int_equal(propose(d, 7, text, n, 5, got), 5);
    greedy(f->model, text, n, 5, want);
    assert_memory_equal(got, want, sizeof(int32_t) * 5);
    assert_int_equal(csd_draft_model_computed(d), n + 4); /* the last draft token is not fed */

    /* the served model agreed with 2 draft tokens, then chose a token of its own */
    memcpy(text + n, got, 2 * sizeof(int32_t));
    text[n + 2] = (got[2] + 1) % 300;
    n += 3;
    int64_t before = csd_draft_model_computed(d);
    assert_int_equal(propose(d, 7, text, n, 4, got), 4);
    greedy(f->model, text, n, 4, want);
    assert_memory_equal(got, want, sizeof(int32_t) * 4);
    assert_int_equal(csd_draft_model_computed(d) - before, 1 + 3); /* its token, then 3 drafts */

    /* back to a shorter text (a request that starts over) */
    n = 9;
    assert_int_equal(propose(d, 7, text, n, 3, got), 3);
    greedy(f->model, text, n, 3, want);
    assert_memory_equal(got, want, sizeof(int32_t) * 3);
    csd_draft_model_destroy(d);
}

/* Three requests in one call draft what each drafts alone, also where a forward holds only 7
 * tokens (the prompts then straddle forwards). A request whose text holds an id the draft model
 * does not have gets no draft, and the others theirs. */
static void test_batch_equals_alone(void **state) {
    fixture *f = *state;
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = 2;
    opts.max_ctx = CTX;
    opts.max_batch = 7;
    csd_model *small_batches = NULL;
    csd_err err = {0};
    if (csd_model_load_hf(&small_batches, f->dir, &opts, &err)) fail_msg("load: %s", err.msg);
    csd_model *models[2] = {f->model, small_batches};
    for (int m = 0; m < 2; m++) {
        csd_draft_model *d = NULL;
        if (csd_draft_model_create(&d, models[m], 4, 4, 0, 300, &err)) fail_msg("%s", err.msg);
        int32_t text[4][CTX], out[4][8], want[8];
        csd_draft_job jobs[4];
        for (int i = 0; i < 4; i++) {
            prompt_for(i, text[i], 8 + 5 * i);
            jobs[i] = (csd_draft_job){(uint64_t)(10 + i), text[i], 8 + 5 * i, out[i], 2 + 2 * i};
        }
        text[3][20] = 350; /* beyond the 300 ids of the draft model (and of the served one) */
        assert_int_equal(csd_draft_model_propose(d, jobs, 4, &err), 0);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(jobs[i].k, 2 + 2 * i);
            greedy(f->model, text[i], 8 + 5 * i, jobs[i].k, want);
            assert_memory_equal(out[i], want, sizeof(int32_t) * (size_t)jobs[i].k);
        }
        assert_int_equal(jobs[3].k, 0);
        /* the three prompts and all but the last token of each draft; nothing of the fourth */
        assert_int_equal(csd_draft_model_computed(d), (8 + 13 + 18) + (1 + 3 + 5));
        csd_draft_model_destroy(d);
    }
    csd_model_destroy(small_batches);
}

/* A released slot keeps its KV for a prompt that starts the same; with every slot held, a new
 * request takes the least recently used one, and a call's jobs beyond the slots get no draft. */
static void test_slots(void **state) {
    fixture *f = *state;
    csd_draft_model *d = new_draft(f, 2, 300);
    int32_t a[CTX], b[CTX], c[CTX], out[4];
    prompt_for(1, a, 20);
    prompt_for(2, b, 20);
    prompt_for(3, c, 20);
    propose(d, 1, a, 20, 2, out);
    propose(d, 2, b, 20, 2, out);
    csd_draft_model_release(d, 1);
    int64_t before = csd_draft_model_computed(d);
    a[19] = (a[19] + 3) % 300; /* request 3 shares a's first 19 tokens */
    assert_int_equal(propose(d, 3, a, 20, 2, out), 2);
    assert_int_equal(csd_draft_model_computed(d) - before, 1 + 1);

    /* a request whose prompt starts as a held slot's copies that prefix: 5 shares b's first 18
     * tokens, and takes 3's slot (released) whose text shares nothing with it */
    csd_draft_model_release(d, 3);
    int32_t e[CTX];
    memcpy(e, b, sizeof e);
    e[18] = (e[18] + 1) % 300;
    before = csd_draft_model_computed(d);
    int32_t want[4];
    assert_int_equal(propose(d, 5, e, 20, 2, out), 2);
    assert_int_equal(csd_draft_model_computed(d) - before, 2 + 1);
    greedy(f->model, e, 20, 2, want);
    assert_memory_equal(out, want, sizeof(int32_t) * 2);
    csd_draft_model_release(d, 5);
    assert_int_equal(propose(d, 3, a, 20, 2, out), 2); /* back, in the slot 5 left */

    /* slots: 2 (b), 3 (a's); 2 is the least recently used, so 4 takes it */
    propose(d, 4, c, 20, 2, out);
    before = csd_draft_model_computed(d);
    propose(d, 3, a, 20, 2, out); /* still held: nothing to catch up */
    assert_int_equal(csd_draft_model_computed(d) - before, 1 + 1);
    before = csd_draft_model_computed(d);
    propose(d, 2, b, 20, 2, out); /* evicted: the whole text again (in 4's slot, now the LRU) */
    assert_int_equal(csd_draft_model_computed(d) - before, 20 + 1);

    /* every slot held (3: a, 2: b; 2 the least recently used): a new request in the same call
     * as 2 takes 3's slot, not 2's */
    propose(d, 3, a, 20, 2, out);
    int32_t g[CTX];
    prompt_for(7, g, 20);
    int32_t o2[2][4];
    csd_draft_job both[2] = {{6, g, 20, o2[0], 2}, {2, b, 20, o2[1], 2}};
    csd_err err2 = {0};
    before = csd_draft_model_computed(d);
    assert_int_equal(csd_draft_model_propose(d, both, 2, &err2), 0);
    assert_int_equal(both[0].k, 2);
    assert_int_equal(both[1].k, 2);
    assert_int_equal(csd_draft_model_computed(d) - before, (20 + 1) + (1 + 1));
    csd_draft_model_release(d, 6);
    propose(d, 3, a, 20, 2, out);

    int32_t o[3][4];
    csd_draft_job jobs[3] = {{2, b, 20, o[0], 2}, {3, a, 20, o[1], 2}, {5, c, 20, o[2], 2}};
    csd_err err = {0};
    assert_int_equal(csd_draft_model_propose(d, jobs, 3, &err), 0);
    assert_int_equal(jobs[0].k, 2);
    assert_int_equal(jobs[1].k, 2);
    assert_int_equal(jobs[2].k, 0); /* both slots are held by this call's other jobs */
    csd_draft_model_destroy(d);
}

/* The slot holds the text and all but the last draft token: a text 2 short of the context takes
 * a draft of 3; one that fills it, 1 (never fed). A token beyond the served model's vocabulary
 * ends a draft. */
static void test_bounds(void **state) {
    fixture *f = *state;
    csd_draft_model *d = new_draft(f, 1, 300);
    int32_t text[CTX], out[8], want[8];
    prompt_for(4, text, CTX);
    assert_int_equal(csd_draft_model_max_ctx(d), CTX);
    assert_int_equal(propose(d, 1, text, CTX - 2, 8, out), 3);
    assert_int_equal(propose(d, 1, text, CTX, 8, out), 1);
    assert_int_equal(propose(d, 1, text, 10, 0, out), 0);
    csd_draft_model_destroy(d);

    prompt_for(5, text, 10);
    greedy(f->model, text, 10, 8, want);
    int32_t limit = 150, expect = 0;
    while (expect < 8 && want[expect] < limit) expect++;
    d = new_draft(f, 1, limit);
    assert_int_equal(propose(d, 1, text, 10, 8, out), expect);
    assert_memory_equal(out, want, sizeof(int32_t) * (size_t)expect);
    printf("a vocabulary limit of %d let %d of 8 draft tokens through\n", limit, expect);
    csd_draft_model_destroy(d);
}

/* Requests of one call whose texts start the same (the choices of an n group) compute that
 * prefix once: the second waits for the first and copies it. */
static void test_group_shares_prompt(void **state) {
    fixture *f = *state;
    csd_draft_model *d = new_draft(f, 3, 300);
    int32_t text[2][CTX], out[2][4], want[4];
    prompt_for(6, text[0], 40);
    memcpy(text[1], text[0], sizeof text[0]);
    text[1][39] = (text[1][39] + 5) % 300; /* the last token differs */
    csd_draft_job jobs[2] = {{21, text[0], 40, out[0], 3}, {22, text[1], 40, out[1], 3}};
    csd_err err = {0};
    assert_int_equal(csd_draft_model_propose(d, jobs, 2, &err), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(jobs[i].k, 3);
        greedy(f->model, text[i], 40, 3, want);
        assert_memory_equal(out[i], want, sizeof(int32_t) * 3);
    }
    /* 40 positions, the second's own last one, and 2 draft positions each */
    assert_int_equal(csd_draft_model_computed(d), 40 + 1 + 2 * 2);
    csd_draft_model_destroy(d);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CONF_TEXTS 6
#define CONF_K 8

/* With a confidence cut-off, a draft is the greedy continuation up to the first token the model
 * gives less than p_min, as computed afresh; a cut-off above every probability leaves no draft,
 * and the slot then drafts in full again without it. */
static void test_p_min(void **state) {
    fixture *f = *state;
    int32_t text[CONF_TEXTS][CTX], want[CONF_TEXTS][CONF_K], got[CONF_K];
    double p[CONF_TEXTS][CONF_K], sorted[CONF_TEXTS * CONF_K];
    for (int i = 0; i < CONF_TEXTS; i++) {
        prompt_for(i, text[i], 10);
        greedy_probs(f->model, text[i], 10, CONF_K, want[i], p[i]);
    }
    memcpy(sorted, p, sizeof sorted);
    qsort(sorted, CONF_TEXTS * CONF_K, sizeof(double), cmp_double);
    /* halfway across the widest gap between the probabilities seen, around the middle: no
     * rounding of a batched forward's logits decides a token */
    int n_p = CONF_TEXTS * CONF_K, at = n_p / 4;
    for (int i = n_p / 4; i < 3 * n_p / 4; i++)
        if (sorted[i + 1] - sorted[i] > sorted[at + 1] - sorted[at]) at = i;
    assert_true(sorted[at + 1] - sorted[at] > 1e-4);
    float p_min = (float)((sorted[at] + sorted[at + 1]) / 2);
    csd_draft_model *d = new_draft(f, CONF_TEXTS, 300);
    csd_draft_model_set_p_min(d, p_min);
    int cut = 0;
    for (int i = 0; i < CONF_TEXTS; i++) {
        int keep = 0;
        while (keep < CONF_K && want[i][keep] < 300 && p[i][keep] >= p_min) keep++;
        assert_int_equal(propose(d, (uint64_t)i + 1, text[i], 10, CONF_K, got), keep);
        assert_memory_equal(got, want[i], sizeof(int32_t) * (size_t)keep);
        cut += keep < CONF_K;
    }
    assert_true(cut > 0); /* the cut-off decided something */
    csd_draft_model_set_p_min(d, (float)sorted[n_p - 1] * 1.001f + 1e-6f);
    assert_int_equal(propose(d, 1, text[0], 10, CONF_K, got), 0);
    csd_draft_model_set_p_min(d, 0);
    assert_int_equal(propose(d, 1, text[0], 10, CONF_K, got), CONF_K);
    assert_memory_equal(got, want[0], sizeof got);
    csd_draft_model_destroy(d);
}

/* The next draft's length: 2 longer after a draft held whole, 1 shorter after a miss. */
static void test_next_k(void **state) {
    (void)state;
    assert_int_equal(csd_draft_next_k(4, 4, 4, 8), 6);
    assert_int_equal(csd_draft_next_k(7, 7, 7, 8), 8);
    assert_int_equal(csd_draft_next_k(4, 4, 3, 8), 3);
    assert_int_equal(csd_draft_next_k(8, 8, 0, 16), 7);
    assert_int_equal(csd_draft_next_k(2, 2, 0, 8), 1);
    assert_int_equal(csd_draft_next_k(1, 1, 0, 8), 1);
    assert_int_equal(csd_draft_next_k(12, 3, 1, 8), 8); /* never beyond max */
    assert_int_equal(csd_draft_next_k(3, 0, 0, 8), 3); /* nothing drafted: nothing learnt */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follows_the_text),
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_group_shares_prompt),
        cmocka_unit_test(test_p_min),
        cmocka_unit_test(test_next_k),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
