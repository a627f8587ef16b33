/* The real trained stories260K model reproduces llama2.c's greedy continuation (golden.json)
 * exactly at f32, whatever the batch split of the prompt, and the decode step allocates nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "core/alloc.h"
#include "kern/kern.h"
#include "model/model.h"
#include "test_util.h"

typedef struct golden {
    int32_t prompt[16];
    int n_prompt;
    int32_t ids[128];
    int n_ids;
} golden;

static void load_golden(golden *g) {
    json_error_t jerr;
    json_t *root = json_load_file(CSD_STORIES_DIR "/golden.json", 0, &jerr);
    assert_non_null(root);
    json_t *p = json_object_get(root, "prompt_ids"), *ids = json_object_get(root, "greedy_ids");
    g->n_prompt = (int)json_array_size(p);
    g->n_ids = (int)json_array_size(ids);
    assert_true(g->n_prompt > 0 && g->n_prompt <= 16 && g->n_ids <= 128);
    for (int i = 0; i < g->n_prompt; i++)
        g->prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
    for (int i = 0; i < g->n_ids; i++)
        g->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    json_decref(root);
}

static int32_t argmax(const float *x, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

/* Greedy decode from the golden prompt with the prompt fed in chunks of `chunk` tokens. */
static void greedy_matches_golden(int chunk, int threads) {
    CSD_REQUIRE_FILE(CSD_STORIES_DIR "/golden.json");
    golden g;
    load_golden(&g);
    csd_kern_init();
    csd_model_opts opts;
    csd_model_opts_default(&opts);
    opts.n_threads = threads;
    csd_model *m = NULL;
    csd_err err = {0};
    int rc = csd_model_load_hf(&m, CSD_STORIES_DIR, &opts, &err);
    if (rc) fail_msg("load: %s", err.msg);
    csd_kv *kv = NULL;
    assert_int_equal(csd_kv_create(&kv, m, 0, &err), 0);
    float logits[512];
    int32_t seq[128];
    memcpy(seq, g.prompt, sizeof(int32_t) * (size_t)g.n_prompt);
    int n = g.n_prompt;
    for (int done = 0; done < n; done += chunk) {
        int len = n - done < chunk ? n - done : chunk;
        assert_int_equal(csd_model_forward_seq(m, kv, seq + done, NULL, len, logits, &err), 0);
    }
    uint64_t allocs_before = csd_alloc_count();
    while (n < g.n_ids) {
        seq[n] = argmax(logits, 512);
        assert_int_equal(seq[n], g.ids[n]);
        n++;
        if (n < g.n_ids)
            assert_int_equal(csd_model_forward_seq(m, kv, &seq[n - 1], NULL, 1, logits, &err), 0);
    }
    assert_int_equal(csd_alloc_count(), allocs_before); /* the decode loop allocated nothing */
    csd_kv_destroy(kv);
    csd_model_destroy(m);
}

static void test_golden_whole_prompt(void **state) {
    (void)state;
    greedy_matches_golden(64, 1);
}

static void test_golden_token_by_token_two_threads(void **state) {
    (void)state;
    greedy_matches_golden(1, 2);
}

static void test_golden_chunks_of_two(void **state) {
    (void)state;
    greedy_matches_golden(2, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_whole_prompt),
        cmocka_unit_test(test_golden_token_by_token_two_threads),
        cmocka_unit_test(test_golden_chunks_of_two),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
