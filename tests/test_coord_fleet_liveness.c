/* A fleet step waits as long as its stages compute, but not for a stage that has gone quiet.
 * The stage is a fake one in this process: it speaks the wire protocol (insecure mode), answers
 * PINGs, and answers each FORWARD with logits after a delay. With a silence limit of 2 s, a step
 * whose stage computes for 5 s while answering PINGs succeeds (a fixed deadline, as the fleet
 * had before, failed every step slower than it: long prompt chunks of large models on slow
 * machines), and a stage that stops answering anything fails the step after about the limit,
 * with a message naming it. An idle fleet keeps PINGing: a stage that goes quiet then takes it
 * down too. (The fake stage: tests/fake_stage.h.) */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <time.h>

#include "fake_stage.h"

#define VOCAB FAKE_STAGE_VOCAB
#define ANSWER FAKE_STAGE_ANSWER
/* Limits with room for a loaded machine: a thread that is not scheduled for a second (sanitizers,
 * two cores shared with other tests) must not look like a silent stage. */
#define SILENCE_MS 2000
#define COMPUTE_MS 5000   /* the fake stage's time per FORWARD: two and a half silence limits */
#define NEVER_MS 60000    /* a FORWARD that is only ever answered by the silence check */

/* A fake stage and a fleet over it, connected. */
static csd_pipeline *fleet_over(fake_stage *fs, bool answer_pings, int compute_ms) {
    memset(fs, 0, sizeof *fs);
    fs->answer_pings = answer_pings;
    fs->compute_ms = compute_ms;
    return fake_stage_fleet(fs, SILENCE_MS);
}

/* One step of two tokens; returns its code (err says why) and the time it took. */
static int one_step(csd_pipeline *p, float *logits, double *seconds, csd_err *err) {
    if (p->ops->open(p, 1, 64, err)) fail_msg("open: %s", err->msg);
    int32_t ids[2] = {1, 2};
    csd_step_entry e = {.req = 1, .ids = ids, .n = 2, .want_logits = true};
    uint64_t t0 = csd_now_ns();
    int rc = p->ops->step_begin(p, &e, 1, logits, err);
    if (!rc) rc = p->ops->step_end(p, NULL, err);
    *seconds = (double)(csd_now_ns() - t0) * 1e-9;
    return rc;
}

static void test_slow_stage_that_answers_pings(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = fleet_over(&fs, true, COMPUTE_MS);
    float logits[VOCAB];
    double s = 0;
    csd_err err = {0};
    int rc = one_step(p, logits, &s, &err);
    if (rc) fail_msg("step: %s", err.msg);
    assert_true(s >= COMPUTE_MS * 1e-3 * 0.9);
    int best = 0;
    for (int v = 1; v < VOCAB; v++)
        if (logits[v] > logits[best]) best = v;
    assert_int_equal(best, ANSWER);
    assert_int_equal(atomic_load(&fs.forwards), 1);
    assert_true(atomic_load(&fs.pings) >= 1 + COMPUTE_MS / SILENCE_MS); /* pinged meanwhile */
    assert_true(p->ops->ready(p));
    fake_stage_done(p, &fs);
}

static void test_silent_stage_fails_the_step(void **state) {
    (void)state;
    fake_stage fs;
    csd_pipeline *p = fleet_over(&fs, false, NEVER_MS);
    float logits[VOCAB];
    double s = 0;
    csd_err err = {0};
    /* the fleet's keep-alive sees the silence and takes the chain down, failing the step */
    assert_int_equal(one_step(p, logits, &s, &err), CSD_ECLOSED);
    assert_non_null(strstr(err.msg, "answered nothing for 2 s"));
    assert_non_null(strstr(err.msg, "127.0.0.1:"));
    assert_true(s >= SILENCE_MS * 1e-3 * 0.5 && s < 30); /* ended by the silence, not an answer */
    assert_false(p->ops->ready(p)); /* the fleet reconnects after a silent stage */
    fake_stage_done(p, &fs);
}

/* With no step waiting, the fleet PINGs its stages: one that answers keeps it up, one that has gone
 * quiet takes it down (to reconnect) after about the silence limit. */
static void test_idle_fleet_watches_its_stages(void **state) {
    (void)state;
    fake_stage alive, quiet;
    csd_pipeline *up = fleet_over(&alive, true, COMPUTE_MS);
    csd_pipeline *down = fleet_over(&quiet, false, COMPUTE_MS);
    bool went_down = false;
    for (int waited = 0; waited < 10 * SILENCE_MS && !went_down; waited += 50) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        went_down = !down->ops->ready(down);
    }
    assert_true(went_down);
    assert_true(up->ops->ready(up));
    assert_true(atomic_load(&alive.pings) >= 3); /* PINGed while idle */
    fake_stage_done(down, &quiet);
    fake_stage_done(up, &alive);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_stage_that_answers_pings),
        cmocka_unit_test(test_silent_stage_fails_the_step),
        cmocka_unit_test(test_idle_fleet_watches_its_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
