/* weight_stream: every matrix of a stage times one token, one pool job per input width and dtype
 * (see the header). The matrices of a group go to csd_matmul_multi together, so for Q4/Q8 weights
 * one job streams all of them through the lanes of matvec_lanes.c; float weights fall back to one
 * csd_matmul each, as in csd_matmul_multi. Why the dtype too: in one job a thread lane that runs
 * from the Q4 matrices into a Q8 head walks each of its runs alone (matvec_lanes.c runs lanes of
 * different dtypes one by one), one stream instead of two, which decode never does (its head is a
 * job of its own): the pass measured a slower stream than the tokens get. */
#include "weight_stream.h"

#include "core/alloc.h"

/* Distinct (input width, dtype) pairs of a stage: dim, the attention width (q_dim: o_proj's
 * input) and hidden, each in the layers' dtype, and the head's. */
#define MAX_GROUPS 6
/* Matrices per layer: q, k, v, o, gate, up, down. */
#define LAYER_MATS 7

typedef struct width_group {
    int64_t cols;
    int dtype;          /* the matrices' dtype */
    int n;              /* matrices of this width and dtype */
    const csd_qmat **w; /* n entries */
    float **y;          /* n outputs */
    float *x;           /* the shared input */
} width_group;

struct csd_weight_stream {
    csd_pool *pool;
    int n_mats;
    const csd_qmat **mats; /* in pass order */
    float **out;           /* per matrix: its output */
    width_group groups[MAX_GROUPS];
    int n_groups;
    void *scratch;
};

/* The group of w's width and dtype; -1 when there is none. */
static int find_group(const csd_weight_stream *s, const csd_qmat *w) {
    for (int g = 0; g < s->n_groups; g++)
        if (s->groups[g].cols == w->cols && s->groups[g].dtype == w->dtype) return g;
    return -1;
}

/* A fixed input in [-1, 1): any values do, the kernels' speed does not depend on them. */
static void fill_input(float *x, int64_t n, int64_t salt) {
    uint32_t h = 2166136261u ^ (uint32_t)salt;
    for (int64_t i = 0; i < n; i++) {
        h = h * 1664525u + 1013904223u;
        x[i] = (float)(h >> 8) / (float)(1u << 23) - 1.0f;
    }
}

static int collect(csd_weight_stream *s, const csd_weights *w, csd_err *err) {
    int64_t layers = w->layer_end - w->layer_begin;
    s->mats = csd_alloc_array((size_t)(layers * LAYER_MATS + 1), sizeof *s->mats);
    if (!s->mats) return csd_err_set(err, CSD_ENOMEM, "weight stream matrix list");
    for (int64_t l = 0; l < layers; l++) {
        const csd_layer_weights *lw = &w->layers[l];
        const csd_qmat *m[LAYER_MATS] = {&lw->wq,   &lw->wk, &lw->wv,  &lw->wo,
                                         &lw->gate, &lw->up, &lw->down};
        for (int k = 0; k < LAYER_MATS; k++) s->mats[s->n_mats++] = m[k];
    }
    if (w->has_head) s->mats[s->n_mats++] = &w->head;
    return 0;
}

/* A new group of w's width and dtype: room for every matrix of the stage (a few pointers each),
 * and its input. */
static int add_group(csd_weight_stream *s, const csd_qmat *w, csd_err *err) {
    if (s->n_groups == MAX_GROUPS)
        return csd_err_set(err, CSD_EINVAL,
                           "weight stream: more than %d (input width, dtype) pairs", MAX_GROUPS);
    int64_t cols = w->cols;
    width_group *wg = &s->groups[s->n_groups++];
    wg->cols = cols;
    wg->dtype = w->dtype;
    wg->w = csd_alloc_array((size_t)s->n_mats, sizeof *wg->w);
    wg->y = csd_alloc_array((size_t)s->n_mats, sizeof *wg->y);
    wg->x = csd_alloc_array((size_t)cols, sizeof *wg->x);
    if (!wg->w || !wg->y || !wg->x) return csd_err_set(err, CSD_ENOMEM, "weight stream group");
    fill_input(wg->x, cols, cols);
    return 0;
}

/* Allocates every output and the scratch, and puts each matrix in the group of its width. */
static int allocate(csd_weight_stream *s, csd_err *err) {
    s->out = csd_alloc_array((size_t)s->n_mats, sizeof *s->out);
    if (!s->out) return csd_err_set(err, CSD_ENOMEM, "weight stream outputs");
    size_t scratch = 0;
    for (int i = 0; i < s->n_mats; i++) {
        const csd_qmat *w = s->mats[i];
        int g = find_group(s, w);
        if (g < 0) {
            int rc = add_group(s, w, err);
            if (rc) return rc;
            g = s->n_groups - 1;
        }
        s->out[i] = csd_alloc_array((size_t)w->rows, sizeof(float));
        if (!s->out[i]) return csd_err_set(err, CSD_ENOMEM, "weight stream output");
        width_group *wg = &s->groups[g];
        wg->w[wg->n] = w;
        wg->y[wg->n++] = s->out[i];
        size_t need = csd_matmul_scratch_bytes(w->cols, 1);
        scratch = need > scratch ? need : scratch;
    }
    s->scratch = csd_alloc(scratch);
    if (!s->scratch) return csd_err_set(err, CSD_ENOMEM, "weight stream scratch");
    return 0;
}

int csd_weight_stream_create(csd_weight_stream **out, csd_model *m, csd_err *err) {
    *out = NULL;
    csd_weight_stream *s = csd_alloc(sizeof *s); /* zeroed */
    if (!s) return csd_err_set(err, CSD_ENOMEM, "weight stream");
    s->pool = csd_model_pool(m);
    int rc = collect(s, csd_model_weights(m), err);
    if (!rc) rc = allocate(s, err);
    if (rc) {
        csd_weight_stream_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void csd_weight_stream_destroy(csd_weight_stream *s) {
    if (!s) return;
    for (int g = 0; g < s->n_groups; g++) {
        csd_free(s->groups[g].w);
        csd_free(s->groups[g].y);
        csd_free(s->groups[g].x);
    }
    for (int i = 0; s->out && i < s->n_mats; i++) csd_free(s->out[i]);
    csd_free(s->out);
    csd_free(s->mats);
    csd_free(s->scratch);
    csd_free(s);
}

void csd_weight_stream_run(csd_weight_stream *s) {
    for (int g = 0; g < s->n_groups; g++) {
        const width_group *wg = &s->groups[g];
        csd_matmul_multi(s->pool, wg->w, wg->n, wg->x, 1, wg->y, s->scratch);
    }
}

int csd_weight_stream_jobs(const csd_weight_stream *s) { return s->n_groups; }

int csd_weight_stream_count(const csd_weight_stream *s) { return s->n_mats; }

void csd_weight_stream_get(const csd_weight_stream *s, int i, const csd_qmat **w, const float **x,
                           const float **y) {
    *w = s->mats[i];
    *x = s->groups[find_group(s, s->mats[i])].x;
    *y = s->out[i];
}
