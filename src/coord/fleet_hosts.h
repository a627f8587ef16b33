/* fleet_hosts: how many machines a fleet's stages run on, read from their addresses.
 * It decides how many micro-batches the coordinator keeps in flight by default: interleaving
 * requests through the pipeline pays when each stage has its own cores; stages that share one
 * machine share its cores, and splitting a batch among them only multiplies the weight reads
 * (each micro-batch reads every weight once). */
#ifndef CSD_FLEET_HOSTS_H
#define CSD_FLEET_HOSTS_H

#include <stdbool.h>
#include <stddef.h>

#include "fleet_pipeline.h"

/* Copies the host part of "host:port" or "[v6]:port" into out (lower case, brackets dropped);
 * loopback names (localhost, 127.x.y.z, ::1) become "localhost". Returns false when addr has no
 * ":port" or the host does not fit. */
bool csd_fleet_host_of(const char *addr, char *out, size_t cap);

/* Distinct machines among the fleet's remote stages, plus this one when here_too (a stage the
 * coordinator computes itself). Loopback addresses are this machine. Two names for one machine
 * count as two: --micro-batches overrides the default. */
int csd_fleet_count_machines(const csd_fleet_opts *o, bool here_too);

#endif
