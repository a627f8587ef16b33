/* local_pipeline: the pipeline interface over an in-process csd_model holding every layer.
 * Requests map to KV caches through a small fixed table (max_requests slots). */
#include <string.h>

#include "core/alloc.h"
#include "model/model.h"
#include "pipeline.h"

typedef struct local_slot {
    uint32_t req;
    csd_kv *kv; /* NULL: free slot */
} local_slot;

typedef struct local_pipeline {
    csd_pipeline base;
    csd_model *model; /* borrowed */
    int n_slots;
    local_slot *slots;
    int64_t max_batch;
    csd_kv **batch_kv;   /* (max_batch) scratch for building a batch */
    int32_t *batch_ids;  /* (max_batch) */
    bool *batch_want;    /* (max_batch) */
    int pending;         /* steps begun and not yet ended (computed eagerly at begin) */
    int pending_rc;
    int pending_n;       /* its entries */
    csd_err pending_err;
} local_pipeline;

static local_slot *find_slot(local_pipeline *lp, uint32_t req) {
    for (int i = 0; i < lp->n_slots; i++)
        if (lp->slots[i].kv && lp->slots[i].req == req) return &lp->slots[i];
    return NULL;
}

static int local_open(csd_pipeline *p, uint32_t req, int64_t max_ctx, csd_err *err) {
    local_pipeline *lp = (local_pipeline *)p;
    if (find_slot(lp, req)) return csd_err_set(err, CSD_EINVAL, "request %u already open", req);
    for (int i = 0; i < lp->n_slots; i++) {
        if (lp->slots[i].kv) continue;
        int rc = csd_kv_create(&lp->slots[i].kv, lp->model, max_ctx, err);
        if (rc) return rc;
        lp->slots[i].req = req;
        return 0;
    }
    return csd_err_set(err, CSD_EFULL, "all %d request slots are busy", lp->n_slots);
}

static int local_forward(csd_pipeline *p, uint32_t req, const int32_t *ids, int64_t n,
                         float *logits, csd_err *err) {
    local_pipeline *lp = (local_pipeline *)p;
    local_slot *s = find_slot(lp, req);
    if (!s) return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", req);
    return csd_model_forward_seq(lp->model, s->kv, ids, NULL, n, logits, err);
}

/* Runs entries as consecutive model batches of at most max_batch tokens (a request's tokens stay
 * in order; a request may straddle two batches). Logits go out packed in entry order. */
static int run_step(local_pipeline *lp, const csd_step_entry *entries, int n_entries, float *logits,
                    csd_err *err) {
    int64_t fill = 0, vocab = lp->base.cfg.vocab_size;
    float *out = logits;
    for (int e = 0; e < n_entries; e++) {
        local_slot *s = find_slot(lp, entries[e].req);
        if (!s) return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", entries[e].req);
        for (int64_t i = 0; i < entries[e].n; i++) {
            lp->batch_kv[fill] = s->kv;
            lp->batch_ids[fill] = entries[e].ids[i];
            lp->batch_want[fill] =
                entries[e].want_logits && (entries[e].all_logits || i == entries[e].n - 1);
            bool last_token = e == n_entries - 1 && i == entries[e].n - 1;
            if (++fill == lp->max_batch || last_token) {
                csd_batch b = {fill, lp->batch_ids, NULL, lp->batch_kv, lp->batch_want};
                int rc = csd_model_forward(lp->model, &b, out, err);
                if (rc) return rc;
                for (int64_t j = 0; j < fill; j++) out += lp->batch_want[j] ? vocab : 0;
                fill = 0;
            }
        }
    }
    return 0;
}

static int local_step_begin(csd_pipeline *p, const csd_step_entry *entries, int n_entries,
                            float *logits, csd_err *err) {
    local_pipeline *lp = (local_pipeline *)p;
    if (lp->pending) return csd_err_set(err, CSD_EINVAL, "a step is already in flight");
    lp->pending = 1;
    lp->pending_n = n_entries;
    csd_err_clear(&lp->pending_err);
    lp->pending_rc = run_step(lp, entries, n_entries, logits, &lp->pending_err);
    return 0;
}

static int local_step_end(csd_pipeline *p, csd_err *entry_err, csd_err *err) {
    local_pipeline *lp = (local_pipeline *)p;
    if (!lp->pending) return csd_err_set(err, CSD_EINVAL, "no step in flight");
    for (int i = 0; entry_err && i < lp->pending_n; i++) csd_err_clear(&entry_err[i]);
    lp->pending = 0;
    if (lp->pending_rc && err) *err = lp->pending_err;
    return lp->pending_rc;
}

static int local_truncate(csd_pipeline *p, uint32_t req, int64_t pos, csd_err *err) {
    local_slot *s = find_slot((local_pipeline *)p, req);
    if (!s) return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", req);
    if (csd_kv_truncate(s->kv, pos))
        return csd_err_set(err, CSD_ERANGE, "truncate to %lld", (long long)pos);
    return 0;
}

static int local_copy_prefix(csd_pipeline *p, uint32_t src, uint32_t dst, int64_t n, csd_err *err) {
    local_pipeline *lp = (local_pipeline *)p;
    local_slot *s = find_slot(lp, src), *d = find_slot(lp, dst);
    if (!s || !d) return csd_err_set(err, CSD_ENOTFOUND, "request %u is not open", s ? dst : src);
    return csd_kv_copy_prefix(d->kv, s->kv, n, err);
}

static void local_close(csd_pipeline *p, uint32_t req) {
    local_slot *s = find_slot((local_pipeline *)p, req);
    if (!s) return;
    csd_kv_destroy(s->kv);
    s->kv = NULL;
}

static void local_destroy(csd_pipeline *p) {
    local_pipeline *lp = (local_pipeline *)p;
    if (!lp) return;
    for (int i = 0; i < lp->n_slots; i++) csd_kv_destroy(lp->slots[i].kv);
    csd_free(lp->slots);
    csd_free(lp->batch_kv);
    csd_free(lp->batch_ids);
    csd_free(lp->batch_want);
    csd_free(lp);
}

static const csd_pipeline_ops local_ops = {
    .open = local_open,         .forward = local_forward,         .step_begin = local_step_begin,
    .step_end = local_step_end, .truncate = local_truncate,       .copy_prefix = local_copy_prefix,
    .close = local_close,       .destroy = local_destroy,         .ready = NULL};

int csd_local_pipeline_create(csd_pipeline **out, csd_model *model, int max_requests,
                              csd_err *err) {
    *out = NULL;
    local_pipeline *lp = csd_alloc(sizeof *lp);
    if (!lp) return csd_err_set(err, CSD_ENOMEM, "pipeline");
    lp->max_batch = csd_model_max_batch(model);
    lp->slots = csd_alloc_array((size_t)(max_requests > 0 ? max_requests : 1), sizeof *lp->slots);
    lp->batch_kv = csd_alloc_array((size_t)lp->max_batch, sizeof(csd_kv *));
    lp->batch_ids = csd_alloc_array((size_t)lp->max_batch, sizeof(int32_t));
    lp->batch_want = csd_alloc_array((size_t)lp->max_batch, sizeof(bool));
    if (!lp->slots || !lp->batch_kv || !lp->batch_ids || !lp->batch_want) {
        local_destroy(&lp->base);
        return csd_err_set(err, CSD_ENOMEM, "pipeline slots");
    }
    lp->n_slots = max_requests > 0 ? max_requests : 1;
    lp->model = model;
    lp->base.ops = &local_ops;
    lp->base.cfg = *csd_model_cfg(model);
    lp->base.max_ctx = csd_model_max_ctx(model);
    lp->base.max_in_flight = 1;
    lp->base.max_step_tokens = 4 * lp->max_batch; /* run_step splits it into model batches */
    *out = &lp->base;
    return 0;
}
