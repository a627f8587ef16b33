/* fleet_key: generate, save and load the fleet key file (see fleet_key.h).
 * The file is created with O_EXCL and mode 0600 so no other user can ever read it, even briefly. */
#include "fleet_key.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int sodium_ready(csd_err *err) {
    if (sodium_init() < 0) return csd_err_set(err, CSD_EIO, "libsodium initialisation failed");
    return 0;
}

int csd_fleet_key_generate(csd_fleet_key *key, csd_err *err) {
    int rc = sodium_ready(err);
    if (rc) return rc;
    randombytes_buf(key->bytes, CSD_FLEET_KEY_SIZE);
    return 0;
}

int csd_fleet_key_save(const char *path, const csd_fleet_key *key, bool overwrite, csd_err *err) {
    int rc = sodium_ready(err);
    if (rc) return rc;
    char text[2 * CSD_FLEET_KEY_SIZE + 2];
    sodium_bin2hex(text, sizeof text, key->bytes, CSD_FLEET_KEY_SIZE);
    size_t n = strlen(text);
    text[n++] = '\n';
    if (overwrite && unlink(path) != 0 && errno != ENOENT) {
        rc = csd_err_set(err, CSD_EIO, "%s: cannot replace: %s", path, strerror(errno));
        goto done;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            rc = csd_err_set(err, CSD_EIO, "%s: already exists (refusing to overwrite a key)",
                             path);
        else
            rc = csd_err_set(err, CSD_EIO, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    /* The umask can only remove bits, but make the mode explicit anyway. */
    if (fchmod(fd, 0600) != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: chmod 0600: %s", path, strerror(errno));
        close(fd);
        goto done;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            rc = csd_err_set(err, CSD_EIO, "%s: write: %s", path, strerror(errno));
            close(fd);
            unlink(path);
            goto done;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        rc = csd_err_set(err, CSD_EIO, "%s: sync/close: %s", path, strerror(errno));
        unlink(path);
        goto done;
    }
    rc = 0;
done:
    sodium_memzero(text, sizeof text);
    return rc;
}

/* Checks fd is a regular file of at most CSD_FLEET_KEY_FILE_MAX bytes that only its owner can
 * read. */
static int check_key_file(int fd, const char *path, csd_err *err) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return csd_err_set(err, CSD_EIO, "%s: stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return csd_err_set(err, CSD_EINVAL, "%s: key file is not a regular file", path);
    if (st.st_mode & 077)
        return csd_err_set(err, CSD_EAUTH,
                           "%s: key file mode %03o is readable by others; chmod 600 it", path,
                           (unsigned)(st.st_mode & 0777));
    if (st.st_size > (off_t)CSD_FLEET_KEY_FILE_MAX)
        return csd_err_set(err, CSD_EFORMAT, "%s: key file is %lld bytes, limit %u", path,
                           (long long)st.st_size, CSD_FLEET_KEY_FILE_MAX);
    return 0;
}

/* Reads the key file into text (NUL-terminated, at most CSD_FLEET_KEY_FILE_MAX bytes) after
 * check_key_file; *n is its length. */
static int read_key_file(const char *path, char *text, size_t *n, csd_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return csd_err_set(err, CSD_EIO, "%s: cannot open key file: %s", path, strerror(errno));
    int rc = check_key_file(fd, path, err);
    *n = 0;
    while (!rc && *n < CSD_FLEET_KEY_FILE_MAX) {
        ssize_t r = read(fd, text + *n, CSD_FLEET_KEY_FILE_MAX - *n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = csd_err_set(err, CSD_EIO, "%s: read: %s", path, strerror(errno));
        if (r <= 0) break;
        *n += (size_t)r;
    }
    close(fd);
    text[*n] = '\0';
    return rc;
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The key in text[0..n) (blanks around it ignored): 64 hex digits or base64 of 32 bytes. */
static bool decode_key_text(const char *text, size_t n, csd_fleet_key *key) {
    size_t b = 0, e = n, got = 0;
    while (b < e && is_blank(text[b])) b++;
    while (e > b && is_blank(text[e - 1])) e--;
    const char *end = NULL;
    uint8_t bin[CSD_FLEET_KEY_SIZE + 1];
    bool ok = e - b == 2 * CSD_FLEET_KEY_SIZE &&
              sodium_hex2bin(bin, sizeof bin, text + b, e - b, NULL, &got, &end) == 0 &&
              end == text + e && got == CSD_FLEET_KEY_SIZE;
    if (!ok)
        ok = sodium_base642bin(bin, sizeof bin, text + b, e - b, NULL, &got, &end,
                               sodium_base64_VARIANT_ORIGINAL) == 0 &&
             end == text + e && got == CSD_FLEET_KEY_SIZE;
    if (ok) memcpy(key->bytes, bin, CSD_FLEET_KEY_SIZE);
    sodium_memzero(bin, sizeof bin);
    return ok;
}

int csd_fleet_key_load(const char *path, csd_fleet_key *key, csd_err *err) {
    int rc = sodium_ready(err);
    if (rc) return rc;
    char text[CSD_FLEET_KEY_FILE_MAX + 1];
    size_t n = 0;
    rc = read_key_file(path, text, &n, err);
    if (!rc && !decode_key_text(text, n, key))
        rc =
            csd_err_set(err, CSD_EFORMAT,
                        "%s: not a fleet key (expected 64 hex digits or base64 of 32 bytes)", path);
    sodium_memzero(text, sizeof text);
    return rc;
}

void csd_fleet_key_fingerprint(const csd_fleet_key *key, char out[17]) {
    static const uint8_t label[] = "csd fingerprint";
    uint8_t h[8];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, label, sizeof label - 1);
    crypto_generichash_update(&st, key->bytes, CSD_FLEET_KEY_SIZE);
    crypto_generichash_final(&st, h, sizeof h);
    sodium_bin2hex(out, 17, h, sizeof h);
}

void csd_fleet_key_wipe(csd_fleet_key *key) { sodium_memzero(key->bytes, sizeof key->bytes); }
