/* file_map: mmap and bounded whole-file reads (see file_map.h). */
#include "file_map.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"

int csd_file_map_open(csd_file_map *map, const char *path, csd_err *err) {
    map->data = NULL;
    map->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return csd_err_set(err, CSD_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return csd_err_set(err, CSD_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return csd_err_set(err, CSD_EIO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return csd_err_set(err, CSD_EIO, "%s: cannot map: %s", path, strerror(e));
        }
        map->data = p;
        map->size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void csd_file_map_close(csd_file_map *map) {
    if (map && map->data) munmap((void *)map->data, map->size);
    if (map) {
        map->data = NULL;
        map->size = 0;
    }
}

void csd_file_map_drop_pages(const void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || n == 0) return;
    uintptr_t b = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    /* best effort: only RSS is at stake */
    if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED);
}

int csd_file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len,
                      csd_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return csd_err_set(err, CSD_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) { /* a directory opens too */
        fclose(f);
        return csd_err_set(err, CSD_EIO, "%s: not a regular file", path);
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return csd_err_set(err, CSD_EIO, "%s: cannot seek", path);
    }
    long len = ftell(f);
    if (len < 0 || (unsigned long)len > max_bytes) {
        fclose(f);
        return csd_err_set(err, CSD_ERANGE, "%s: file is %ld bytes, limit is %zu", path, len,
                           max_bytes);
    }
    rewind(f);
    char *buf = csd_alloc((size_t)len + 1);
    if (!buf) {
        fclose(f);
        return csd_err_set(err, CSD_ENOMEM, "%s: cannot allocate %ld bytes", path, len);
    }
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    if (got != (size_t)len) {
        csd_free(buf);
        return csd_err_set(err, CSD_EIO, "%s: short read", path);
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = (size_t)len;
    return 0;
}

/* Writes data to path as it is (a device, a FIFO: no temporary beside it, no rename over it). */
static int write_in_place(const char *path, const void *data, size_t len, csd_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return csd_err_set(err, CSD_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t put = len ? fwrite(data, 1, len, f) : 0;
    int e = put == len ? 0 : errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (put != len || e)
        return csd_err_set(err, CSD_EIO, "%s: write failed: %s", path, strerror(e ? e : EIO));
    return 0;
}

int csd_file_write_all(const char *path, const void *data, size_t len, csd_err *err) {
    /* What is not a regular file (a device, a FIFO, or a link to one) is written as it is. A link
     * to a regular file is replaced, as the file would be, never written through: an export
     * whose output holds links into the model it reads (a Hugging Face cache's snapshot is made
     * of them) must not write into that model. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return write_in_place(path, data, len, err);
    char tmp[PATH_MAX + 8];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return csd_err_set(err, CSD_ERANGE, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return csd_err_set(err, CSD_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t put = len ? fwrite(data, 1, len, f) : 0;
    int close_rc = fclose(f);
    if (put != len || close_rc != 0) {
        unlink(tmp);
        return csd_err_set(err, CSD_EIO, "%s: write failed", path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return csd_err_set(err, CSD_EIO, "%s: cannot rename: %s", path, strerror(e));
    }
    return 0;
}

int csd_path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return (n < 0 || (size_t)n >= cap) ? CSD_ERANGE : 0;
}

int csd_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
