/* stage_plan: stage planning (see stage_plan.h). Both planners give every stage one layer first,
 * then hand out the rest one layer at a time: --stages N to the stage whose total would stay
 * smallest (optimal for the largest stage, since all layers cost the same), --memory to the
 * machine with the largest memory left per layer it already has (D'Hondt: shares proportional to
 * memory). */
#include "stage_plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "kern/kern.h"
#include "kern/quant.h"
#include "model.h"
#include "model_internal.h"

void csd_plan_opts_default(csd_plan_opts *o) {
    memset(o, 0, sizeof *o);
    o->precision = CSD_DTYPE_F32;
    o->kv_dtype = -1;
    o->ctx = 4096;
    o->slots = 1;
    o->runtime_bytes = CSD_PLAN_DEFAULT_RUNTIME_BYTES;
}

const char *csd_plan_fmt_bytes(uint64_t b, char *buf, int cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, (size_t)cap, "%llu B", (unsigned long long)b);
    else
        snprintf(buf, (size_t)cap, "%.2f %s", v, units[u]);
    return buf;
}

int csd_plan_costs_get(csd_plan_costs *out, const csd_model_config *c, const csd_plan_opts *o,
                       csd_err *err) {
    memset(out, 0, sizeof *out);
    if (o->precision < 0 || o->precision >= CSD_DTYPE_COUNT)
        return csd_err_set(err, CSD_EINVAL, "unknown precision %d", o->precision);
    int kv = o->kv_dtype >= 0                ? o->kv_dtype
             : o->precision == CSD_DTYPE_F32 ? CSD_DTYPE_F32
                                             : CSD_DTYPE_F16;
    if (kv != CSD_DTYPE_F32 && kv != CSD_DTYPE_F16 && kv != CSD_DTYPE_Q8)
        return csd_err_set(err, CSD_EINVAL, "KV cache type must be f32, f16 or q8");
    if (o->ctx < 1 || o->ctx > CSD_MAX_CONTEXT || o->slots < 1 || o->slots > 4096)
        return csd_err_set(err, CSD_ERANGE, "context %lld x %lld slots out of range",
                           (long long)o->ctx, (long long)o->slots);
    int p = o->precision;
    int outer = p == CSD_DTYPE_Q4 ? CSD_DTYPE_Q8 : p; /* as csd_model_load_hf */
    uint64_t dim = (uint64_t)c->dim, q_dim = (uint64_t)(c->n_heads * c->head_dim);
    uint64_t kv_dim = (uint64_t)(c->n_kv_heads * c->head_dim), hid = (uint64_t)c->hidden_dim;
    uint64_t lw = csd_qmat_bytes(p, (int64_t)q_dim, (int64_t)dim) +
                  2 * csd_qmat_bytes(p, (int64_t)kv_dim, (int64_t)dim) +
                  csd_qmat_bytes(p, (int64_t)dim, (int64_t)q_dim) +
                  2 * csd_qmat_bytes(p, (int64_t)hid, (int64_t)dim) +
                  csd_qmat_bytes(p, (int64_t)dim, (int64_t)hid) + 2 * dim * 4;
    if (c->qkv_bias) lw += (q_dim + 2 * kv_dim) * 4;
    if (c->o_bias) lw += dim * 4;
    if (c->qk_norm) lw += 2 * (uint64_t)c->head_dim * 4;
    out->layer_weight_bytes = lw;
    out->kv_bytes_per_token_layer = 2 * csd_kv_row_bytes(kv, c->n_kv_heads, c->head_dim);
    out->layer_bytes = lw + out->kv_bytes_per_token_layer * (uint64_t)o->ctx * (uint64_t)o->slots;
    out->embed_bytes = csd_qmat_bytes(outer, c->vocab_size, c->dim);
    out->head_shared_bytes =
        dim * 4 + (c->tie_embeddings ? 0 : csd_qmat_bytes(outer, c->vocab_size, c->dim));
    out->head_bytes = dim * 4 + csd_qmat_bytes(outer, c->vocab_size, c->dim);
    /* Forward scratch as csd_model_init_runtime sizes it, and the one-token step's (decode_step.c:
     * a residual copy, a normed input and two quantized inputs per thread, the down input; its
     * matrix views, ~400 bytes a layer and thread, fall in runtime_bytes). What is per thread is
     * counted once: threads are not known here. */
    uint64_t b = (uint64_t)(o->max_batch > 0 ? o->max_batch : CSD_MODEL_DEFAULT_MAX_BATCH);
    uint64_t wide = dim > q_dim ? dim : q_dim, widest = hid > wide ? hid : wide;
    uint64_t floats =
        b * (dim + wide + dim + q_dim + 2 * kv_dim + 2 * hid + (uint64_t)c->head_dim) +
        (uint64_t)CSD_ATTN_TASK_HEADS * (uint64_t)o->ctx + (uint64_t)c->head_dim / 2 + dim +
        widest;
    uint64_t step_acts = 3 * (uint64_t)csd_quant_act_stride((int64_t)widest);
    out->overhead_bytes = floats * 4 + b * 8 + step_acts +
                          csd_matmul_scratch_bytes((int64_t)widest, (int64_t)b) + o->runtime_bytes;
    return 0;
}

/* Fixed bytes of stage i of n: overhead, embeddings on the first, head on the last. */
static uint64_t fixed_bytes(const csd_plan_costs *k, int i, int n) {
    uint64_t f = k->overhead_bytes;
    if (i == 0) f += k->embed_bytes;
    if (i == n - 1) f += n == 1 ? k->head_shared_bytes : k->head_bytes;
    return f;
}

/* Turns per-stage layer counts into the plan's stages. */
static void fill_plan(csd_plan *out, const csd_plan_costs *k, const int64_t *counts, int n,
                      const uint64_t *machines) {
    memset(out, 0, sizeof *out);
    out->n_stages = n;
    int64_t begin = 0;
    for (int i = 0; i < n; i++) {
        csd_plan_stage *s = &out->stages[i];
        s->layer_begin = begin;
        s->layer_end = begin + counts[i];
        begin = s->layer_end;
        s->has_embed = i == 0;
        s->has_head = i == n - 1;
        uint64_t layers = (uint64_t)counts[i];
        s->weight_bytes = layers * k->layer_weight_bytes + (i == 0 ? k->embed_bytes : 0) +
                          (i == n - 1 ? (n == 1 ? k->head_shared_bytes : k->head_bytes) : 0);
        s->kv_bytes = layers * (k->layer_bytes - k->layer_weight_bytes);
        s->overhead_bytes = k->overhead_bytes;
        s->total_bytes = s->weight_bytes + s->kv_bytes + s->overhead_bytes;
        s->machine_bytes = machines ? machines[i] : 0;
    }
}

int csd_plan_even(csd_plan *out, const csd_model_config *cfg, const csd_plan_opts *opts,
                  int n_stages, csd_err *err) {
    memset(out, 0, sizeof *out);
    if (n_stages < 1 || n_stages > CSD_PLAN_MAX_STAGES || n_stages > cfg->n_layers)
        return csd_err_set(
            err, CSD_ERANGE, "%d stages for a model of %lld layers: use 1 to %lld", n_stages,
            (long long)cfg->n_layers,
            (long long)(cfg->n_layers < CSD_PLAN_MAX_STAGES ? cfg->n_layers : CSD_PLAN_MAX_STAGES));
    csd_plan_costs k;
    int rc = csd_plan_costs_get(&k, cfg, opts, err);
    if (rc) return rc;
    int64_t counts[CSD_PLAN_MAX_STAGES];
    uint64_t total[CSD_PLAN_MAX_STAGES];
    for (int i = 0; i < n_stages; i++) {
        counts[i] = 1;
        total[i] = fixed_bytes(&k, i, n_stages) + k.layer_bytes;
    }
    for (int64_t left = cfg->n_layers - n_stages; left > 0; left--) {
        int best = 0;
        for (int i = 1; i < n_stages; i++)
            if (total[i] < total[best]) best = i;
        counts[best]++;
        total[best] += k.layer_bytes;
    }
    fill_plan(out, &k, counts, n_stages, NULL);
    return 0;
}

int csd_plan_auto(csd_plan *out, const csd_model_config *cfg, const csd_plan_opts *opts,
                  const uint64_t *machines, int n_machines, csd_err *err) {
    memset(out, 0, sizeof *out);
    if (n_machines < 1 || n_machines > CSD_PLAN_MAX_STAGES)
        return csd_err_set(err, CSD_ERANGE, "%d machines: give 1 to %d", n_machines,
                           CSD_PLAN_MAX_STAGES);
    for (int i = 0; i < n_machines; i++)
        if (machines[i] == 0 || machines[i] > CSD_PLAN_MAX_MACHINE_BYTES)
            return csd_err_set(err, CSD_ERANGE, "machine %d: memory %llu bytes out of range", i,
                               (unsigned long long)machines[i]);
    csd_plan_costs k;
    int rc = csd_plan_costs_get(&k, cfg, opts, err);
    if (rc) return rc;
    int64_t counts[CSD_PLAN_MAX_STAGES], cap[CSD_PLAN_MAX_STAGES];
    uint64_t left[CSD_PLAN_MAX_STAGES];
    int max_k = n_machines < cfg->n_layers ? n_machines : (int)cfg->n_layers;
    for (int n = 1; n <= max_k; n++) {
        int64_t cap_sum = 0;
        bool each_fits = true;
        for (int i = 0; i < n; i++) {
            uint64_t f = fixed_bytes(&k, i, n);
            left[i] = machines[i] > f ? machines[i] - f : 0;
            cap[i] = (int64_t)(left[i] / k.layer_bytes);
            if (cap[i] > cfg->n_layers) cap[i] = cfg->n_layers;
            each_fits = each_fits && cap[i] >= 1;
            cap_sum += cap[i];
        }
        if (!each_fits || cap_sum < cfg->n_layers) continue;
        for (int i = 0; i < n; i++) counts[i] = 1;
        for (int64_t r = cfg->n_layers - n; r > 0; r--) {
            int best = -1;
            for (int i = 0; i < n; i++) {
                if (counts[i] >= cap[i]) continue;
                /* left[i] / (counts[i] + 1) > left[best] / (counts[best] + 1), exactly in integers
                 * (left < 2^50, counts <= 1024: no overflow). */
                if (best < 0 ||
                    left[i] * (uint64_t)(counts[best] + 1) > left[best] * (uint64_t)(counts[i] + 1))
                    best = i;
            }
            counts[best]++; /* cap_sum >= n_layers guarantees a machine with room */
        }
        fill_plan(out, &k, counts, n, machines);
        return 0;
    }
    /* Nothing fits: say what is missing with every machine in use. */
    int n = max_k;
    char a[32], b[32], c[32], d[32];
    uint64_t need = (uint64_t)cfg->n_layers * k.layer_bytes, have = 0;
    for (int i = 0; i < n; i++) {
        need += fixed_bytes(&k, i, n);
        have += machines[i];
    }
    for (int i = n; i < n_machines; i++) have += machines[i]; /* unusable beyond one per layer */
    if (need > have)
        return csd_err_set(
            err, CSD_EFULL,
            "the model needs %s over %d stage(s) (%lld layers at %s each, with KV cache for "
            "%lld x %lld tokens) but the %d machine(s) offer %s: %s missing",
            csd_plan_fmt_bytes(need, a, sizeof a), n, (long long)cfg->n_layers,
            csd_plan_fmt_bytes(k.layer_bytes, b, sizeof b), (long long)opts->ctx,
            (long long)opts->slots, n_machines, csd_plan_fmt_bytes(have, c, sizeof c),
            csd_plan_fmt_bytes(need - have, d, sizeof d));
    for (int i = 0; i < n; i++) {
        uint64_t f = fixed_bytes(&k, i, n);
        if (machines[i] < f + k.layer_bytes)
            return csd_err_set(
                err, CSD_EFULL,
                "machine %d (%s) cannot hold even one layer (%s) after its fixed costs (%s): "
                "%s missing on it",
                i + 1, csd_plan_fmt_bytes(machines[i], a, sizeof a),
                csd_plan_fmt_bytes(k.layer_bytes, b, sizeof b), csd_plan_fmt_bytes(f, c, sizeof c),
                csd_plan_fmt_bytes(f + k.layer_bytes - machines[i], d, sizeof d));
    }
    return csd_err_set(
        err, CSD_EFULL,
        "the %d machine(s) offer %s, enough in total for %s, but whole layers (%s each) do "
        "not fit into what each has left: up to %s per machine missing",
        n_machines, csd_plan_fmt_bytes(have, a, sizeof a), csd_plan_fmt_bytes(need, b, sizeof b),
        csd_plan_fmt_bytes(k.layer_bytes, c, sizeof c),
        csd_plan_fmt_bytes(k.layer_bytes, d, sizeof d));
}

int csd_plan_parse_bytes(const char *text, uint64_t *out, csd_err *err) {
    *out = 0;
    if (!text || !*text) return csd_err_set(err, CSD_EINVAL, "empty memory size");
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !(v > 0) || !isfinite(v))
        return csd_err_set(err, CSD_EINVAL,
                           "memory size '%s' is not a positive number with a unit (8G, 512M)",
                           text);
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0')
        return csd_err_set(err, CSD_EINVAL, "memory size '%s': unknown unit (use K, M, G or T)",
                           text);
    double bytes = v * mult;
    if (bytes < 1 || bytes > (double)CSD_PLAN_MAX_MACHINE_BYTES)
        return csd_err_set(err, CSD_ERANGE, "memory size '%s' out of range (1 B to 1 PiB)", text);
    *out = (uint64_t)bytes;
    return 0;
}

int csd_plan_parse_memory_list(const char *text, uint64_t *out, int cap, int *n, csd_err *err) {
    *n = 0;
    if (!text || !*text) return csd_err_set(err, CSD_EINVAL, "empty --memory list");
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item)
            return csd_err_set(err, CSD_EINVAL, "--memory '%s': empty or overlong item", text);
        if (*n == cap)
            return csd_err_set(err, CSD_ERANGE, "--memory lists more than %d machines", cap);
        memcpy(item, p, len);
        item[len] = '\0';
        int rc = csd_plan_parse_bytes(item, &out[*n], err);
        if (rc) return rc;
        (*n)++;
        if (!comma) return 0;
        p = comma + 1;
    }
}
