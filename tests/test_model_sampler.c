/* The sampler: greedy is argmax, a seed reproduces a draw, top-k 1 is greedy, logit bias moves
 * the choice (and is checked), and the top logprobs are the k largest in order with log-softmax
 * values (checked against brute force); a penalty near 0 leaves the weights finite. Top-k, top-p
 * and min-p draw from the distribution a sort of the vocabulary gives (frequencies over 10^5
 * draws), also on a 152K vocabulary, where a sort per token would be far too slow. The OpenAI
 * scope of the penalties counts the answer's tokens for presence and frequency, all of them, and
 * the prompt's too for repetition; llama.cpp's counts the last 64, prompt included. NaN and
 * infinite logits never give a NaN token or an id outside the vocabulary. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "model/sampler.h"

#define V 1000

static void fill(float *x, unsigned seed) {
    for (int i = 0; i < V; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) % 2000) / 100.0f - 10.0f;
    }
    x[V / 3] = x[V / 2]; /* a tie */
}

static void test_top_logprobs_brute_force(void **state) {
    (void)state;
    float x[V];
    fill(x, 7);
    int32_t ids[20];
    float lp[20];
    assert_int_equal(csd_top_logprobs(x, V, 20, ids, lp), 0);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)x[i]);
    for (int k = 0; k < 20; k++) {
        int rank = 0; /* how many beat ids[k] (higher, or equal with a lower id) */
        for (int i = 0; i < V; i++) rank += x[i] > x[ids[k]] || (x[i] == x[ids[k]] && i < ids[k]);
        assert_int_equal(rank, k);
        assert_true(fabs(lp[k] - (x[ids[k]] - log(sum))) < 1e-4);
        assert_true(fabs(csd_logprob_of(x, V, ids[k]) - lp[k]) < 1e-5);
    }
    assert_int_equal(csd_top_logprobs(x, V, 21, ids, lp), CSD_ERANGE);
}

static int32_t draw(const csd_sampler_params *p, const float *x) {
    csd_sampler *s = NULL;
    assert_int_equal(csd_sampler_create(&s, p, V, NULL), 0);
    float copy[V];
    for (int i = 0; i < V; i++) copy[i] = x[i];
    int32_t id = csd_sampler_sample(s, copy);
    csd_sampler_destroy(s);
    return id;
}

static void test_greedy_seed_topk(void **state) {
    (void)state;
    float x[V];
    fill(x, 3);
    int32_t best = 0;
    for (int i = 1; i < V; i++) best = x[i] > x[best] ? i : best;
    csd_sampler_params p;
    csd_sampler_params_default(&p);
    p.temperature = 0;
    assert_int_equal(draw(&p, x), best);
    p.temperature = 5.0f; /* hot: draws spread over many ids */
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    int32_t a = draw(&p, x), b = draw(&p, x);
    assert_int_equal(a, b); /* same seed, same draw */
    int differs = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        p.seed = seed;
        differs += draw(&p, x) != a;
    }
    assert_true(differs > 0);
    p.top_k = 1;
    assert_int_equal(draw(&p, x), best);
}

static void test_logit_bias(void **state) {
    (void)state;
    float x[V];
    fill(x, 5);
    int32_t best = 0, second = -1;
    for (int i = 1; i < V; i++) best = x[i] > x[best] ? i : best;
    for (int i = 0; i < V; i++)
        if (i != best && (second < 0 || x[i] > x[second])) second = i;
    csd_sampler_params p;
    csd_sampler_params_default(&p);
    p.temperature = 0;
    assert_true(csd_sampler_is_plain_argmax(&p));
    p.n_logit_bias = 1;
    p.logit_bias[0] = (csd_logit_bias){best, -100.0f}; /* banned: the runner-up wins */
    assert_false(csd_sampler_is_plain_argmax(&p));     /* a fleet must send the logits */
    assert_int_equal(draw(&p, x), second);
    int32_t worst = 0;
    for (int i = 1; i < V; i++) worst = x[i] < x[worst] ? i : worst;
    p.logit_bias[0] = (csd_logit_bias){worst, 100.0f}; /* forced, even when sampling hot */
    assert_int_equal(draw(&p, x), worst);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        p.seed = seed;
        assert_int_equal(draw(&p, x), worst);
    }
    /* refused: outside the vocabulary, out of range, too many */
    csd_sampler *s = NULL;
    p.logit_bias[0] = (csd_logit_bias){V, 1.0f};
    assert_int_equal(csd_sampler_create(&s, &p, V, NULL), CSD_ERANGE);
    p.logit_bias[0] = (csd_logit_bias){-1, 1.0f};
    assert_int_equal(csd_sampler_create(&s, &p, V, NULL), CSD_ERANGE);
    p.logit_bias[0] = (csd_logit_bias){1, NAN};
    assert_int_equal(csd_sampler_create(&s, &p, V, NULL), CSD_ERANGE);
    p.logit_bias[0] = (csd_logit_bias){1, 100.5f};
    assert_int_equal(csd_sampler_create(&s, &p, V, NULL), CSD_ERANGE);
    p.logit_bias[0] = (csd_logit_bias){1, 1.0f};
    p.n_logit_bias = CSD_SAMPLER_MAX_LOGIT_BIAS + 1;
    assert_int_equal(csd_sampler_create(&s, &p, V, NULL), CSD_ERANGE);
    assert_null(s);
}

/* A repetition penalty near 0 divides a repeated token's positive logit past the float range. The
 * logit stops at the largest float, so the softmax stays finite and that token is the one drawn
 * (with an infinite logit the weights were NaN and the draw fell to the last candidate). */
static void test_penalty_overflow(void **state) {
    (void)state;
    float x[V];
    fill(x, 9);
    int32_t seen = -1; /* the smallest positive logit: far from the top before the penalty */
    for (int i = 0; i < V; i++)
        if (x[i] > 0 && (seen < 0 || x[i] < x[seen])) seen = i;
    assert_true(seen >= 0);
    csd_sampler_params p;
    csd_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1e-44f; /* accepted: in (0, 10] */
    for (int k = 0; k < 3; k++) {
        p.top_p = k == 1 ? 0.5f : 1.0f;
        p.top_k = k == 2 ? 40 : 0;
        for (uint64_t seed = 1; seed <= 8; seed++) {
            p.seed = seed;
            csd_sampler *s = NULL;
            assert_int_equal(csd_sampler_create(&s, &p, V, NULL), 0);
            csd_sampler_accept(s, seen);
            float copy[V];
            for (int i = 0; i < V; i++) copy[i] = x[i];
            assert_int_equal(csd_sampler_sample(s, copy), seen);
            assert_true(isfinite(copy[seen]));
            csd_sampler_destroy(s);
        }
    }
}

/* ---- top-k, top-p and min-p against a sort ---- */

typedef struct ranked {
    int32_t id;
    float logit;
} ranked;

static int by_rank(const void *a, const void *b) { /* higher logit first, lower id on ties */
    const ranked *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

/* Temperature and the three cuts of one case. */
typedef struct cut_case {
    float t, top_p, min_p;
    int top_k;
} cut_case;

static csd_sampler_params params_of(const cut_case *c) {
    csd_sampler_params p;
    csd_sampler_params_default(&p);
    p.temperature = c->t;
    p.top_p = c->top_p;
    p.min_p = c->min_p;
    p.top_k = c->top_k;
    return p;
}

/* The distribution p samples from over x[0..n), by sorting: prob[i] (0 for a token cut). */
static void reference_probs(const csd_sampler_params *p, const float *x, int32_t n, double *prob) {
    ranked *r = malloc((size_t)n * sizeof *r);
    double *w = malloc((size_t)n * sizeof *w);
    assert_non_null(r);
    assert_non_null(w);
    for (int32_t i = 0; i < n; i++) r[i] = (ranked){i, x[i]};
    qsort(r, (size_t)n, sizeof *r, by_rank);
    int32_t kept = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double total = 0, cum = 0, sum = 0;
    for (int32_t i = 0; i < kept; i++)
        total += w[i] = exp((r[i].logit - r[0].logit) / p->temperature);
    int32_t cut = 0;
    while (cut < kept && (p->top_p >= 1.0f || cum < p->top_p * total)) cum += w[cut++];
    while (cut > 1 && w[cut - 1] < p->min_p) cut--;
    for (int32_t i = 0; i < n; i++) prob[i] = 0;
    for (int32_t i = 0; i < cut; i++) sum += w[i];
    for (int32_t i = 0; i < cut; i++) prob[r[i].id] = w[i] / sum;
    free(r);
    free(w);
}

/* 10^5 draws of p over 12 logits (a tie among them) match the sorted distribution: nothing cut
 * is ever drawn, and each kept token's frequency is within 4.5 standard deviations of its
 * probability (the draws are seeded: the same every run). */
static void test_cuts_match_sorted_distribution(void **state) {
    (void)state;
    enum { N = 12, DRAWS = 100000 };
    const float x[N] = {-1, 2.5f, 0.5f, 3, -8, 2, -2, 2.5f, 1, -5, 0, -3};
    const cut_case cases[] = {
        {1, 1, 0, 0},    {1, 0.7f, 0, 0},    {1, 1, 0.2f, 0},      {1, 0.9f, 0.1f, 0},
        {1, 0.8f, 0, 5}, {0.5f, 0.6f, 0, 0}, {2, 0.95f, 0.05f, 0}, {1, 1, 1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        csd_sampler_params p = params_of(&cases[c]);
        p.seed = 1000 + c;
        double prob[N];
        reference_probs(&p, x, N, prob);
        csd_sampler *s = NULL;
        assert_int_equal(csd_sampler_create(&s, &p, N, NULL), 0);
        int count[N] = {0};
        float copy[N];
        for (int d = 0; d < DRAWS; d++) {
            for (int i = 0; i < N; i++) copy[i] = x[i];
            count[csd_sampler_pick(s, copy)]++;
        }
        csd_sampler_destroy(s);
        for (int i = 0; i < N; i++) {
            double f = (double)count[i] / DRAWS, sd = sqrt(prob[i] * (1 - prob[i]) / DRAWS);
            if (prob[i] == 0) assert_int_equal(count[i], 0);
            else assert_true(fabs(f - prob[i]) <= 4.5 * sd + 1e-9);
        }
    }
}

/* On a 152K vocabulary of near-flat logits, min-p alone and top-p alone keep thousands of
 * tokens: every draw is one the sorted distribution keeps. */
static void test_cuts_large_vocabulary(void **state) {
    (void)state;
    enum { BIG = 151936 };
    float *x = malloc(BIG * sizeof *x), *copy = malloc(BIG * sizeof *copy);
    double *prob = malloc(BIG * sizeof *prob);
    assert_true(x && copy && prob);
    unsigned seed = 11;
    for (int i = 0; i < BIG; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) % 20000) / 1000.0f - 10.0f;
    }
    const cut_case cases[2] = {{1, 1, 0.05f, 0}, {1, 0.9f, 0, 0}};
    for (int c = 0; c < 2; c++) {
        csd_sampler_params p = params_of(&cases[c]);
        reference_probs(&p, x, BIG, prob);
        int kept = 0;
        for (int i = 0; i < BIG; i++) kept += prob[i] > 0;
        assert_true(kept > 1000 && kept < BIG);
        csd_sampler *s = NULL;
        assert_int_equal(csd_sampler_create(&s, &p, BIG, NULL), 0);
        for (int d = 0; d < 50; d++) {
            for (int i = 0; i < BIG; i++) copy[i] = x[i];
            assert_true(prob[csd_sampler_pick(s, copy)] > 0);
        }
        csd_sampler_destroy(s);
    }
    free(x);
    free(copy);
    free(prob);
}

/* Logits that are not all finite (a NaN-poisoned hidden state, an infinite bias): a NaN is never
 * drawn while a number is there, an infinite logit is the choice, all-NaN still gives an id of the
 * vocabulary; on 152K tokens, half of them NaN, top-p stays fast (it went quadratic). */
static void test_non_finite_logits(void **state) {
    (void)state;
    enum { BIG = 151936 };
    float *x = malloc(BIG * sizeof *x), *copy = malloc(BIG * sizeof *copy);
    assert_true(x && copy);
    const cut_case cases[] = {
        {0, 1, 0, 0}, {1, 1, 0, 0}, {1, 0.9f, 0, 0}, {1, 1, 0.05f, 0}, {1, 0.9f, 0.05f, 40},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        csd_sampler_params p = params_of(&cases[c]);
        csd_sampler *s = NULL;
        assert_int_equal(csd_sampler_create(&s, &p, BIG, NULL), 0);
        for (int kind = 0; kind < 3; kind++) { /* half NaN; NaN and one +inf; all NaN */
            for (int i = 0; i < BIG; i++) x[i] = kind == 2 || i % 2 == 0 ? NAN : (float)(i % 7);
            if (kind == 1) x[1001] = INFINITY;
            for (int d = 0; d < 5; d++) {
                for (int i = 0; i < BIG; i++) copy[i] = x[i];
                int32_t id = csd_sampler_pick(s, copy);
                assert_true(id >= 0 && id < BIG);
                if (kind == 0) assert_false(isnan(x[id]));
                if (kind == 1) assert_int_equal(id, 1001);
            }
        }
        csd_sampler_destroy(s);
    }
    free(x);
    free(copy);
}

/* ---- penalty scopes ---- */

/* The greedy token after p's penalties, over logits where token 1 leads token 2 by 1, once the
 * sampler has taken `prompt` as the prompt and then `answer` as generated tokens: n_answer of
 * them, the first n_first being token 1 and the rest token 3. */
static int32_t greedy_after(int scope, float presence, float frequency, float repetition,
                            bool prompt, int n_answer, int n_first) {
    csd_sampler_params p;
    csd_sampler_params_default(&p);
    p.temperature = 0;
    p.penalty_scope = scope;
    p.presence_penalty = presence;
    p.frequency_penalty = frequency;
    p.repetition_penalty = repetition;
    csd_sampler *s = NULL;
    assert_int_equal(csd_sampler_create(&s, &p, 8, NULL), 0);
    if (prompt) csd_sampler_accept_prompt(s, 1);
    for (int i = 0; i < n_answer; i++) csd_sampler_accept(s, i < n_first ? 1 : 3);
    float x[8] = {0, 3, 2, -5, 0, 0, 0, 0};
    int32_t id = csd_sampler_sample(s, x);
    csd_sampler_destroy(s);
    return id;
}

static void test_penalty_scopes(void **state) {
    (void)state;
    const int R = CSD_PENALTY_RECENT, O = CSD_PENALTY_OPENAI;
    /* a token of the prompt: llama.cpp's scope penalises it, OpenAI's presence does not */
    assert_int_equal(greedy_after(R, 2, 0, 1, true, 0, 0), 2);
    assert_int_equal(greedy_after(O, 2, 0, 1, true, 0, 0), 1);
    assert_int_equal(greedy_after(O, 0, 2, 1, true, 0, 0), 1);
    /* ... but repetition counts the prompt in both (vLLM's) */
    assert_int_equal(greedy_after(R, 0, 0, 10, true, 0, 0), 2);
    assert_int_equal(greedy_after(O, 0, 0, 10, true, 0, 0), 2);
    /* generated once: both penalise it */
    assert_int_equal(greedy_after(O, 2, 0, 1, false, 1, 1), 2);
    assert_int_equal(greedy_after(O, 0, 2, 1, false, 1, 1), 2);
    /* generated 100 tokens back: out of llama.cpp's 64-token window, still in OpenAI's answer */
    assert_int_equal(greedy_after(R, 0, 0.5f, 1, false, 200, 100), 1);
    assert_int_equal(greedy_after(O, 0, 0.5f, 1, false, 200, 100), 2);
    /* frequency is per occurrence: 0.4 once does not close a gap of 1, three times does */
    assert_int_equal(greedy_after(O, 0, 0.4f, 1, false, 1, 1), 1);
    assert_int_equal(greedy_after(O, 0, 0.4f, 1, false, 3, 3), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_logprobs_brute_force),
        cmocka_unit_test(test_greedy_seed_topk),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_penalty_overflow),
        cmocka_unit_test(test_cuts_match_sorted_distribution),
        cmocka_unit_test(test_cuts_large_vocabulary),
        cmocka_unit_test(test_penalty_scopes),
        cmocka_unit_test(test_non_finite_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
