/* The sampler: greedy is argmax, a seed reproduces a draw, top-k 1 is greedy, logit bias moves
 * the choice (and is checked), and the top logprobs are the k largest in order with log-softmax
 * values (checked against brute force); a penalty near 0 leaves the weights finite. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_logprobs_brute_force),
        cmocka_unit_test(test_greedy_seed_topk),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_penalty_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
