/* tok_gate: how much text the server tokenizes at once. Tokenizing can take ~100 bytes of memory
 * per byte of text (a SentencePiece-style tokenizer merges a whole text as one word), and a body
 * may hold 4 MiB, so 256 connections tokenizing at once could take tens of GB. Large texts wait
 * until their bytes fit in a budget (a text larger than the budget waits until it is all free);
 * a text of fewer than CSD_TOK_GATE_MIN_BYTES passes at once, so short requests never queue
 * behind long ones. Tokenizing is CPU-bound: the wait costs little throughput. */
#ifndef CSD_HTTP_TOK_GATE_H
#define CSD_HTTP_TOK_GATE_H

#include <pthread.h>
#include <stddef.h>

#define CSD_TOK_GATE_MIN_BYTES ((size_t)64 << 10)
#define CSD_TOK_GATE_BUDGET ((size_t)8 << 20) /* the server's: about 1 GB of tokenizer memory */

typedef struct csd_tok_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t budget;
    size_t in_use;            /* bytes being tokenized */
    size_t peak;              /* the most in_use ever was (tests) */
} csd_tok_gate;

void csd_tok_gate_init(csd_tok_gate *g, size_t budget);
void csd_tok_gate_fini(csd_tok_gate *g);
/* Waits until bytes fit (nothing for a text under CSD_TOK_GATE_MIN_BYTES). Pair each enter with
 * a leave of the same bytes. */
void csd_tok_gate_enter(csd_tok_gate *g, size_t bytes);
void csd_tok_gate_leave(csd_tok_gate *g, size_t bytes);
size_t csd_tok_gate_peak(csd_tok_gate *g);

#endif
