/* decode_step: a one-token forward's layers as one pool job (decode_step.c). */
#ifndef CSD_DECODE_STEP_H
#define CSD_DECODE_STEP_H

#include "model_internal.h"

/* Sets m->decode when the model can take this path (2 or more threads, no more than the cores;
 * Q4/Q8 layers without q/k/v biases; head sizes a multiple of 16); leaves it NULL otherwise.
 * always: every one-token step takes it (else the choice is measured). Allocates every buffer the
 * path uses, so a step allocates nothing. Non-zero (ENOMEM) only when an allocation fails. */
int csd_decode_step_create(csd_model *m, bool always, csd_err *err);
void csd_decode_step_destroy(csd_decode_step *d);
/* The path of batch b (positions planned, input loaded): -1 when it is not a one-token step of a
 * model with the one-job path (the general path, untimed); else 1 for csd_decode_step_layers, 0
 * for the general path, to be reported with csd_decode_step_timed (the choice is measured:
 * decode_step.c). */
int csd_decode_step_choose(csd_model *m, const csd_batch *b);
/* The chosen path's layers took ns (the trial's input). */
void csd_decode_step_timed(csd_model *m, int path, uint64_t ns);
/* Steps the one-job path has run (tests: that it was taken). */
int64_t csd_decode_step_taken(const csd_model *m);
/* The stage's layers for that token: m->x in, m->x out, the token's K/V rows written. */
void csd_decode_step_layers(csd_model *m, const csd_batch *b);

#endif
