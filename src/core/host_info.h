/* host_info: what machine a result was measured on, for bench's records. */
#ifndef CSD_HOST_INFO_H
#define CSD_HOST_INFO_H

#include <stddef.h>

/* Writes the CPU's model name (Linux: /proc/cpuinfo's "model name") into buf, or "unknown" when
 * the system does not say. Always NUL-terminates (cap >= 1); returns buf. */
char *csd_host_cpu_name(char *buf, size_t cap);

#endif
