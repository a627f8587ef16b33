/* conn_handshake: the start of a link (see conn.h, docs/protocol.md). The client sends HELLO (what
 * it expects: model hash, stage, layers, link mode, a fresh nonce), the server answers HELLO_OK
 * with what it serves, or an ERROR naming the mismatch; then, unless the fleet is insecure, both
 * derive per-direction session keys from the fleet key and the two HELLOs and prove it with AUTH
 * frames, the first encrypted ones. */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "conn_internal.h"
#include "core/clock.h"
#include "core/log.h"

/* Label of the session-key derivation; changing it is a protocol version bump. */
static const char kdf_label[] = "cascadia link v1 session keys";

/* Refuses the handshake: best-effort ERROR frame in plain framing, log, close. Returns code. */
static int refuse(csd_conn *c, int code, const char *text, const char *side) {
    uint8_t p[CSD_WIRE_ERROR_HDR_SIZE + CSD_WIRE_MAX_ERROR_TEXT];
    size_t len = 0;
    if (csd_wire_encode_error(p, sizeof p, code, text, &len, NULL) == 0) {
        csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_ERROR, 0, 0, 0, (uint32_t)len);
        (void)csd_conn_send_frame(c, &h, p, len, MODE_PLAIN, NULL);
    }
    CSD_LOGW("net: handshake refused side=%s peer=%s code=%s: %s", side, c->peer,
             csd_err_name(code), text);
    csd_conn_linger_close(c);
    return code;
}

/* The peer refused us: turn its ERROR payload into our error. */
static int peer_refused(csd_conn *c, const csd_netbuf *buf, const csd_wire_hdr *h, csd_err *err) {
    csd_wire_error e;
    int rc = csd_wire_decode_error(buf->data, h->payload_len, &e, err);
    csd_conn_fail_link(c);
    if (rc) return rc;
    int code = csd_err_from_peer(e.code);
    CSD_LOGW("net: handshake refused by peer=%s code=%s: %s", c->peer, csd_err_name(code), e.text);
    return csd_err_set(err, code, "peer %s refused the handshake: %s", c->peer, e.text);
}

static void hash_short(const uint8_t h[CSD_WIRE_HASH_SIZE], char out[17]) {
    sodium_bin2hex(out, 17, h, 8);
}

/* A HELLO number for messages: "*" for CSD_WIRE_ANY. */
static void num_text(uint32_t v, char *out, size_t cap) {
    if (v == CSD_WIRE_ANY)
        snprintf(out, cap, "*");
    else
        snprintf(out, cap, "%u", (unsigned)v);
}

static void range_text(const csd_wire_hello *h, char *out, size_t cap) {
    char b[12], e[12];
    num_text(h->layer_begin, b, sizeof b);
    num_text(h->layer_end, e, sizeof e);
    snprintf(out, cap, "[%s,%s)", b, e);
}

/* Compares a HELLO the client sent (want) with what the server serves (have). want may use
 * CSD_WIRE_ANY for stage and layers. Writes a message naming both sides on mismatch. */
static int compare_hello(const csd_wire_hello *want, const csd_wire_hello *have,
                         const char *want_name, const char *have_name, char *msg, size_t cap) {
    if (want->proto_version != have->proto_version) {
        snprintf(msg, cap, "protocol version mismatch: %s %u, %s %u", want_name,
                 (unsigned)want->proto_version, have_name, (unsigned)have->proto_version);
        return CSD_EMISMATCH;
    }
    bool wi = want->caps & CSD_WIRE_CAP_INSECURE, hi = have->caps & CSD_WIRE_CAP_INSECURE;
    if (wi != hi) {
        snprintf(msg, cap, "link mode mismatch: %s %s, %s %s", want_name,
                 wi ? "insecure" : "encrypted", have_name, hi ? "insecure" : "encrypted");
        return CSD_EMISMATCH;
    }
    if (memcmp(want->model_hash, have->model_hash, CSD_WIRE_HASH_SIZE) != 0) {
        char a[17], b[17];
        hash_short(want->model_hash, a);
        hash_short(have->model_hash, b);
        snprintf(msg, cap, "model hash mismatch: %s %s..., %s %s...", want_name, a, have_name, b);
        return CSD_EMISMATCH;
    }
    char wr[32], hr[32], ws[12], hs[12];
    range_text(want, wr, sizeof wr);
    range_text(have, hr, sizeof hr);
    num_text(want->stage_index, ws, sizeof ws);
    num_text(have->stage_index, hs, sizeof hs);
    if (want->stage_index != CSD_WIRE_ANY && want->stage_index != have->stage_index) {
        snprintf(msg, cap, "stage mismatch: %s stage %s layers %s, %s stage %s layers %s",
                 want_name, ws, wr, have_name, hs, hr);
        return CSD_EMISMATCH;
    }
    if ((want->layer_begin != CSD_WIRE_ANY && want->layer_begin != have->layer_begin) ||
        (want->layer_end != CSD_WIRE_ANY && want->layer_end != have->layer_end)) {
        snprintf(msg, cap, "layer range mismatch: %s %s, %s %s", want_name, wr, have_name, hr);
        return CSD_EMISMATCH;
    }
    return 0;
}

/* th = BLAKE2b-256(HELLO payload | HELLO_OK payload); (k_c2s | k_s2c) = BLAKE2b-512 keyed with the
 * fleet key over label | th. Both nonces are in the transcript, so every link gets fresh keys. */
static void derive_keys(const csd_fleet_key *key, const uint8_t *hello, const uint8_t *hello_ok,
                        uint8_t th[TRANSCRIPT_SIZE], uint8_t k_c2s[KEY_SIZE],
                        uint8_t k_s2c[KEY_SIZE]) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, TRANSCRIPT_SIZE);
    crypto_generichash_update(&st, hello, CSD_WIRE_HELLO_SIZE);
    crypto_generichash_update(&st, hello_ok, CSD_WIRE_HELLO_SIZE);
    crypto_generichash_final(&st, th, TRANSCRIPT_SIZE);
    uint8_t okm[2 * KEY_SIZE];
    crypto_generichash_init(&st, key->bytes, CSD_FLEET_KEY_SIZE, sizeof okm);
    crypto_generichash_update(&st, (const uint8_t *)kdf_label, sizeof kdf_label - 1);
    crypto_generichash_update(&st, th, TRANSCRIPT_SIZE);
    crypto_generichash_final(&st, okm, sizeof okm);
    memcpy(k_c2s, okm, KEY_SIZE);
    memcpy(k_s2c, okm + KEY_SIZE, KEY_SIZE);
    sodium_memzero(okm, sizeof okm);
    sodium_memzero(&st, sizeof st);
}

static int check_cfg(const csd_link_cfg *cfg, csd_err *err) {
    if (!cfg) return csd_err_set(err, CSD_EINVAL, "handshake: no link configuration");
    if (!cfg->insecure && !cfg->key)
        return csd_err_set(err, CSD_EINVAL, "handshake: a fleet key is required (or --insecure)");
    if (sodium_init() < 0) return csd_err_set(err, CSD_EIO, "libsodium initialisation failed");
    return 0;
}

/* What both sides do first: the configuration checked, the link still open, its timeout set, and
 * this side's HELLO made from tmpl: our protocol version, the insecure bit as configured, a fresh
 * nonce. */
static int handshake_begin(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *tmpl,
                           csd_wire_hello *mine, csd_err *err) {
    int rc = check_cfg(cfg, err);
    if (rc) return rc;
    if (atomic_load(&c->closed))
        return csd_err_set(err, CSD_ECLOSED, "peer %s: link closed", c->peer);
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : CSD_CONN_DEFAULT_TIMEOUT_MS;
    *mine = *tmpl;
    mine->proto_version = CSD_WIRE_VERSION;
    mine->caps = cfg->insecure ? (mine->caps | CSD_WIRE_CAP_INSECURE)
                               : (mine->caps & ~(uint32_t)CSD_WIRE_CAP_INSECURE);
    randombytes_buf(mine->nonce, sizeof mine->nonce);
    return 0;
}

/* Both directions' keys in place: every frame from here on is encrypted. */
static void start_secure(csd_conn *c, const uint8_t tx_key[KEY_SIZE],
                         const uint8_t rx_key[KEY_SIZE]) {
    pthread_mutex_lock(&c->send_lock);
    memcpy(c->tx.key, tx_key, KEY_SIZE);
    memcpy(c->rx.key, rx_key, KEY_SIZE);
    c->tx.counter = c->rx.counter = 0;
    atomic_store(&c->mode, MODE_SECURE);
    pthread_mutex_unlock(&c->send_lock);
}

static int send_auth(csd_conn *c, const uint8_t th[TRANSCRIPT_SIZE], csd_err *err) {
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_AUTH, 0, 0, 0, TRANSCRIPT_SIZE);
    return csd_conn_send_frame(c, &h, th, TRANSCRIPT_SIZE, MODE_SECURE, err);
}

/* How either side's handshake ends, holding recv_lock: a failure (failed) logged and the link
 * closed (a refusal has closed it already), recv_lock released, the session keys' copies wiped,
 * the frame buffer freed. Returns rc. */
static int handshake_end(csd_conn *c, const char *side, int rc, bool failed, uint8_t *k_c2s,
                         uint8_t *k_s2c, csd_netbuf *buf, const csd_err *err) {
    if (failed) {
        CSD_LOGW("net: handshake failed side=%s peer=%s code=%s: %s", side, c->peer,
                 csd_err_name(rc), err ? err->msg : "");
        csd_conn_fail_link(c);
    }
    pthread_mutex_unlock(&c->recv_lock);
    sodium_memzero(k_c2s, KEY_SIZE);
    sodium_memzero(k_s2c, KEY_SIZE);
    csd_netbuf_fini(buf);
    return rc;
}

int csd_conn_handshake_client(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *expect,
                              csd_wire_hello *peer, csd_err *err) {
    csd_wire_hello mine;
    int rc = handshake_begin(c, cfg, expect, &mine, err);
    if (rc) return rc;
    uint8_t hello[CSD_WIRE_HELLO_SIZE], hello_ok[CSD_WIRE_HELLO_SIZE];
    size_t len = 0;
    if ((rc = csd_wire_encode_hello(hello, sizeof hello, &mine, &len, err))) return rc;
    csd_wire_hdr h = csd_wire_hdr_make(CSD_WIRE_HELLO, 0, 0, 0, (uint32_t)len);
    csd_netbuf buf = {0};
    uint8_t th[TRANSCRIPT_SIZE], k_c2s[KEY_SIZE], k_s2c[KEY_SIZE];
    pthread_mutex_lock(&c->recv_lock);
    if ((rc = csd_conn_send_frame(c, &h, hello, len, MODE_PLAIN, err))) goto fail;
    if ((rc = csd_conn_recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err))) goto fail;
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_HELLO_OK) {
        rc = csd_err_set(err, CSD_EPROTO, "peer %s: expected HELLO_OK, got %s", c->peer,
                         csd_wire_type_name(h.type));
        goto fail;
    }
    csd_wire_hello theirs;
    if ((rc = csd_wire_decode_hello(buf.data, h.payload_len, &theirs, err))) goto fail;
    memcpy(hello_ok, buf.data, CSD_WIRE_HELLO_SIZE);
    char msg[CSD_ERR_MSG_MAX];
    if ((rc = compare_hello(&mine, &theirs, "client expects", "server serves", msg, sizeof msg))) {
        /* The server accepted what it should not have, or answered with other values. */
        char text[CSD_ERR_MSG_MAX + 32];
        snprintf(text, sizeof text, "client refuses: %s", msg);
        refuse(c, rc, text, "client");
        rc = csd_err_set(err, rc, "peer %s: %s", c->peer, msg);
        goto done;
    }
    if (peer) *peer = theirs;
    if (cfg->insecure) {
        rc = 0;
        goto done;
    }
    derive_keys(cfg->key, hello, hello_ok, th, k_c2s, k_s2c);
    start_secure(c, k_c2s, k_s2c);
    if ((rc = send_auth(c, th, err))) goto fail;
    if ((rc = csd_conn_recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err))) goto fail;
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_AUTH || sodium_memcmp(buf.data, th, TRANSCRIPT_SIZE) != 0) {
        rc = csd_err_set(err, CSD_EAUTH, "peer %s: bad AUTH from server", c->peer);
        goto fail;
    }
    CSD_LOGD("net: link up side=client peer=%s stage=%u layers=[%u,%u) mode=encrypted", c->peer,
             (unsigned)theirs.stage_index, (unsigned)theirs.layer_begin,
             (unsigned)theirs.layer_end);
    rc = 0;
    goto done;
fail:
    return handshake_end(c, "client", rc, true, k_c2s, k_s2c, &buf, err);
done:
    return handshake_end(c, "client", rc, false, k_c2s, k_s2c, &buf, err);
}

int csd_conn_handshake_server(csd_conn *c, const csd_link_cfg *cfg, const csd_wire_hello *self,
                              csd_wire_hello *peer, csd_err *err) {
    csd_wire_hello mine;
    int rc = handshake_begin(c, cfg, self, &mine, err);
    if (rc) return rc;
    uint8_t hello[CSD_WIRE_HELLO_SIZE], hello_ok[CSD_WIRE_HELLO_SIZE];
    size_t len = 0;
    if ((rc = csd_wire_encode_hello(hello_ok, sizeof hello_ok, &mine, &len, err))) return rc;
    csd_netbuf buf = {0};
    csd_wire_hdr h;
    uint8_t th[TRANSCRIPT_SIZE], k_c2s[KEY_SIZE], k_s2c[KEY_SIZE];
    char msg[CSD_ERR_MSG_MAX];
    pthread_mutex_lock(&c->recv_lock);
    rc = csd_conn_recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err);
    if (rc) {
        if (rc == CSD_EPROTO) { /* e.g. another protocol version: tell the peer why */
            refuse(c, rc, err ? err->msg : "bad HELLO frame", "server");
            goto done;
        }
        goto fail;
    }
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_HELLO) {
        snprintf(msg, sizeof msg, "expected HELLO as the first frame, got %s",
                 csd_wire_type_name(h.type));
        rc = refuse(c, CSD_EPROTO, msg, "server");
        csd_err_set(err, rc, "peer %s: %s", c->peer, msg);
        goto done;
    }
    csd_wire_hello theirs;
    if ((rc = csd_wire_decode_hello(buf.data, h.payload_len, &theirs, err))) {
        refuse(c, rc, err ? err->msg : "bad HELLO", "server");
        goto done;
    }
    memcpy(hello, buf.data, CSD_WIRE_HELLO_SIZE);
    if ((rc = compare_hello(&theirs, &mine, "client expects", "server serves", msg, sizeof msg))) {
        refuse(c, rc, msg, "server");
        csd_err_set(err, rc, "peer %s: %s", c->peer, msg);
        goto done;
    }
    h = csd_wire_hdr_make(CSD_WIRE_HELLO_OK, 0, 0, 0, (uint32_t)len);
    if ((rc = csd_conn_send_frame(c, &h, hello_ok, len, MODE_PLAIN, err))) goto fail;
    if (peer) *peer = theirs;
    if (cfg->insecure) {
        rc = 0;
        goto done;
    }
    derive_keys(cfg->key, hello, hello_ok, th, k_c2s, k_s2c);
    start_secure(c, k_s2c, k_c2s);
    rc = csd_conn_recv_frame_locked(c, &h, &buf, c->timeout_ms, true, err);
    if (rc == CSD_EAUTH) {
        refuse(c, CSD_EAUTH,
               "fleet key mismatch: the client's AUTH frame failed authentication", "server");
        csd_err_set(err, CSD_EAUTH, "peer %s: fleet key mismatch (AUTH failed authentication)",
                    c->peer);
        goto done;
    }
    if (rc) goto fail;
    if (h.type == CSD_WIRE_ERROR) {
        rc = peer_refused(c, &buf, &h, err);
        goto done;
    }
    if (h.type != CSD_WIRE_AUTH || sodium_memcmp(buf.data, th, TRANSCRIPT_SIZE) != 0) {
        rc = refuse(c, CSD_EAUTH, "expected AUTH with the transcript hash", "server");
        csd_err_set(err, rc, "peer %s: bad AUTH frame", c->peer);
        goto done;
    }
    if ((rc = send_auth(c, th, err))) goto fail;
    CSD_LOGD("net: link up side=server peer=%s role=%s mode=encrypted", c->peer,
             csd_wire_role_name(theirs.role));
    rc = 0;
    goto done;
fail:
    return handshake_end(c, "server", rc, true, k_c2s, k_s2c, &buf, err);
done:
    return handshake_end(c, "server", rc, false, k_c2s, k_s2c, &buf, err);
}
