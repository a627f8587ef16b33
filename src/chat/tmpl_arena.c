/* tmpl_arena: bump allocator, growable buffers and error unwinding for the chat-template engine.
 * A template's AST and a render's values all live in one arena freed at once; a byte limit bounds
 * what a hostile template can allocate. Errors longjmp to the public entry point
 * (chat_template.c). */
#include "chat/tmpl_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

/* Chunk payload: small while the arena is small (most renders need a few KB), then larger. */
#define ARENA_CHUNK_MIN (4 * 1024)
#define ARENA_CHUNK_MAX (64 * 1024)

struct csd_chat_chunk {
    csd_chat_chunk *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

_Noreturn void csd_chat_raise(csd_chat_fail *f, int code, uint32_t pos, const char *fmt, ...) {
    char msg[CSD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    f->code = code;
    if (pos != CSD_CHAT_NOPOS && f->src) {
        unsigned line = 1, col = 1;
        for (uint32_t i = 0; i < pos && f->src[i]; i++) {
            if (f->src[i] == '\n') {
                line++;
                col = 1;
            } else if (((unsigned char)f->src[i] & 0xC0) != 0x80) {
                col++;
            }
        }
        csd_err_set(f->err, code, "%s at line %u, column %u: %s", f->what, line, col, msg);
    } else {
        csd_err_set(f->err, code, "%s: %s", f->what, msg);
    }
    longjmp(f->jb, 1);
}

void csd_chat_arena_init(csd_chat_arena *a, size_t limit, csd_chat_fail *fail) {
    a->head = NULL;
    a->total = 0;
    a->limit = limit;
    a->fail = fail;
}

void csd_chat_arena_fini(csd_chat_arena *a) {
    csd_chat_chunk *c = a->head;
    while (c) {
        csd_chat_chunk *next = c->next;
        csd_free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

void *csd_chat_arena_alloc(csd_chat_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    csd_chat_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t chunk = a->total >= 16 * ARENA_CHUNK_MAX ? ARENA_CHUNK_MAX : ARENA_CHUNK_MIN;
        size_t cap = n > chunk ? n : chunk;
        if (cap > a->limit || a->total > a->limit - cap)
            csd_chat_raise(a->fail, CSD_EFULL, CSD_CHAT_NOPOS,
                           "memory limit of %zu bytes exceeded", a->limit);
        c = csd_alloc(sizeof *c + cap);
        if (!c) csd_chat_raise(a->fail, CSD_ENOMEM, CSD_CHAT_NOPOS, "out of memory");
        a->total += cap;
        c->cap = cap;
        c->used = 0;
        if (a->head && n > chunk) {
            /* keep filling the current chunk: put the big one behind it */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used; /* chunks come zeroed from csd_alloc and are never reused */
    c->used += n;
    return p;
}

char *csd_chat_arena_strndup(csd_chat_arena *a, const char *s, size_t n) {
    char *p = csd_chat_arena_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void csd_chat_buf_init(csd_chat_buf *b, csd_chat_arena *a, size_t limit) {
    b->arena = a;
    b->p = NULL;
    b->len = 0;
    b->cap = 0;
    b->limit = limit;
}

void csd_chat_buf_put(csd_chat_buf *b, const char *s, size_t n) {
    if (n == 0) return;
    if (n > b->limit || b->len > b->limit - n)
        csd_chat_raise(b->arena->fail, CSD_ERANGE, CSD_CHAT_NOPOS,
                       "output or string exceeds the size limit of %zu bytes", b->limit);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = csd_chat_arena_alloc(b->arena, cap);
        if (b->len) memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void csd_chat_buf_puts(csd_chat_buf *b, const char *s) { csd_chat_buf_put(b, s, strlen(s)); }

void csd_chat_buf_putc(csd_chat_buf *b, char c) { csd_chat_buf_put(b, &c, 1); }
