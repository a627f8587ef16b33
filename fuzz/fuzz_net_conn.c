/* fuzz_net_conn: a hostile peer for the server side of a link. The input is the byte stream the
 * peer sends (frames whose plain-framing XXH64 trailers this harness fills in, so the fuzzer gets
 * past the checksum); it goes through an AF_UNIX socketpair into csd_conn_handshake_server and then
 * csd_conn_recv plus the payload decoders, in insecure mode (a fuzzer cannot know the session
 * keys). Must never crash, hang or leak; every refusal must come with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/log.h"
#include "net/conn.h"
#include "net/wire.h"

static void check(int cond) {
    if (!cond) abort();
}

/* Rewrites the input as frames with valid checksums; a frame that claims more bytes than remain
 * is sent truncated. The first input byte chooses whether checksums are fixed (bit 0). */
static size_t build_stream(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    if (n == 0) return 0;
    int fix = in[0] & 1;
    in++, n--;
    size_t o = 0;
    while (n > 0 && o < cap) {
        size_t h = n < CSD_WIRE_HDR_SIZE ? n : CSD_WIRE_HDR_SIZE;
        uint32_t plen = h == CSD_WIRE_HDR_SIZE ? csd_wire_get_u32(in + 16) : 0;
        size_t body = plen > n - h ? n - h : plen;
        if (o + h + body + 8 > cap) break;
        memcpy(out + o, in, h + body);
        if (h == CSD_WIRE_HDR_SIZE && body == plen && fix) {
            uint64_t seed = XXH64(in, CSD_WIRE_HDR_SIZE, 0);
            csd_wire_put_u64(out + o + h + body, XXH64(in + h, body, seed));
            o += h + body + 8;
        } else {
            o += h + body;
        }
        in += h + body;
        n -= h + body;
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int once;
    if (!once) {
        csd_log_set_level(CSD_LOG_ERROR); /* refusals are expected here: keep the fuzzer fast */
        once = 1;
    }
    if (size > 65536) return 0;
    static uint8_t stream[65536 + 8 * 4096];
    size_t n = build_stream(data, size, stream, sizeof stream);
    int sv[2];
    check(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    int sndbuf = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(sv[0], stream + off, n - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    csd_conn *c = NULL;
    csd_err err = {0};
    check(csd_conn_from_fd(&c, sv[1], &err) == 0);
    csd_link_cfg cfg = {.key = NULL, .insecure = true, .timeout_ms = 1000};
    csd_wire_hello self;
    memset(&self, 0, sizeof self);
    self.role = CSD_WIRE_ROLE_STAGE;
    self.stage_index = 0;
    self.layer_begin = 0;
    self.layer_end = 4;
    csd_wire_hello peer;
    int rc = csd_conn_handshake_server(c, &cfg, &self, &peer, &err);
    if (rc == 0) {
        csd_netbuf buf = {0};
        for (int i = 0; i < 64; i++) {
            csd_wire_hdr h;
            rc = csd_conn_recv(c, &h, &buf, 0, &err);
            if (rc) break;
            check(h.payload_len <= CSD_WIRE_MAX_PAYLOAD && buf.cap >= h.payload_len);
            csd_wire_act a;
            csd_wire_open o;
            if (h.type == CSD_WIRE_FORWARD || h.type == CSD_WIRE_RESULT)
                (void)csd_wire_decode_act(buf.data, h.payload_len, &a, NULL);
            if (h.type == CSD_WIRE_OPEN)
                (void)csd_wire_decode_open(buf.data, h.payload_len, &o, NULL);
        }
        csd_netbuf_fini(&buf);
    }
    check(rc == 0 || err.msg[0] != '\0');
    csd_conn_destroy(c);
    close(sv[0]);
    return 0;
}
