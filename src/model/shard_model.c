/* shard_model: csd_weights <-> shard file. One table of "slots" (tensor name, expected shape and
 * dtype, where it lives in csd_weights) drives both the writer and the reader, so what one writes
 * the other expects. The reader refuses missing, extra, misshapen or wrongly sized tensors with the
 * file and tensor named. Binding copies no tensor data; csd_model_shard_open then copies the file
 * once into anonymous memory (huge pages for decode) and lets go of the mapped file's pages. */
#include "shard_model.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/file_map.h"
#include "kern/quant.h"

/* The quantized layout the shard format's CSD_SHARD_KERNEL_LAYOUT == 3 describes (16-row
 * interleaved blocks, each pair of groups after its 64-byte scale line). If one of these fails,
 * the byte layout of Q4/Q8 changed: bump CSD_SHARD_KERNEL_LAYOUT in format/shard.h (old shards are
 * then refused with "export it again") and update these to the new values. */
static_assert(CSD_SHARD_KERNEL_LAYOUT == 3, "update the layout pins below with the new layout");
static_assert(CSD_QUANT_GROUP == 128, "quant group changed: bump CSD_SHARD_KERNEL_LAYOUT");
static_assert(CSD_QUANT_BLOCK_ROWS == 16 && CSD_QUANT_VEC_BYTES == 64 &&
                  CSD_QUANT_BLOCK_ALIGN == 64,
              "quant block shape changed: bump CSD_SHARD_KERNEL_LAYOUT");
static_assert(CSD_Q4_BLOCK_GROUP_BYTES == 1024 && CSD_Q8_BLOCK_GROUP_BYTES == 2048,
              "quant group size changed: bump CSD_SHARD_KERNEL_LAYOUT");

typedef struct slot {
    char name[CSD_SHARD_NAME_BYTES];
    csd_qmat *mat;      /* matrix destination, or NULL */
    const float **vec;  /* f32 vector destination, or NULL */
    int64_t rows, cols; /* expected shape (vectors: 1 x n) */
    int dtype;          /* required dtype; -1: any (embeddings and head) */
} slot;

typedef struct slot_list {
    slot *s;
    int n, cap;
} slot_list;

static slot *add(slot_list *l, const char *pattern, int layer) {
    if (l->n == l->cap) return NULL; /* sized exactly by count_slots */
    slot *s = &l->s[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, pattern, layer);
    return s;
}

static void add_mat(slot_list *l, const char *pattern, int layer, csd_qmat *m, int64_t rows,
                    int64_t cols, int dtype) {
    slot *s = add(l, pattern, layer);
    if (!s) return;
    s->mat = m;
    s->rows = rows;
    s->cols = cols;
    s->dtype = dtype;
}

static void add_vec(slot_list *l, const char *pattern, int layer, const float **v, int64_t n) {
    slot *s = add(l, pattern, layer);
    if (!s) return;
    s->vec = v;
    s->rows = 1;
    s->cols = n;
    s->dtype = CSD_DTYPE_F32;
}

/* The head shares the embeddings' storage only in a single stage of a tied model. */
static bool head_shared(const csd_model_config *c, const csd_weights *w) {
    return c->tie_embeddings && w->has_embed && w->has_head;
}

/* Fills l (capacity computed here) with every tensor w needs, pointing into w and w->layers. */
static int build_slots(slot_list *l, const csd_model_config *c, csd_weights *w, int precision) {
    int64_t n_layers = w->layer_end - w->layer_begin;
    int per_layer = 9 + (c->qkv_bias ? 3 : 0) + (c->o_bias ? 1 : 0) + (c->qk_norm ? 2 : 0);
    l->cap = (int)n_layers * per_layer + 3;
    l->n = 0;
    l->s = csd_alloc_array((size_t)l->cap, sizeof(slot));
    if (!l->s) return CSD_ENOMEM;
    int64_t dim = c->dim, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    if (w->has_embed) add_mat(l, CSD_TN_EMBED, 0, &w->embed, c->vocab_size, dim, -1);
    for (int64_t i = 0; i < n_layers; i++) {
        csd_layer_weights *lw = &w->layers[i];
        int layer = (int)(w->layer_begin + i);
        add_vec(l, CSD_TN_ATTN_NORM, layer, &lw->attn_norm, dim);
        add_vec(l, CSD_TN_FFN_NORM, layer, &lw->ffn_norm, dim);
        add_mat(l, CSD_TN_WQ, layer, &lw->wq, q_dim, dim, precision);
        add_mat(l, CSD_TN_WK, layer, &lw->wk, kv_dim, dim, precision);
        add_mat(l, CSD_TN_WV, layer, &lw->wv, kv_dim, dim, precision);
        add_mat(l, CSD_TN_WO, layer, &lw->wo, dim, q_dim, precision);
        add_mat(l, CSD_TN_GATE, layer, &lw->gate, c->hidden_dim, dim, precision);
        add_mat(l, CSD_TN_UP, layer, &lw->up, c->hidden_dim, dim, precision);
        add_mat(l, CSD_TN_DOWN, layer, &lw->down, dim, c->hidden_dim, precision);
        if (c->qkv_bias) {
            add_vec(l, CSD_TN_BQ, layer, &lw->bq, q_dim);
            add_vec(l, CSD_TN_BK, layer, &lw->bk, kv_dim);
            add_vec(l, CSD_TN_BV, layer, &lw->bv, kv_dim);
        }
        if (c->o_bias) add_vec(l, CSD_TN_BO, layer, &lw->bo, dim);
        if (c->qk_norm) {
            add_vec(l, CSD_TN_Q_NORM, layer, &lw->q_norm, c->head_dim);
            add_vec(l, CSD_TN_K_NORM, layer, &lw->k_norm, c->head_dim);
        }
    }
    if (w->has_head) {
        add_vec(l, CSD_TN_FINAL_NORM, 0, &w->final_norm, dim);
        if (!head_shared(c, w)) add_mat(l, CSD_SHARD_TN_HEAD, 0, &w->head, c->vocab_size, dim, -1);
    }
    return 0;
}

/* ---- reading ---- */

static int bind_slot(const csd_shard *f, const slot *s, csd_err *err) {
    const char *L = csd_shard_label(f);
    const csd_shard_tensor *t = csd_shard_find(f, s->name);
    if (!t) return csd_err_set(err, CSD_EFORMAT, "%s: missing tensor '%s'", L, s->name);
    if (t->rows != s->rows || t->cols != s->cols)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%s' is [%lld, %lld], the config implies [%lld, %lld]", L,
                           s->name, (long long)t->rows, (long long)t->cols, (long long)s->rows,
                           (long long)s->cols);
    if (s->dtype >= 0 && t->dtype != s->dtype)
        return csd_err_set(err, CSD_EFORMAT, "%s: tensor '%s' is %s, expected %s", L, s->name,
                           csd_dtype_name(t->dtype), csd_dtype_name(s->dtype));
    size_t want = csd_qmat_bytes(t->dtype, t->rows, t->cols);
    if (t->nbytes != want)
        return csd_err_set(err, CSD_EFORMAT,
                           "%s: tensor '%s' has %zu bytes, %s [%lld, %lld] needs %zu", L, s->name,
                           t->nbytes, csd_dtype_name(t->dtype), (long long)t->rows,
                           (long long)t->cols, want);
    if (s->vec)
        *s->vec = t->data; /* 64-byte aligned in the mapping */
    else
        *s->mat = (csd_qmat){t->dtype, t->rows, t->cols, t->data, t->nbytes};
    return 0;
}

static int bind(csd_model_shard *ms, csd_err *err) {
    const csd_shard *f = ms->file;
    const csd_shard_header *h = csd_shard_hdr(f);
    const char *L = csd_shard_label(f);
    ms->cfg = *csd_shard_config(f);
    csd_weights *w = &ms->weights;
    w->layer_begin = h->layer_begin;
    w->layer_end = h->layer_end;
    w->has_embed = h->has_embed;
    w->has_head = h->has_head;
    w->layers = csd_alloc_array((size_t)(h->layer_end - h->layer_begin), sizeof *w->layers);
    if (!w->layers) return csd_err_set(err, CSD_ENOMEM, "%s: layer table", L);
    slot_list l;
    if (build_slots(&l, &ms->cfg, w, h->precision))
        return csd_err_set(err, CSD_ENOMEM, "%s: tensor list", L);
    int rc = 0;
    for (int i = 0; i < l.n && !rc; i++) rc = bind_slot(f, &l.s[i], err);
    if (!rc && l.n != csd_shard_count(f)) {
        /* Every slot was found, so some tensor of the file is not one of them: name it. */
        for (int i = 0; i < csd_shard_count(f) && !rc; i++) {
            const char *name = csd_shard_at(f, i)->name;
            bool known = false;
            for (int k = 0; k < l.n && !known; k++) known = !strcmp(l.s[k].name, name);
            if (!known)
                rc = csd_err_set(err, CSD_EFORMAT,
                                 "%s: unexpected tensor '%s' for layers [%lld, %lld)", L, name,
                                 (long long)h->layer_begin, (long long)h->layer_end);
        }
    }
    if (!rc && head_shared(&ms->cfg, w)) w->head = w->embed;
    csd_free(l.s);
    return rc;
}

int csd_model_shard_bind(csd_model_shard **out, csd_shard *file, csd_err *err) {
    *out = NULL;
    csd_model_shard *ms = csd_alloc(sizeof *ms);
    if (!ms) return csd_err_set(err, CSD_ENOMEM, "shard");
    ms->file = file;
    int rc = bind(ms, err);
    if (rc) {
        ms->file = NULL; /* the caller's */
        csd_model_shard_close(ms);
        return rc;
    }
    *out = ms;
    return 0;
}

/* Moves p from the mapping [base, base + n) to the same offset of mem. */
static void rebase(const void **p, const uint8_t *base, size_t n, uint8_t *mem) {
    const uint8_t *q = *p;
    if (q && q >= base && q < base + n) *p = mem + (q - base);
}

static void rebase_mat(csd_qmat *m, const uint8_t *base, size_t n, uint8_t *mem) {
    rebase(&m->data, base, n, mem);
}

static void rebase_vec(const float **v, const uint8_t *base, size_t n, uint8_t *mem) {
    const void *p = *v;
    rebase(&p, base, n, mem);
    *v = p;
}

/* Copies the whole file into anonymous memory and points the weights there. */
static int load_into_memory(csd_model_shard *ms, csd_err *err) {
    const csd_shard *f = ms->file;
    if (csd_shard_count(f) == 0) return 0;
    const csd_shard_tensor *t0 = csd_shard_at(f, 0);
    const uint8_t *base = (const uint8_t *)t0->data - t0->offset;
    size_t n = (size_t)csd_shard_hdr(f)->file_bytes;
    void *mem = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return csd_err_set(err, CSD_ENOMEM, "%s: cannot allocate %zu bytes for its weights",
                           csd_shard_label(f), n);
#ifdef MADV_HUGEPAGE
    (void)madvise(mem, n, MADV_HUGEPAGE); /* best effort */
#endif
    memcpy(mem, base, n);
    csd_file_map_drop_pages(base, n); /* else the file's pages stay resident: twice the memory */
    csd_weights *w = &ms->weights;
    rebase_mat(&w->embed, base, n, mem);
    rebase_mat(&w->head, base, n, mem);
    rebase_vec(&w->final_norm, base, n, mem);
    for (int64_t l = 0; l < w->layer_end - w->layer_begin; l++) {
        csd_layer_weights *lw = &w->layers[l];
        const float **vecs[] = {&lw->attn_norm, &lw->ffn_norm, &lw->q_norm, &lw->k_norm,
                                &lw->bq,        &lw->bk,       &lw->bv, &lw->bo};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) rebase_vec(vecs[i], base, n, mem);
        csd_qmat *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->gate, &lw->up, &lw->down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) rebase_mat(mats[i], base, n, mem);
    }
    ms->mem = mem;
    ms->mem_bytes = n;
    return 0;
}

int csd_model_shard_open(csd_model_shard **out, const char *path, csd_err *err) {
    *out = NULL;
    csd_shard *f = NULL;
    int rc = csd_shard_open(&f, path, err);
    if (rc) return rc;
    rc = csd_model_shard_bind(out, f, err);
    if (rc) {
        csd_shard_close(f);
        return rc;
    }
    rc = load_into_memory(*out, err);
    if (rc) {
        csd_model_shard_close(*out);
        *out = NULL;
    }
    return rc;
}

void csd_model_shard_close(csd_model_shard *s) {
    if (!s) return;
    if (s->mem) munmap(s->mem, s->mem_bytes);
    csd_free(s->weights.layers);
    csd_shard_close(s->file);
    csd_free(s);
}

/* ---- writing ---- */

void csd_model_shard_info_fini(csd_model_shard_info *info) {
    if (!info) return;
    csd_free(info->tensors);
    info->tensors = NULL;
    info->n_tensors = 0;
}

int csd_model_shard_write(const csd_model *model, const char *path, uint32_t stage_index,
                          uint32_t stage_count, csd_shard_progress_fn progress, void *progress_ctx,
                          csd_model_shard_info *info, csd_err *err) {
    if (info) memset(info, 0, sizeof *info);
    const csd_model_config *c = csd_model_cfg(model);
    const csd_weights *src = csd_model_weights(model);
    int64_t n_layers = src->layer_end - src->layer_begin;
    if (head_shared(c, src) && src->head.data != src->embed.data)
        return csd_err_set(err, CSD_EINVAL, "%s: tied model whose head is not its embeddings",
                           path);
    /* A private copy of the weight tables, so the slots can point into it (read only here). */
    csd_weights w = *src;
    w.layers = csd_alloc_array((size_t)n_layers, sizeof *w.layers);
    char *json = NULL;
    slot_list l = {0};
    csd_shard_tensor *tensors = NULL;
    int rc = 0;
    if (!w.layers) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: layer table", path);
        goto done;
    }
    memcpy(w.layers, src->layers, (size_t)n_layers * sizeof *w.layers);
    int precision = csd_model_precision(model);
    if (build_slots(&l, c, &w, precision)) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: tensor list", path);
        goto done;
    }
    tensors = csd_alloc_array((size_t)l.n, sizeof *tensors);
    if (!tensors) {
        rc = csd_err_set(err, CSD_ENOMEM, "%s: tensor list", path);
        goto done;
    }
    for (int i = 0; i < l.n; i++) {
        const slot *s = &l.s[i];
        csd_shard_tensor *t = &tensors[i];
        memcpy(t->name, s->name, sizeof t->name);
        if (s->vec) {
            t->dtype = CSD_DTYPE_F32;
            t->rows = 1;
            t->cols = s->cols;
            t->data = *s->vec;
            t->nbytes = (size_t)s->cols * sizeof(float);
        } else {
            t->dtype = s->mat->dtype;
            t->rows = s->mat->rows;
            t->cols = s->mat->cols;
            t->data = s->mat->data;
            t->nbytes = s->mat->nbytes;
        }
        if (!t->data || t->rows != s->rows || t->cols != s->cols ||
            (s->dtype >= 0 && t->dtype != s->dtype)) {
            rc = csd_err_set(err, CSD_EINVAL, "%s: the model's tensor '%s' is missing or misshapen",
                             path, s->name);
            goto done;
        }
    }
    rc = csd_model_config_to_json(c, &json, err);
    if (rc) goto done;
    csd_shard_header hdr;
    memset(&hdr, 0, sizeof hdr);
    hdr.stage_index = stage_index;
    hdr.stage_count = stage_count;
    hdr.layer_begin = src->layer_begin;
    hdr.layer_end = src->layer_end;
    hdr.n_layers = c->n_layers;
    hdr.has_embed = src->has_embed;
    hdr.has_head = src->has_head;
    hdr.precision = precision;
    rc = csd_shard_write(path, &hdr, json, strlen(json), tensors, l.n, progress, progress_ctx, err);
    if (rc) goto done;
    if (info) {
        for (int i = 0; i < l.n; i++)
            tensors[i].data = NULL; /* the model's memory: not for later */
        info->hdr = hdr;
        info->n_tensors = l.n;
        info->tensors = tensors;
        tensors = NULL;
    }
done:
    csd_free(tensors);
    csd_free(l.s);
    csd_free(json);
    csd_free(w.layers);
    return rc;
}
