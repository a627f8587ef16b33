/* A stage that refuses some requests of a batched step fails those alone, each with its own reason,
 * and the others' logits arrive. The stage is a fake one (tests/fake_stage.h) that refuses
 * requests 11 and 13 with different codes and texts and answers 12. Through step_end with
 * per-entry errors each refused entry gets its own code and message (until stop 49 every refused
 * entry got the first refusal's text), the answered one none; without them the step fails with
 * the first. A refused OPEN's reason reaches the step that then finds the request not open. An
 * error that names its stage ("stage N: ...", as a worker's do) is reported with that stage's
 * address. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <time.h>

#include "fake_stage.h"

#define N_ENTRIES 3
#define FIRST_REQ 11

static const char *refuse_odd(uint32_t request_id, int *code) {
    *code = request_id == 11 ? CSD_ERANGE : CSD_ENOTFOUND;
    /* a worker names itself (stage_server.c, send_req_error); a peer that does not is named by
     * the link the refusal came on */
    if (request_id == 11) return "stage 0: request 11: position beyond this stage's context";
    if (request_id == 13) return "request 13 is not open on this stage";
    return NULL;
}

/* Opens requests 11..13 and begins one step with a token of each, all wanting logits. */
static void begin_step(csd_pipeline *p, float *logits) {
    static int32_t ids[N_ENTRIES] = {1, 2, 3};
    csd_step_entry e[N_ENTRIES];
    csd_err err = {0};
    for (int i = 0; i < N_ENTRIES; i++) {
        uint32_t req = FIRST_REQ + (uint32_t)i;
        if (p->ops->open(p, req, 64, &err)) fail_msg("open %u: %s", req, err.msg);
        e[i] = (csd_step_entry){.req = req, .ids = &ids[i], .n = 1, .want_logits = true};
    }
    if (p->ops->step_begin(p, e, N_ENTRIES, logits, &err)) fail_msg("step_begin: %s", err.msg);
}

static csd_pipeline *fleet_over(fake_stage *fs) {
    memset(fs, 0, sizeof *fs);
    fs->answer_pings = true;
    fs->refusal = refuse_odd;
    return fake_stage_fleet(fs, 10000);
}

static void test_each_refused_entry_has_its_reason(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = fleet_over(&fs);
    float logits[N_ENTRIES * FAKE_STAGE_VOCAB] = {0};
    begin_step(p, logits);
    csd_err entry_err[N_ENTRIES], err = {0};
    memset(entry_err, 0x5a, sizeof entry_err); /* every entry must be written */
    assert_int_equal(p->ops->step_end(p, entry_err, &err), 0);
    assert_int_equal(entry_err[0].code, CSD_ERANGE);
    assert_non_null(strstr(entry_err[0].msg, "request 11: position beyond"));
    assert_non_null(strstr(entry_err[0].msg, "stage 0 at 127.0.0.1:")); /* the stage it names */
    assert_int_equal(entry_err[1].code, 0);
    assert_string_equal(entry_err[1].msg, "");
    assert_int_equal(entry_err[2].code, CSD_ENOTFOUND);
    assert_non_null(strstr(entry_err[2].msg, "request 13 is not open"));
    assert_non_null(strstr(entry_err[2].msg, "stage at 127.0.0.1:")); /* names the stage */
    /* request 12's logits fill the packed row of its entry */
    int best = 0;
    for (int v = 1; v < FAKE_STAGE_VOCAB; v++)
        if (logits[FAKE_STAGE_VOCAB + v] > logits[FAKE_STAGE_VOCAB + best]) best = v;
    assert_int_equal(best, FAKE_STAGE_ANSWER);
    assert_true(p->ops->ready(p)); /* a refused request does not take the fleet down */
    fake_stage_done(p, &fs);
}

static void test_without_entry_errors_the_step_fails(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = fleet_over(&fs);
    float logits[N_ENTRIES * FAKE_STAGE_VOCAB];
    begin_step(p, logits);
    csd_err err = {0};
    assert_int_equal(p->ops->step_end(p, NULL, &err), CSD_ERANGE);
    assert_non_null(strstr(err.msg, "request 11: position beyond")); /* the first refusal */
    fake_stage_done(p, &fs);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *refuse_open_12(uint32_t request_id, int *code) {
    *code = CSD_EFULL;
    return request_id == 12 ? "request needs 9.0 MiB of KV cache, more than the stage's cap" : NULL;
}

/* A stage that refused a request's OPEN (its KV cap cannot hold it) then finds it "not open" at
 * the step: the step's error names the first reason, which came when no step was waiting for it
 * (it was dropped, and clients read only "not open"). */
static void test_refused_open_names_its_reason(void **state) {
    (void)state;
    static fake_stage fs; /* static: a failed assert leaves its thread running */
    memset(&fs, 0, sizeof fs);
    fs.answer_pings = true;
    fs.open_refusal = refuse_open_12;
    csd_pipeline *p = fake_stage_fleet(&fs, 10000);
    csd_err err = {0};
    for (uint32_t req = FIRST_REQ; req < FIRST_REQ + N_ENTRIES; req++)
        if (p->ops->open(p, req, 64, &err)) fail_msg("open %u: %s", req, err.msg);
    uint64_t until = csd_now_ns() + 5000000000ull; /* the refusal reaches the coordinator first */
    while (atomic_load(&fs.opens_refused) == 0 && csd_now_ns() < until) sleep_ms(5);
    sleep_ms(100);
    static int32_t ids[N_ENTRIES] = {1, 2, 3};
    csd_step_entry e[N_ENTRIES];
    for (int i = 0; i < N_ENTRIES; i++)
        e[i] = (csd_step_entry){.req = FIRST_REQ + (uint32_t)i, .ids = &ids[i], .n = 1,
                                .want_logits = true};
    float logits[N_ENTRIES * FAKE_STAGE_VOCAB] = {0};
    if (p->ops->step_begin(p, e, N_ENTRIES, logits, &err)) fail_msg("step_begin: %s", err.msg);
    csd_err entry_err[N_ENTRIES];
    assert_int_equal(p->ops->step_end(p, entry_err, &err), 0);
    assert_int_equal(entry_err[0].code, 0);
    assert_int_equal(entry_err[2].code, 0);
    assert_int_equal(entry_err[1].code, CSD_EFULL);
    assert_non_null(strstr(entry_err[1].msg, "KV cache, more than the stage's cap"));
    fake_stage_done(p, &fs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_refused_entry_has_its_reason),
        cmocka_unit_test(test_without_entry_errors_the_step_fails),
        cmocka_unit_test(test_refused_open_names_its_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
