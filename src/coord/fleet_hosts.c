/* fleet_hosts: machines behind a fleet's addresses (see the header). */
#include "fleet_hosts.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define LOOPBACK "localhost"

static bool is_loopback(const char *host) {
    return !strcmp(host, LOOPBACK) || !strcmp(host, "::1") || !strncmp(host, "127.", 4);
}

bool csd_fleet_host_of(const char *addr, char *out, size_t cap) {
    const char *begin = addr, *end;
    if (*addr == '[') { /* [v6]:port */
        begin = addr + 1;
        end = strchr(begin, ']');
        if (!end || end[1] != ':') return false;
    } else {
        end = strrchr(addr, ':');
        if (!end) return false;
    }
    size_t n = (size_t)(end - begin);
    if (n == 0 || n >= cap) return false;
    for (size_t i = 0; i < n; i++) out[i] = (char)tolower((unsigned char)begin[i]);
    out[n] = '\0';
    if (is_loopback(out)) {
        if (cap <= strlen(LOOPBACK)) return false;
        strcpy(out, LOOPBACK);
    }
    return true;
}

int csd_fleet_count_machines(const csd_fleet_opts *o, bool here_too) {
    char hosts[CSD_FLEET_MAX_STAGES + 1][CSD_WIRE_MAX_ROUTE + 1];
    int n = 0;
    if (here_too) strcpy(hosts[n++], LOOPBACK);
    for (int i = 0; i < o->n_addrs && i < CSD_FLEET_MAX_STAGES; i++) {
        char h[CSD_WIRE_MAX_ROUTE + 1];
        if (!csd_fleet_host_of(o->addrs[i], h, sizeof h)) snprintf(h, sizeof h, "%s", o->addrs[i]);
        bool seen = false;
        for (int k = 0; k < n && !seen; k++) seen = !strcmp(hosts[k], h);
        if (!seen) strcpy(hosts[n++], h);
    }
    return n > 0 ? n : 1;
}
