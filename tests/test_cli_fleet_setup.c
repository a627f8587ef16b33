/* The fleet flags every fleet command shares (cli/fleet_setup.h): --wait-workers takes whole
 * seconds in [0, a day] and is left unset (-1, the command's default) until given; a refused value
 * leaves it untouched. Which connection failures a wait may mend: a worker not listening, timing
 * out, hanging up or still busy with another coordinator, and nothing that is wrong for good. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "cli/fleet_setup.h"

static void test_wait_workers_default_and_values(void **state) {
    (void)state;
    csd_cli_fleet f;
    csd_cli_fleet_init(&f);
    assert_int_equal(f.wait_workers_s, -1);
    bool takes = false;
    assert_int_equal(csd_cli_fleet_flag("t", "--wait-workers", "0", &f, &takes), 1);
    assert_true(takes);
    assert_int_equal(f.wait_workers_s, 0);
    assert_int_equal(csd_cli_fleet_flag("t", "--wait-workers", "75", &f, &takes), 1);
    assert_int_equal(f.wait_workers_s, 75);
    char day[16];
    snprintf(day, sizeof day, "%d", CSD_CLI_FLEET_MAX_WAIT_S);
    assert_int_equal(csd_cli_fleet_flag("t", "--wait-workers", day, &f, &takes), 1);
    assert_int_equal(f.wait_workers_s, CSD_CLI_FLEET_MAX_WAIT_S);
}

static void test_wait_workers_refused(void **state) {
    (void)state;
    const char *bad[] = {"", "-1", "1.5", "10s", "x", "86401", "99999999999999999999", NULL};
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        csd_cli_fleet f;
        csd_cli_fleet_init(&f);
        f.wait_workers_s = 7;
        bool takes = false;
        assert_int_equal(csd_cli_fleet_flag("t", "--wait-workers", bad[i], &f, &takes), -1);
        assert_int_equal(f.wait_workers_s, 7);
    }
    csd_cli_fleet f;
    csd_cli_fleet_init(&f);
    bool takes = false;
    assert_int_equal(csd_cli_fleet_flag("t", "--wait-workers", NULL, &f, &takes), -1);
}

static void test_retryable_codes(void **state) {
    (void)state;
    assert_true(csd_cli_fleet_retryable(CSD_EIO));      /* connection refused, no route */
    assert_true(csd_cli_fleet_retryable(CSD_ETIMEOUT)); /* a machine still booting */
    assert_true(csd_cli_fleet_retryable(CSD_ECLOSED));  /* a worker restarting mid-handshake */
    assert_true(csd_cli_fleet_retryable(CSD_EFULL));    /* busy with a coordinator that has gone */
    int final[] = {CSD_EMISMATCH, CSD_EAUTH, CSD_EPROTO, CSD_EINVAL, CSD_EFORMAT, CSD_ENOMEM, 0};
    for (int i = 0; i < (int)(sizeof final / sizeof *final); i++)
        assert_false(csd_cli_fleet_retryable(final[i]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_workers_default_and_values),
        cmocka_unit_test(test_wait_workers_refused),
        cmocka_unit_test(test_retryable_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
