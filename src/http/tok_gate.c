/* tok_gate: see tok_gate.h. */
#include "tok_gate.h"

void csd_tok_gate_init(csd_tok_gate *g, size_t budget) {
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->budget = budget > 0 ? budget : 1;
    g->in_use = g->peak = 0;
}

void csd_tok_gate_fini(csd_tok_gate *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

void csd_tok_gate_enter(csd_tok_gate *g, size_t bytes) {
    if (bytes < CSD_TOK_GATE_MIN_BYTES) return;
    pthread_mutex_lock(&g->mu);
    /* one text larger than the budget goes alone */
    while (g->in_use > 0 && g->in_use + bytes > g->budget) pthread_cond_wait(&g->cv, &g->mu);
    g->in_use += bytes;
    if (g->in_use > g->peak) g->peak = g->in_use;
    pthread_mutex_unlock(&g->mu);
}

void csd_tok_gate_leave(csd_tok_gate *g, size_t bytes) {
    if (bytes < CSD_TOK_GATE_MIN_BYTES) return;
    pthread_mutex_lock(&g->mu);
    g->in_use -= bytes;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

size_t csd_tok_gate_peak(csd_tok_gate *g) {
    pthread_mutex_lock(&g->mu);
    size_t p = g->peak;
    pthread_mutex_unlock(&g->mu);
    return p;
}
