/* test_net_key: fleet key files: generate/save/load round trip with mode 0600, no silent overwrite,
 * refusal of group/other-readable files, hex and base64 accepted, malformed content refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/fleet_key.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/csd_net_key_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text, mode_t mode) {
    unlink(path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_roundtrip_mode_0600(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/a.key", dir);
    csd_fleet_key k, l;
    csd_err err = {0};
    assert_int_equal(csd_fleet_key_generate(&k, &err), 0);
    assert_int_equal(csd_fleet_key_save(path, &k, false, &err), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 65); /* 64 hex digits + newline */
    assert_int_equal(csd_fleet_key_load(path, &l, &err), 0);
    assert_memory_equal(k.bytes, l.bytes, 32);
    /* no silent overwrite; --force replaces */
    csd_fleet_key k2;
    assert_int_equal(csd_fleet_key_generate(&k2, &err), 0);
    assert_memory_not_equal(k.bytes, k2.bytes, 32);
    assert_int_equal(csd_fleet_key_save(path, &k2, false, &err), CSD_EIO);
    assert_non_null(strstr(err.msg, "exists"));
    assert_int_equal(csd_fleet_key_save(path, &k2, true, &err), 0);
    assert_int_equal(csd_fleet_key_load(path, &l, &err), 0);
    assert_memory_equal(k2.bytes, l.bytes, 32);
    char fa[17], fb[17];
    csd_fleet_key_fingerprint(&k, fa);
    csd_fleet_key_fingerprint(&k2, fb);
    assert_int_equal(strlen(fa), 16);
    assert_string_not_equal(fa, fb);
    csd_fleet_key_wipe(&l);
    for (int i = 0; i < 32; i++) assert_int_equal(l.bytes[i], 0);
}

static void test_formats_and_refusals(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/b.key", dir);
    csd_fleet_key k;
    csd_err err = {0};
    const char *hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    write_file(path, hex, 0600);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), 0);
    for (int i = 0; i < 32; i++) assert_int_equal(k.bytes[i], i);
    /* base64 of the same bytes, with surrounding whitespace */
    write_file(path, "  AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n\n", 0600);
    memset(&k, 0, sizeof k);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), 0);
    for (int i = 0; i < 32; i++) assert_int_equal(k.bytes[i], i);
    /* readable by others */
    write_file(path, hex, 0644);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EAUTH);
    assert_non_null(strstr(err.msg, "chmod 600"));
    /* malformed */
    write_file(path, "00010203", 0600);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EFORMAT);
    write_file(path, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fff", 0600);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EFORMAT);
    write_file(path, "zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", 0600);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EFORMAT);
    write_file(path, "", 0600);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EFORMAT);
    char big[600];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    write_file(path, big, 0600);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EFORMAT);
    /* missing file, directory */
    snprintf(path, sizeof path, "%s/missing.key", dir);
    assert_int_equal(csd_fleet_key_load(path, &k, &err), CSD_EIO);
    assert_int_equal(csd_fleet_key_load(dir, &k, &err), CSD_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_mode_0600),
        cmocka_unit_test(test_formats_and_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
