/* fleet_key: the shared secret every process of one fleet holds (32 random bytes).
 * Stored as 64 hex digits plus a newline in a file of mode 0600; load refuses files that group or
 * others can read, and also accepts standard base64. Session keys are derived from it per link
 * (conn_handshake.c); the fleet key itself never crosses the wire. See docs/protocol.md, "Fleet
 * key". */
#ifndef CSD_NET_FLEET_KEY_H
#define CSD_NET_FLEET_KEY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"

#define CSD_FLEET_KEY_SIZE 32u
#define CSD_FLEET_KEY_FILE_MAX 256u /* longest key file accepted (hex + whitespace) */

typedef struct csd_fleet_key {
    uint8_t bytes[CSD_FLEET_KEY_SIZE];
} csd_fleet_key;

/* Fills key with 32 bytes from the OS CSPRNG (libsodium randombytes). */
int csd_fleet_key_generate(csd_fleet_key *key, csd_err *err);
/* Writes key as hex to path with mode 0600. Refuses to replace an existing file unless
 * overwrite. */
int csd_fleet_key_save(const char *path, const csd_fleet_key *key, bool overwrite, csd_err *err);
/* Reads a key file (hex or base64, surrounding whitespace ignored). Refuses a non-regular file, a
 * file readable by group/others (CSD_EAUTH) and anything that does not decode to exactly 32
 * bytes. */
int csd_fleet_key_load(const char *path, csd_fleet_key *key, csd_err *err);
/* A short public identifier of a key for logs: 16 hex digits of BLAKE2b("csd fingerprint", key).
 * out must hold 17 bytes. */
void csd_fleet_key_fingerprint(const csd_fleet_key *key, char out[17]);
/* Overwrites the key with zeros (sodium_memzero, not optimized away). */
void csd_fleet_key_wipe(csd_fleet_key *key);

#endif
