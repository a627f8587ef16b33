/* conn: one framed, authenticated link over a connected TCP socket, and a listener that makes them.
 * Blocking calls with poll()-based timeouts; one thread may send while another receives (separate
 * locks and separate crypto state per direction). After the handshake every frame is encrypted and
 * authenticated (XChaCha20-Poly1305, per-direction key and counter nonce) or, in insecure mode,
 * carries an xxhash64 checksum. Any protocol or authentication error is logged with the peer and
 * closes the link: later calls return CSD_ECLOSED. Spec: docs/protocol.md "Link". */
#ifndef CSD_NET_CONN_H
#define CSD_NET_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "net/fleet_key.h"
#include "net/wire.h"

#define CSD_CONN_DEFAULT_TIMEOUT_MS 10000 /* handshake and "frame started but stalled" limit */
#define CSD_CONN_PEER_MAX 64              /* "host:port" text of the peer, for logs */

typedef struct csd_conn csd_conn;         /* opaque: socket + per-direction link state */
typedef struct csd_listener csd_listener; /* opaque: a listening socket */

/* A caller-owned receive buffer. csd_conn_recv grows it (never beyond CSD_WIRE_MAX_PAYLOAD) and
 * then reuses it: no allocation per frame once it is big enough. data may change on a recv that
 * grows it; it is valid until the next recv into the same buffer or csd_netbuf_fini. */
typedef struct csd_netbuf {
    uint8_t *data;
    size_t cap;
} csd_netbuf;

/* How a link authenticates. */
typedef struct csd_link_cfg {
    /* borrowed for the duration of the handshake; required unless insecure */
    const csd_fleet_key *key;
    bool insecure;            /* no encryption: xxhash64 per frame (both sides must agree) */
    int timeout_ms;           /* handshake and per-frame stall limit; <= 0 means the default */
} csd_link_cfg;

/* Per-connection counters (frames and bytes on the wire, including headers and trailers). */
typedef struct csd_conn_counters {
    uint64_t frames_in, frames_out;
    uint64_t bytes_in, bytes_out;
} csd_conn_counters;

/* ---- buffers ---- */

void csd_netbuf_fini(csd_netbuf *b);

/* ---- making connections ---- */

/* Connects to "host:port" ("[v6]:port" too) within timeout_ms (<= 0: default). Sets socket
 * options. */
int csd_conn_connect(csd_conn **out, const char *host_port, int timeout_ms, csd_err *err);
/* Wraps an already connected stream socket; takes ownership of fd (closed by destroy, also on
 * failure). */
int csd_conn_from_fd(csd_conn **out, int fd, csd_err *err);
/* Closes the socket and frees everything. NULL is a no-op. No other thread may be inside a call on
 * c (use csd_conn_shutdown first and join it). */
void csd_conn_destroy(csd_conn *c);
/* Wakes any thread blocked in send/recv on c (they return CSD_ECLOSED); thread-safe. */
void csd_conn_shutdown(csd_conn *c);
/* "host:port" of the peer; lives as long as c. */
const char *csd_conn_peer(const csd_conn *c);
/* True once the link has failed or was shut down. */
bool csd_conn_is_closed(const csd_conn *c);
/* Closes after sending a refusal so the peer can still read it: half-close, then drain what the
 * peer had already sent (at most 200 ms, 1 MiB), because closing with unread input makes TCP send
 * a reset, which can destroy the ERROR in the peer's receive queue. Only the thread that receives
 * on c may call it. */
void csd_conn_linger_close(csd_conn *c);
/* True when the link is closed or the peer has hung up (its FIN or a reset has arrived), without
 * reading anything: safe while another thread receives on c. */
bool csd_conn_peer_gone(const csd_conn *c);
void csd_conn_get_counters(const csd_conn *c, csd_conn_counters *out);

/* Listens on "host:port" (port 0 picks an ephemeral port; read it back with csd_listener_port). */
int csd_listener_open(csd_listener **out, const char *host_port, csd_err *err);
uint16_t csd_listener_port(const csd_listener *l);
/* Waits up to timeout_ms (< 0: forever) for a connection. CSD_ETIMEOUT when none came. */
int csd_listener_accept(csd_listener *l, csd_conn **out, int timeout_ms, csd_err *err);
void csd_listener_destroy(csd_listener *l);

/* ---- handshake (first thing on every link, before any other frame) ---- */

/* Client side (the coordinator, or a stage connecting to the next one). expect holds our role, caps
 * and what we require of the server: model_hash, stage_index and layer range (CSD_WIRE_ANY to
 * accept any). The nonce and the INSECURE cap bit are filled in here. On success *peer (may be
 * NULL) holds the server's HELLO_OK. A refusal by the server returns its code (CSD_EMISMATCH,
 * CSD_EAUTH...) with its text, which names both sides' values. */
int csd_conn_handshake_client(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *expect,
                              csd_wire_hello *peer, csd_err *err);
/* Server side (a worker). self is what we serve. A client HELLO that does not match (version, link
 * mode, model hash, stage, layer range) gets ERROR naming both values and the link is closed. The
 * caller may check peer->role itself and refuse with csd_conn_send_error. */
int csd_conn_handshake_server(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *self,
                              csd_wire_hello *peer, csd_err *err);

/* ---- frames (after the handshake) ---- */

/* Sends one frame; h->payload_len must equal len. Thread-safe against other senders and against a
 * concurrent receiver. Blocks at most the link timeout when the peer stops reading. */
int csd_conn_send(csd_conn *c, const csd_wire_hdr *h, const void *payload, size_t len,
                  csd_err *err);
/* Receives one frame into buf (grown as needed); *h describes it and buf->data[0..payload_len)
 * holds the verified payload. idle_timeout_ms bounds the wait for the frame to start (< 0:
 * forever); once started it must complete within the link timeout. Returns CSD_ETIMEOUT when idle
 * (the link stays usable), CSD_ECLOSED when the peer closed between frames, CSD_EPROTO/CSD_EAUTH on
 * a bad frame (the link is then closed). Serialized against other receivers. */
int csd_conn_recv(csd_conn *c, csd_wire_hdr *h, csd_netbuf *buf, int idle_timeout_ms,
                  csd_err *err);
/* Convenience: encodes and sends ERROR {code, text} for request_id (0 = the link). */
int csd_conn_send_error(csd_conn *c, uint32_t request_id, int code, const char *text,
                        csd_err *err);

#endif
