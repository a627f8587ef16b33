/* weight_stream: how fast this engine's matvec kernels stream a stage's weights when nothing else
 * runs: every matrix of the stage times one token, all the matrices of one input width and dtype
 * in one pool job (two jobs for a llama stack, the dim-wide inputs and the hidden-wide ones, and
 * a third for an output head stored in another dtype, as INT4 exports keep it at 8 bits), with no
 * attention, norms, residuals, quantization between layers or joins between matrices.
 *
 * It is not a forward pass: every matrix of a width multiplies the same fixed input. Its time is a
 * bound, the "stream ceiling" `cascadia bench` prints next to the memory roofline: the part of the
 * gap between decode and the roofline that no scheduling of the forward pass could close. */
#ifndef CSD_MODEL_WEIGHT_STREAM_H
#define CSD_MODEL_WEIGHT_STREAM_H

#include "model/model.h"

typedef struct csd_weight_stream csd_weight_stream;

/* Collects m's matrices (per layer q, k, v, o, gate, up, down; then the output head) and allocates
 * the inputs, outputs and scratch of a pass. m must outlive it. */
int csd_weight_stream_create(csd_weight_stream **out, csd_model *m, csd_err *err);
void csd_weight_stream_destroy(csd_weight_stream *s);

/* One pass on m's pool: every output = its matrix times the input of its width. Allocates
 * nothing. */
void csd_weight_stream_run(csd_weight_stream *s);

/* Pool jobs in a pass: one per (input width, dtype) of the stage's matrices. */
int csd_weight_stream_jobs(const csd_weight_stream *s);
/* Matrices in a pass, in the order above. */
int csd_weight_stream_count(const csd_weight_stream *s);
/* Matrix i of a pass, the input it multiplies (w->cols floats) and its output (w->rows floats,
 * as of the last pass). */
void csd_weight_stream_get(const csd_weight_stream *s, int i, const csd_qmat **w, const float **x,
                           const float **y);

#endif
