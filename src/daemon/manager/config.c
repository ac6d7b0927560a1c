#include "daemon/manager/config.h"

#include <string.h>

const DriverOffer *config_driver_offer(const DaemonConfig *cfg, const char *name) {
        for (unsigned i = 0; i < cfg->n_drivers; i++)
                if (strcmp(cfg->drivers[i].driver->name, name) == 0)
                        return &cfg->drivers[i];
        return NULL;
}

uint64_t config_cost_per_hour(const DaemonConfig *cfg, unsigned vcpu, unsigned memory_mib) {
        return (uint64_t)vcpu * cfg->price_vcpu_hour_micros +
               (uint64_t)memory_mib * cfg->price_gib_hour_micros / 1024u;
}
