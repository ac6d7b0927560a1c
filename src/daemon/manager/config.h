#pragma once
/* The daemon's settings, fixed once the options are read (options.c: the
 * command line and the config file) and the wiring (daemon.c) has worked out
 * the paths and probed the drivers; read-only afterwards, so threads share
 * it unlocked. */
#include <stdbool.h>
#include <stdint.h>

#include "driver/driver.h"

#define CONFIG_MAX_DRIVERS 8

typedef struct DriverOffer {
        const Driver *driver;
        bool offered;   /* in --drivers (or every driver whose probe passed) */
        bool available; /* its probe passed */
        char reason[512];
} DriverOffer;

typedef struct DaemonConfig {
        const char *listen_addr;
        uint16_t listen_port;
        const char *socket_path; /* instead of TCP when set */
        const char *state_dir;
        const char *database; /* a postgresql:// URL; NULL: runtime.db in the state directory */
        const char *image_dir;
        const char *agent_path;
        /* runtime-supervisor: each sandbox's, so that it outlives the daemon
         * (docs/lifecycle.md, "Live restore"); NULL when live restore is off. */
        const char *supervisor_path;
        bool no_live_restore;        /* --no-live-restore */
        bool stop_sandboxes_on_exit; /* a stop of the daemon stops its sandboxes */
        bool no_interpreter_prestart; /* --no-interpreter-prestart */
        bool no_warm_pool_kernel;     /* --no-warm-pool-kernel */
        /* At most this many kernels started ahead on this host within the last
         * interpreter_prestart_idle_s seconds (an unused one ends itself then). */
        unsigned interpreter_prestart_max;
        unsigned interpreter_prestart_idle_s;
        const char *image_builder;
        /* runtime-microvm-build beside image_builder, run after it by an image
         * build when the microvm driver is offered; NULL when absent. */
        const char *microvm_builder;
        const char *cgroup_parent;
        const Driver *default_driver; /* NULL when no driver can run here */
        DriverOffer drivers[CONFIG_MAX_DRIVERS];
        unsigned n_drivers;
        unsigned max_sandboxes;
        unsigned max_sandboxes_per_key;
        unsigned max_vcpu;
        unsigned max_memory_mib;
        unsigned max_disk_mib;
        unsigned max_file_mib;
        unsigned max_connections;
        unsigned max_connections_per_peer; /* of them, from one peer address */
        unsigned max_requests_per_owner;   /* requests in progress of one owner */
        unsigned max_waiting_connections;  /* connections awaiting their first head */
        unsigned http_head_timeout_s;      /* for a request's whole head */
        unsigned max_uploads_per_owner;    /* uploads in progress of one owner */
        unsigned max_upload_mib_per_owner; /* their declared bytes */
        unsigned max_snapshot_mib_per_owner; /* the bytes one owner's snapshots hold */
        unsigned max_processes_per_owner;    /* processes one owner runs at once on this host */
        uint64_t price_vcpu_hour_micros;
        uint64_t price_gib_hour_micros;
        /* A paused sandbox costs only its disk: this per GiB of diskMiB. */
        uint64_t price_disk_gib_hour_micros;
        /* The shortest idlePauseSeconds; a shorter one is raised to it. */
        unsigned idle_pause_min_seconds;
        int64_t trial_allowance_seconds; /* sandbox-seconds free per trial key */
        unsigned max_trial_keys;         /* trial keys the daemon hands out; 0: no trial */
        /* Test-only name=127.0.0.1:port mappings for the egress proxy, and a
         * CA file trusted for upstreams besides the host's store. */
        const char *egress_test_upstreams[32];
        unsigned n_egress_test_upstreams;
        const char *egress_extra_ca;
        /* Operator settings, off by default: CIDRs whose addresses count as
         * public upstreams, and a CA bundle trusted upstream and in sandboxes. */
        const char *egress_public_cidrs[32];
        unsigned n_egress_public_cidrs;
        const char *egress_trust_ca;
        /* The egress pool: worker threads in all and per sandbox (0: default). */
        unsigned egress_workers;
        unsigned egress_workers_per_sandbox;
        /* The warm pool's classes as --warm-pool gives them
         * (warm_pool.h: DRIVER:IMAGE[:SHAPE]=N). */
        const char *warm_pools[8];
        unsigned n_warm_pools;
        /* Registries (host:port) an image pull may reach over plain HTTP,
         * and the bytes one pull may download and unpack. */
        const char *image_insecure_registries[8];
        unsigned n_image_insecure_registries;
        unsigned image_pull_max_mib;
        /* The bytes one owner's build layers hold on this host, past which
         * the least recently used go (docs/images.md, "Per-step layers"). */
        unsigned image_layer_max_mib_per_owner;
        /* The bytes one owner's pulled trees hold on this host, past which
         * the least recently used that nothing uses go (docs/images.md,
         * "Images from registries"). */
        unsigned image_tree_max_mib_per_owner;
        /* The bytes of build-context chunks one owner keeps, and the hours a
         * chunk nothing used is kept (docs/images.md, "How a build runs"). */
        unsigned image_context_max_mib_per_owner;
        unsigned image_context_max_age_hours;
} DaemonConfig;

/* The offer for a driver name, or NULL when this build has no such driver. */
const DriverOffer *config_driver_offer(const DaemonConfig *cfg, const char *name);
/* costMicrosPerHour of a shape. */
uint64_t config_cost_per_hour(const DaemonConfig *cfg, unsigned vcpu, unsigned memory_mib);
