/* host_info: see host_info.h. */
#include "host_info.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* "model name\t: AMD EPYC 9R14 96-Core Processor\n" -> the text after ": ", trimmed. */
static int cpu_name_from_line(const char *line, char *buf, size_t cap) {
    static const char key[] = "model name";
    if (strncmp(line, key, sizeof key - 1) != 0) return 0;
    const char *colon = strchr(line, ':');
    if (!colon) return 0;
    const char *p = colon + 1;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strcspn(p, "\n");
    while (n > 0 && isspace((unsigned char)p[n - 1])) n--;
    if (n == 0) return 0;
    if (n >= cap) n = cap - 1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 1;
}

char *csd_host_cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return buf;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (cpu_name_from_line(line, buf, cap)) break;
    fclose(f);
    return buf;
}
