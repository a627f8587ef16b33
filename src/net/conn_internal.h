/* conn_internal: what the link's framing (conn.c) and its handshake (conn_handshake.c) share and
 * nobody else needs: the connection's state, the AEAD sizes, and sending and receiving one frame
 * in a given mode. */
#ifndef CSD_CONN_INTERNAL_H
#define CSD_CONN_INTERNAL_H

#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "conn.h"

#define TAG_SIZE crypto_aead_xchacha20poly1305_ietf_ABYTES
#define KEY_SIZE crypto_aead_xchacha20poly1305_ietf_KEYBYTES
#define NONCE_SIZE crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define TRANSCRIPT_SIZE 32u

_Static_assert(TAG_SIZE == 16, "tag size is part of the wire format");
_Static_assert(KEY_SIZE == 32 && NONCE_SIZE == 24, "xchacha20poly1305 sizes");
_Static_assert(TRANSCRIPT_SIZE == CSD_WIRE_AUTH_SIZE, "AUTH carries the transcript hash");

enum link_mode { MODE_PLAIN = 0, MODE_SECURE = 1 };

/* One direction of a link: its key and the counter that forms the next nonce. */
typedef struct link_dir {
    uint8_t key[KEY_SIZE];
    uint64_t counter;
} link_dir;

struct csd_conn {
    int fd;
    int timeout_ms;       /* stall limit for a started frame, and for sends */
    atomic_int mode;      /* enum link_mode; switches once, during the handshake */
    atomic_bool closed;
    pthread_mutex_t send_lock; /* guards tx, sendbuf */
    pthread_mutex_t recv_lock; /* guards rx */
    link_dir tx, rx;
    uint8_t *sendbuf; /* ciphertext staging, grown once to the largest frame sent */
    size_t sendcap;
    atomic_uint_least64_t frames_in, frames_out, bytes_in, bytes_out;
    char peer[CSD_CONN_PEER_MAX];
};

/* Milliseconds left until deadline_ns (a csd_now_ns time): 0 once it has passed. */
int csd_conn_remaining_ms(uint64_t deadline_ns);
/* Sends one frame in mode (enum link_mode), taking send_lock. */
int csd_conn_send_frame(csd_conn *c, const csd_wire_hdr *h, const void *payload, size_t len,
                        int mode, csd_err *err);
/* Receives one frame. In secure mode with allow_plain_error, an ERROR frame is accepted in plain
 * framing (a peer that failed to authenticate us cannot encrypt to us). Caller holds recv_lock.
 * Does not close the link: the callers decide (and log). */
int csd_conn_recv_frame_locked(csd_conn *c, csd_wire_hdr *h, csd_netbuf *buf, int idle_timeout_ms,
                               bool allow_plain_error, csd_err *err);
/* Marks the link failed and wakes the peer (it sees EOF). */
void csd_conn_fail_link(csd_conn *c);

#endif
