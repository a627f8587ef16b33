/* How many machines a fleet's addresses name (the default number of micro-batches in flight):
 * loopback spellings are this machine, ports do not matter, IPv6 brackets are handled, and a
 * stage the coordinator computes itself counts as this machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "coord/fleet_hosts.h"

static csd_fleet_opts fleet_of(const char *const *addrs, int n) {
    csd_fleet_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < n; i++) snprintf(o.addrs[i], sizeof o.addrs[i], "%s", addrs[i]);
    o.n_addrs = n;
    return o;
}

static void test_host_of(void **state) {
    (void)state;
    char h[64];
    assert_true(csd_fleet_host_of("10.0.0.7:9000", h, sizeof h));
    assert_string_equal(h, "10.0.0.7");
    assert_true(csd_fleet_host_of("Worker-A.lan:1", h, sizeof h));
    assert_string_equal(h, "worker-a.lan");
    assert_true(csd_fleet_host_of("[fe80::1]:9000", h, sizeof h));
    assert_string_equal(h, "fe80::1");
    assert_true(csd_fleet_host_of("127.0.0.1:9000", h, sizeof h));
    assert_string_equal(h, "localhost");
    assert_true(csd_fleet_host_of("[::1]:9000", h, sizeof h));
    assert_string_equal(h, "localhost");
    assert_false(csd_fleet_host_of("no-port", h, sizeof h));
    assert_false(csd_fleet_host_of(":9000", h, sizeof h));
    assert_false(csd_fleet_host_of("[::1]9000", h, sizeof h));
    assert_false(csd_fleet_host_of("a-rather-long-host-name:1", h, 8)); /* does not fit */
}

static void test_count_machines(void **state) {
    (void)state;
    const char *local2[] = {"127.0.0.1:9000", "localhost:9001"};
    csd_fleet_opts o = fleet_of(local2, 2);
    assert_int_equal(csd_fleet_count_machines(&o, false), 1);
    assert_int_equal(csd_fleet_count_machines(&o, true), 1); /* the coordinator is here too */

    const char *lan3[] = {"10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.1:9001"};
    o = fleet_of(lan3, 3);
    assert_int_equal(csd_fleet_count_machines(&o, false), 2);
    assert_int_equal(csd_fleet_count_machines(&o, true), 3);

    const char *mixed[] = {"[::1]:1", "box:2", "BOX:3", "127.1.2.3:4"};
    o = fleet_of(mixed, 4);
    assert_int_equal(csd_fleet_count_machines(&o, false), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_of),
        cmocka_unit_test(test_count_machines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
