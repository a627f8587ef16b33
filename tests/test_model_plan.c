/* Stage planning: --stages N splits contiguously with the largest stage as small as possible
 * (checked against brute force), --stages auto picks the fewest machines that fit and splits in
 * proportion to memory left, impossible fits say how much is missing, N > layers is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "model/stage_plan.h"

#define GiB (1ull << 30)
#define MiB (1ull << 20)

/* Llama-3.2-1B's shape: a large tied vocabulary (embeddings ~ 4 layers' bytes at int8). */
static csd_model_config llama_1b(void) {
    csd_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = CSD_ARCH_LLAMA;
    c.dim = 2048;
    c.hidden_dim = 8192;
    c.n_layers = 16;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 64;
    c.vocab_size = 128256;
    c.max_seq_len = 131072;
    c.tie_embeddings = true;
    return c;
}

/* A model whose embeddings are negligible next to a layer. */
static csd_model_config small_vocab(int64_t layers) {
    csd_model_config c = llama_1b();
    c.vocab_size = 256;
    c.n_layers = layers;
    c.tie_embeddings = false;
    return c;
}

static csd_plan_opts opts(int precision) {
    csd_plan_opts o;
    csd_plan_opts_default(&o);
    o.precision = precision;
    o.ctx = 4096;
    o.slots = 2;
    return o;
}

/* Stages are contiguous, non-empty, cover every layer, embed first, head last; totals add up. */
static void check_shape(const csd_plan *p, const csd_model_config *c) {
    assert_true(p->n_stages >= 1);
    int64_t next = 0;
    for (int i = 0; i < p->n_stages; i++) {
        const csd_plan_stage *s = &p->stages[i];
        assert_int_equal(s->layer_begin, next);
        assert_true(s->layer_end > s->layer_begin);
        assert_int_equal(s->has_embed, i == 0);
        assert_int_equal(s->has_head, i == p->n_stages - 1);
        assert_int_equal(s->total_bytes, s->weight_bytes + s->kv_bytes + s->overhead_bytes);
        next = s->layer_end;
    }
    assert_int_equal(next, c->n_layers);
}

static uint64_t max_total(const csd_plan *p) {
    uint64_t m = 0;
    for (int i = 0; i < p->n_stages; i++)
        if (p->stages[i].total_bytes > m) m = p->stages[i].total_bytes;
    return m;
}

/* Smallest possible largest stage over every split of L layers into n non-empty stages. */
static uint64_t brute_min_max(const csd_plan_costs *k, int64_t L, int n, int i, int64_t left,
                              uint64_t worst) {
    if (i == n - 1) {
        uint64_t t = k->overhead_bytes + (uint64_t)left * k->layer_bytes +
                     (n == 1 ? k->embed_bytes + k->head_shared_bytes : k->head_bytes);
        return t > worst ? t : worst;
    }
    uint64_t best = UINT64_MAX;
    for (int64_t a = 1; a <= left - (n - 1 - i); a++) {
        uint64_t t =
            k->overhead_bytes + (uint64_t)a * k->layer_bytes + (i == 0 ? k->embed_bytes : 0);
        uint64_t r = brute_min_max(k, L, n, i + 1, left - a, t > worst ? t : worst);
        if (r < best) best = r;
    }
    return best;
}

static void test_even_every_n_is_optimal(void **state) {
    (void)state;
    static const int precisions[] = {CSD_DTYPE_F32, CSD_DTYPE_F16, CSD_DTYPE_Q8, CSD_DTYPE_Q4};
    csd_model_config c = llama_1b();
    for (size_t pi = 0; pi < 4; pi++) {
        csd_plan_opts o = opts(precisions[pi]);
        csd_plan_costs k;
        assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), 0);
        for (int n = 1; n <= 16; n++) {
            csd_plan p;
            csd_err err = {0};
            assert_int_equal(csd_plan_even(&p, &c, &o, n, &err), 0);
            assert_int_equal(p.n_stages, n);
            check_shape(&p, &c);
            if (n <= 6)
                assert_int_equal(max_total(&p), brute_min_max(&k, c.n_layers, n, 0, c.n_layers, 0));
        }
    }
}

static void test_even_accounts_for_embeddings(void **state) {
    (void)state;
    csd_model_config c = llama_1b();
    csd_plan_opts o = opts(CSD_DTYPE_Q8);
    csd_plan p;
    assert_int_equal(csd_plan_even(&p, &c, &o, 4, NULL), 0);
    /* Stage 0 carries the embeddings and stage 3 the head copy: each gets fewer layers. */
    int64_t n0 = p.stages[0].layer_end - p.stages[0].layer_begin;
    int64_t n1 = p.stages[1].layer_end - p.stages[1].layer_begin;
    int64_t n3 = p.stages[3].layer_end - p.stages[3].layer_begin;
    assert_true(n0 < n1);
    assert_true(n3 < n1);
    /* Without a big vocabulary the split is as even as layer counts allow: 3, 4, 3. */
    csd_model_config s = small_vocab(10);
    assert_int_equal(csd_plan_even(&p, &s, &o, 3, NULL), 0);
    assert_int_equal(p.stages[0].layer_end - p.stages[0].layer_begin, 3);
    assert_int_equal(p.stages[1].layer_end - p.stages[1].layer_begin, 4);
    assert_int_equal(p.stages[2].layer_end - p.stages[2].layer_begin, 3);
    /* Odd N, prime layer counts: all fine. */
    s = small_vocab(7);
    for (int n = 1; n <= 7; n++) {
        assert_int_equal(csd_plan_even(&p, &s, &o, n, NULL), 0);
        check_shape(&p, &s);
    }
}

static void test_even_refuses_bad_n(void **state) {
    (void)state;
    csd_model_config c = small_vocab(5);
    csd_plan_opts o = opts(CSD_DTYPE_F16);
    csd_plan p;
    csd_err err = {0};
    assert_int_equal(csd_plan_even(&p, &c, &o, 6, &err), CSD_ERANGE);
    assert_non_null(strstr(err.msg, "5 layers"));
    assert_int_equal(csd_plan_even(&p, &c, &o, 0, &err), CSD_ERANGE);
    assert_int_equal(csd_plan_even(&p, &c, &o, -3, &err), CSD_ERANGE);
    assert_int_equal(csd_plan_even(&p, &c, &o, 5, &err), 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(p.stages[i].layer_end - p.stages[i].layer_begin, 1);
}

static void test_auto_single_machine(void **state) {
    (void)state;
    csd_model_config c = llama_1b();
    csd_plan_opts o = opts(CSD_DTYPE_Q4);
    uint64_t m[] = {16 * GiB, 8 * GiB};
    csd_plan p;
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 2, NULL), 0);
    assert_int_equal(p.n_stages, 1); /* the fewest: one machine holds it */
    check_shape(&p, &c);
    assert_int_equal(p.stages[0].machine_bytes, 16 * GiB);
    assert_true(p.stages[0].total_bytes <= 16 * GiB);
}

static void test_auto_exact_fit(void **state) {
    (void)state;
    csd_model_config c = llama_1b();
    csd_plan_opts o = opts(CSD_DTYPE_F16);
    csd_plan_costs k;
    assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), 0);
    uint64_t exact = k.overhead_bytes + k.embed_bytes + k.head_shared_bytes + 16 * k.layer_bytes;
    uint64_t m[] = {exact, exact};
    csd_plan p;
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 2, NULL), 0);
    assert_int_equal(p.n_stages, 1);
    assert_int_equal(p.stages[0].total_bytes, exact);
    /* One byte less: the first machine alone no longer fits, the two together do. */
    m[0] = exact - 1;
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 2, NULL), 0);
    assert_int_equal(p.n_stages, 2);
    check_shape(&p, &c);
    for (int i = 0; i < 2; i++) assert_true(p.stages[i].total_bytes <= m[i]);
}

static void test_auto_uneven_memory_is_proportional(void **state) {
    (void)state;
    csd_model_config c = small_vocab(30);
    csd_plan_opts o = opts(CSD_DTYPE_Q8);
    csd_plan_costs k;
    assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), 0);
    /* Memory left after fixed costs in ratio 1 : 2 : 3, 30 layers, room for all of them exactly
     * when split 5 : 10 : 15, and not on fewer machines. */
    uint64_t m[3];
    for (int i = 0; i < 3; i++)
        m[i] = k.overhead_bytes + (i == 0 ? k.embed_bytes : 0) + (i == 2 ? k.head_bytes : 0) +
               (uint64_t)(5 * (i + 1)) * k.layer_bytes;
    csd_plan p;
    csd_err err = {0};
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 3, &err), 0);
    assert_int_equal(p.n_stages, 3);
    check_shape(&p, &c);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(p.stages[i].layer_end - p.stages[i].layer_begin, 5 * (i + 1));
        assert_int_equal(p.stages[i].total_bytes, m[i]);
        assert_int_equal(p.stages[i].machine_bytes, m[i]);
    }
    /* Room to spare (7, 14 and 21 layers' worth), 24 layers: two machines hold at most 20, so all
     * three are used, with shares proportional to memory left: 4, 8, 12. */
    for (int i = 0; i < 3; i++) m[i] += 2 * k.layer_bytes * (uint64_t)(i + 1);
    csd_model_config c24 = small_vocab(24);
    assert_int_equal(csd_plan_auto(&p, &c24, &o, m, 3, &err), 0);
    assert_int_equal(p.n_stages, 3);
    check_shape(&p, &c24);
    assert_int_equal(p.stages[0].layer_end - p.stages[0].layer_begin, 4);
    assert_int_equal(p.stages[1].layer_end - p.stages[1].layer_begin, 8);
    assert_int_equal(p.stages[2].layer_end - p.stages[2].layer_begin, 12);
    for (int i = 0; i < 3; i++) assert_true(p.stages[i].total_bytes <= m[i]);
}

static void test_auto_impossible_says_what_is_missing(void **state) {
    (void)state;
    csd_model_config c = llama_1b();
    csd_plan_opts o = opts(CSD_DTYPE_F32);
    uint64_t m[] = {1 * GiB, 1 * GiB, 1 * GiB};
    csd_plan p;
    csd_err err = {0};
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 3, &err), CSD_EFULL);
    assert_non_null(strstr(err.msg, "missing"));
    assert_non_null(strstr(err.msg, "3 machine(s) offer 3.00 GiB"));
    csd_plan_costs k;
    assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), 0);
    uint64_t need = 3 * k.overhead_bytes + k.embed_bytes + k.head_bytes + 16 * k.layer_bytes;
    char want[64], amount[32];
    snprintf(want, sizeof want, "%s missing",
             csd_plan_fmt_bytes(need - 3 * GiB, amount, sizeof amount));
    if (!strstr(err.msg, want)) fail_msg("'%s' lacks '%s'", err.msg, want);
    /* A machine too small for a single layer is named. */
    uint64_t m2[] = {64 * GiB, 64 * MiB};
    assert_int_equal(csd_plan_auto(&p, &c, &o, m2, 2, &err), 0); /* the first one suffices */
    assert_int_equal(p.n_stages, 1);
    /* Enough in total, the first alone falls half a layer short, the second cannot take a layer. */
    uint64_t m3[] = {k.overhead_bytes + k.embed_bytes + 15 * k.layer_bytes + k.layer_bytes / 2,
                     k.overhead_bytes + k.head_bytes + k.layer_bytes / 2 + MiB};
    assert_int_equal(csd_plan_auto(&p, &c, &o, m3, 2, &err), CSD_EFULL);
    assert_non_null(strstr(err.msg, "machine 2"));
    assert_non_null(strstr(err.msg, "cannot hold even one layer"));
    /* Bad inputs. */
    uint64_t zero[] = {0};
    assert_int_equal(csd_plan_auto(&p, &c, &o, zero, 1, &err), CSD_ERANGE);
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 0, &err), CSD_ERANGE);
}

static void test_auto_more_machines_than_layers(void **state) {
    (void)state;
    csd_model_config c = small_vocab(2);
    csd_plan_opts o = opts(CSD_DTYPE_F16);
    csd_plan_costs k;
    assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), 0);
    uint64_t one =
        k.overhead_bytes + k.embed_bytes + k.head_bytes + k.layer_bytes; /* one layer each */
    uint64_t m[] = {one, one, one, one};
    csd_plan p;
    assert_int_equal(csd_plan_auto(&p, &c, &o, m, 4, NULL), 0);
    assert_int_equal(p.n_stages, 2);
    check_shape(&p, &c);
}

static void test_parse_bytes(void **state) {
    (void)state;
    uint64_t v;
    assert_int_equal(csd_plan_parse_bytes("8G", &v, NULL), 0);
    assert_true(v == 8 * GiB);
    assert_int_equal(csd_plan_parse_bytes("512M", &v, NULL), 0);
    assert_true(v == 512 * MiB);
    assert_int_equal(csd_plan_parse_bytes("1.5G", &v, NULL), 0);
    assert_true(v == 3 * GiB / 2);
    assert_int_equal(csd_plan_parse_bytes("8GiB", &v, NULL), 0);
    assert_true(v == 8 * GiB);
    assert_int_equal(csd_plan_parse_bytes("16gb", &v, NULL), 0);
    assert_true(v == 16 * GiB);
    assert_int_equal(csd_plan_parse_bytes("12345", &v, NULL), 0);
    assert_true(v == 12345);
    static const char *const bad[] = {"",    "G",    "-1G", "0",     "8X",
                                      "8GG", "nanG", "inf", "2000T", "1e400"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        csd_err err = {0};
        assert_int_not_equal(csd_plan_parse_bytes(bad[i], &v, &err), 0);
        assert_true(err.msg[0] != '\0');
    }
    uint64_t list[4];
    int n;
    assert_int_equal(csd_plan_parse_memory_list("8G,16G,512M", list, 4, &n, NULL), 0);
    assert_int_equal(n, 3);
    assert_true(list[2] == 512 * MiB);
    assert_int_not_equal(csd_plan_parse_memory_list("8G,,16G", list, 4, &n, NULL), 0);
    assert_int_not_equal(csd_plan_parse_memory_list("8G,", list, 4, &n, NULL), 0);
    assert_int_not_equal(csd_plan_parse_memory_list("1G,1G,1G,1G,1G", list, 4, &n, NULL), 0);
}

/* The estimate's KV cache per token and layer: keys and values of 8 heads of 64, at 4, 2 or 1
 * byte a value, plus q8's f32 scale per head and position; other types are refused. */
static void test_kv_bytes_per_type(void **state) {
    (void)state;
    csd_model_config c = llama_1b();
    const int types[3] = {CSD_DTYPE_F32, CSD_DTYPE_F16, CSD_DTYPE_Q8};
    const uint64_t want[3] = {2 * 512 * 4, 2 * 512 * 2, 2 * (512 + 8 * 4)};
    for (int i = 0; i < 3; i++) {
        csd_plan_opts o = opts(CSD_DTYPE_Q8);
        o.kv_dtype = types[i];
        csd_plan_costs k;
        assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), 0);
        assert_true(k.kv_bytes_per_token_layer == want[i]);
        assert_true(k.layer_bytes == k.layer_weight_bytes + want[i] * 4096 * 2);
    }
    csd_plan_opts o = opts(CSD_DTYPE_Q8);
    o.kv_dtype = CSD_DTYPE_BF16;
    csd_plan_costs k;
    assert_int_equal(csd_plan_costs_get(&k, &c, &o, NULL), CSD_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_even_every_n_is_optimal),
        cmocka_unit_test(test_even_accounts_for_embeddings),
        cmocka_unit_test(test_even_refuses_bad_n),
        cmocka_unit_test(test_auto_single_machine),
        cmocka_unit_test(test_auto_exact_fit),
        cmocka_unit_test(test_auto_uneven_memory_is_proportional),
        cmocka_unit_test(test_auto_impossible_says_what_is_missing),
        cmocka_unit_test(test_auto_more_machines_than_layers),
        cmocka_unit_test(test_parse_bytes),
        cmocka_unit_test(test_kv_bytes_per_type),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
