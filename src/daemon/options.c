/* runtimed's option table and the two readers of it: the command line
 * (getopt_long, so abbreviations and --name=value work as they always have)
 * and a config file of "key = value" lines. docs/runtimed.md lists the same
 * options; a test checks that it names every one. */
#include "daemon/options.h"
#include "daemon/manager/volumes.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"
#include "daemon/api/preview_proxy.h"
#include "daemon/egress/egress_service.h"
#include "daemon/http/http.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/events.h"
#include "daemon/manager/fleet.h"
#include "daemon/manager/keys.h"
#include "daemon/manager/otel.h"
#include "daemon/manager/process.h"
#include "daemon/manager/samples.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/uploads.h"
#include "daemon/manager/warm_pool.h"
#include "daemon/manager/webhooks.h"
#include "driver/driver.h"

typedef enum OptionKind {
        OPTION_HEADING,   /* a heading of --help, not an option */
        OPTION_STRING,    /* char *, owned */
        OPTION_UINT,      /* a bounded number into an unsigned, uint64_t or int64_t */
        OPTION_LIST,      /* repeatable: an array of owned strings and its count */
        OPTION_LOG_LEVEL, /* LogLevel */
        OPTION_SWITCH,    /* no argument: sets a bool */
        OPTION_ACTION,    /* no argument: ends the parse with an action */
} OptionKind;

typedef struct OptionSpec {
        const char *name;
        OptionKind kind;
        const char *arg; /* the argument as --help names it */
        const char *help;
        size_t offset; /* the value's, in DaemonOptions */
        size_t size;   /* an OPTION_UINT value's: 4 or 8 */
        unsigned long long min, max, def;
        unsigned long long scale; /* stored as the number times this (hours into seconds) */
        const char *def_str;      /* an OPTION_STRING's default */
        const char *def_text;     /* the default as --help says it, when the daemon works it out */
        size_t count_offset;      /* an OPTION_LIST's count (unsigned) */
        unsigned capacity;
        int (*check)(const char *value, char *why, size_t why_len);
        bool command_line_only;
        OptionsAction action;
} OptionSpec;

static int check_driver(const char *value, char *why, size_t why_len);
static int check_drivers(const char *value, char *why, size_t why_len);
static int check_warm_pool(const char *value, char *why, size_t why_len);

#define FIELD(f) .offset = offsetof(DaemonOptions, f), .size = sizeof(((DaemonOptions *)0)->f)
#define HEADING(title) { .kind = OPTION_HEADING, .help = (title) }
#define STRING(n, a, f, d, h) { .name = (n), .kind = OPTION_STRING, .arg = (a), FIELD(f), .def_str = (d), .help = (h) }
#define NUMBER(n, f, lo, hi, d, h) \
        { .name = (n), .kind = OPTION_UINT, .arg = "N", FIELD(f), .min = (lo), .max = (hi), .def = (d), .help = (h) }
#define LIST(n, a, f, count, h)                                                                             \
        { .name = (n), .kind = OPTION_LIST, .arg = (a), FIELD(f), .count_offset = offsetof(DaemonOptions, count), \
          .capacity = ELEMENTSOF(((DaemonOptions *)0)->f), .help = (h) }

#define PRICE_MAX 1000000000000ULL

static const OptionSpec options[] = {
        HEADING("Where it serves and keeps its state"),
        STRING("listen", "ADDR:PORT", cfg.listen_addr, "127.0.0.1:7878", "the TCP address of the API"),
        STRING("socket", "PATH", cfg.socket_path, NULL, "serve on a unix socket instead"),
        STRING("database", "URL", cfg.database, NULL,
               "a PostgreSQL database (postgresql://...) instead of runtime.db in the state directory"),
        { .name = "state-dir", .kind = OPTION_STRING, .arg = "DIR", FIELD(cfg.state_dir),
          .def_text = "/var/lib/runtime as root, else $XDG_STATE_HOME/runtime or ~/.local/state/runtime; "
                      "env RUNTIME_STATE_DIR",
          .help = "the database, the keys, the sandboxes' layers and snapshots" },
        { .name = "image-dir", .kind = OPTION_STRING, .arg = "DIR", FIELD(cfg.image_dir),
          .def_text = "<state-dir>/images", .help = "the images" },
        { .name = "advertise", .kind = OPTION_STRING, .arg = "URL", FIELD(advertise),
          .def_text = "what it listens on", .help = "the URL other hosts reach this one at" },
        { .name = "host-id", .kind = OPTION_STRING, .arg = "ID", FIELD(host_id),
          .def_text = "the id kept in <state-dir>/host.id, made at the first start",
          .help = "this host's id among the hosts that share a database" },
        { .name = "secrets-key-file", .kind = OPTION_STRING, .arg = "FILE", FIELD(secrets_key_file),
          .def_text = "<state-dir>/secrets.key, made at the first start",
          .help = "the key egress secrets are sealed with in the database (64 hex digits, the file mode 0600); "
                  "every host of a fleet needs the same" },
        { .name = "fleet-secret-file", .kind = OPTION_STRING, .arg = "FILE", FIELD(fleet_secret_file),
          .def_text = "none: this host forwards nothing",
          .help = "the secret every host of the fleet shares (16 to 256 printable bytes, the file mode 0600): "
                  "with it, a request about a sandbox another host runs is forwarded to that host" },
        { .name = "fleet-tls-dir", .kind = OPTION_STRING, .arg = "DIR", FIELD(fleet_tls_dir),
          .def_text = "none: the hop is plain HTTP",
          .help = "the hop between hosts goes over TLS: DIR holds cert.pem (this host's certificate, naming its "
                  "advertised address), key.pem (mode 0600) and ca.pem (the fleet's CA, the only one trusted)" },
        { .name = "fleet-listen", .kind = OPTION_STRING, .arg = "ADDR:PORT", FIELD(fleet_listen),
          .def_text = "none", .help = "with --fleet-tls-dir: where the other hosts' forwarded requests are "
                                      "served over TLS (--advertise https://ADDR:PORT)" },
        NUMBER("host-dead-after-seconds", host_dead_after_seconds, FLEET_DEAD_AFTER_MIN_SECONDS,
               FLEET_DEAD_AFTER_MAX_SECONDS, FLEET_DEAD_AFTER_DEFAULT_SECONDS,
               "a host whose heartbeat is this old is declared dead and its sandboxes lost; a host that "
               "cannot renew its own for this long fences itself"),
        NUMBER("event-retention-days", event_retention_days, 1, 3650, EVENTS_RETENTION_DAYS_DEFAULT,
               "lifecycle events (GET /v1/events) older than this are dropped, and webhook deliveries with them"),
        NUMBER("audit-retention-days", audit_retention_days, 1, 3650, AUDIT_RETENTION_DAYS_DEFAULT,
               "audit records (GET /v1/audit) older than this are dropped"),
        NUMBER("sandbox-metrics-interval-seconds", sandbox_metrics_interval_seconds, 1, SAMPLES_INTERVAL_SECONDS_MAX,
               SAMPLES_INTERVAL_SECONDS_DEFAULT,
               "every live sandbox's CPU, memory, disk and network use is read this often "
               "(GET /v1/sandboxes/{id}/metrics, and its series on /metrics)"),
        NUMBER("sandbox-metrics-retention-days", sandbox_metrics_retention_days, 1, 3650,
               SAMPLES_RETENTION_DAYS_DEFAULT, "sandbox metrics readings older than this are dropped"),
        LIST("webhook-allow-cidr", "CIDR", webhook_allow_cidrs, n_webhook_allow_cidrs,
             "webhook receivers may be at addresses in CIDR although they are not public, loopback and private "
             "ranges among them (repeatable; link-local, metadata and multicast addresses never)"),
        NUMBER("webhook-retry-seconds", webhook_retry_seconds, 1, WEBHOOK_RETRY_MAX_SECONDS,
               WEBHOOK_RETRY_SECONDS_DEFAULT,
               "the wait after a webhook delivery's first failed attempt; it doubles after each, up to an hour"),
        NUMBER("otel-interval-seconds", otel_interval_seconds, 1, OTEL_INTERVAL_SECONDS_MAX,
               OTEL_INTERVAL_SECONDS_DEFAULT,
               "an OpenTelemetry export's new events and sandbox metrics are pushed this often (a full batch "
               "sooner)"),
        NUMBER("webhook-workers", webhook_workers, 1, WEBHOOK_WORKERS_MAX, WEBHOOK_WORKERS_DEFAULT,
               "webhook deliveries this host sends at once"),
        NUMBER("webhook-workers-per-owner", webhook_workers_per_owner, 0, WEBHOOK_WORKERS_MAX, 0,
               "of those, how many may send one owner's deliveries at once (0: half of them, at least one)"),
        { .name = "config", .kind = OPTION_STRING, .arg = "FILE", FIELD(config_path), .command_line_only = true,
          .help = "read settings from FILE: one `key = value` a line, the keys these options' names, "
                  "`#` comments; an option given here wins over the file" },

        HEADING("Previews"),
        { .name = "preview-listen", .kind = OPTION_STRING, .arg = "ADDR:PORT", FIELD(preview_listen),
          .def_text = "none: no previews",
          .help = "serve previews (a sandbox's port at PORT-SANDBOX.DOMAIN) on a listener of their own; "
                  "no API key is read there" },
        STRING("preview-domain", "DOMAIN", preview_domain, "localhost",
               "previews are at PORT-SANDBOX.DOMAIN: a wildcard DNS name that reaches the preview listener "
               "(*.localhost reaches loopback without DNS)"),
        { .name = "preview-public-port", .kind = OPTION_UINT, .arg = "PORT", FIELD(preview_public_port), .min = 1,
          .max = 65535, .def_text = "the --preview-listen port",
          .help = "the port preview URLs name, when a proxy in front listens on another (80 and 443 are left out)" },
        { .name = "preview-https", .kind = OPTION_SWITCH, FIELD(preview_https),
          .help = "preview URLs say https: a proxy in front ends TLS (docs/previews.md)" },
        NUMBER("preview-relay-max-connections", preview_relay_max, 1, PREVIEW_RELAY_MAX_LIMIT, PREVIEW_RELAY_MAX_DEFAULT,
               "in a fleet, the preview connections this host relays to any one other host, and takes relayed "
               "from one; past it a 503 page"),
        { .name = "preview-tls-dir", .kind = OPTION_STRING, .arg = "DIR", FIELD(preview_tls_dir),
          .def_text = "none: plain HTTP",
          .help = "the preview listener speaks TLS: DIR holds cert.pem (for *.DOMAIN, its chain after it) and "
                  "key.pem (mode 0600); preview URLs then say https" },

        HEADING("Drivers"),
        { .name = "driver", .kind = OPTION_STRING, .arg = "auto|NAME", FIELD(driver), .def_str = "auto",
          .check = check_driver, .help = "the default driver" },
        { .name = "drivers", .kind = OPTION_STRING, .arg = "LIST", FIELD(drivers), .check = check_drivers,
          .def_text = "every driver whose probe passes", .help = "the drivers offered, comma-separated" },
        STRING("cgroup-parent", "NAME", cfg.cgroup_parent, "runtime", "the cgroup under which sandboxes live"),
        { .name = "heartbeat-interval-ms", .kind = OPTION_UINT, .arg = "N", FIELD(heartbeat_interval_ms),
          .min = 1000, .max = 600000, .def_text = "5000", .help = "ping each sandbox's agent this often" },
        { .name = "heartbeat-timeout-ms", .kind = OPTION_UINT, .arg = "N", FIELD(heartbeat_timeout_ms),
          .min = 1000, .max = 600000, .def_text = "per driver: 30000, microvm 90000",
          .help = "fail a sandbox whose agent is silent this long while a ping waits" },

        { .name = "warm-pool", .kind = OPTION_LIST, .arg = "DRIVER:IMAGE[:VCPUxMEMxDISK]=N",
          FIELD(cfg.warm_pools), .count_offset = offsetof(DaemonOptions, cfg.n_warm_pools),
          .capacity = ELEMENTSOF(((DaemonOptions *)0)->cfg.warm_pools), .check = check_warm_pool,
          .help = "keep N sandboxes of that driver (namespace, gvisor or microvm), image and shape (MEM and DISK in MiB; "
                  "left out, a create's defaults 1x1024x2048) started ahead, for creates that ask for exactly "
                  "those (repeatable, once per class; docs/warm-pool.md)" },
        { .name = "no-warm-pool-kernel", .kind = OPTION_SWITCH, FIELD(cfg.no_warm_pool_kernel),
          .help = "keep the warm pool's sandboxes without their interpreter kernel started (each holds 60-80 MiB "
                  "less; a handed-out one's first cell starts it, docs/warm-pool.md)" },
        { .name = "no-live-restore", .kind = OPTION_SWITCH, FIELD(cfg.no_live_restore),
          .help = "start sandboxes without a supervisor: they end with the daemon (a crash or a stop) and are "
                  "recorded stopped at the next start, as the microVM's always are" },
        { .name = "no-interpreter-prestart", .kind = OPTION_SWITCH, FIELD(cfg.no_interpreter_prestart),
          .help = "start no interpreter kernel with a new sandbox: the default python context starts on its "
                  "first run instead (docs/interpreter.md)" },
        NUMBER("interpreter-prestart-max", cfg.interpreter_prestart_max, 0, 1024, 8,
               "start the interpreter's kernel ahead in at most N new sandboxes within the idle time below; "
               "the creates past it start none (0: none at all)"),
        NUMBER("interpreter-prestart-idle-seconds", cfg.interpreter_prestart_idle_s, 10, 86400, 300,
               "a kernel started ahead that no cell has used for this long ends itself, and its memory goes "
               "back to its sandbox"),
        { .name = "stop-sandboxes-on-exit", .kind = OPTION_SWITCH, FIELD(cfg.stop_sandboxes_on_exit),
          .help = "stop every sandbox when the daemon stops; without it they keep running and the next start "
                  "re-attaches them" },

        HEADING("Companion programs (default: beside runtimed, else in ../libexec/runtime/)"),
        { .name = "agent", .kind = OPTION_STRING, .arg = "PATH", FIELD(cfg.agent_path),
          .help = "the runtime-agent binary" },
        { .name = "supervisor", .kind = OPTION_STRING, .arg = "PATH", FIELD(cfg.supervisor_path),
          .help = "the runtime-supervisor program" },
        { .name = "image-builder", .kind = OPTION_STRING, .arg = "PATH", FIELD(cfg.image_builder),
          .help = "the runtime-image-build program; runtime-microvm-build is looked for beside it" },
        STRING("egress-proxy", "PATH", egress_proxy, NULL, "the runtime-egress program"),

        HEADING("Images from registries (docs/images.md)"),
        { .name = "image-insecure-registry", .kind = OPTION_LIST, .arg = "HOST:PORT",
          FIELD(cfg.image_insecure_registries), .count_offset = offsetof(DaemonOptions, cfg.n_image_insecure_registries),
          .capacity = ELEMENTSOF(((DaemonOptions *)0)->cfg.image_insecure_registries),
          .help = "pull images from this registry over plain HTTP, without TLS (repeatable; for a registry on a "
                  "trusted network only)" },
        NUMBER("image-pull-max-mib", cfg.image_pull_max_mib, 16, 1024u * 1024, 8192,
               "the bytes one image pull may download and unpack, together"),
        NUMBER("image-layer-max-mib-per-owner", cfg.image_layer_max_mib_per_owner, 0, SNAPSHOT_OWNER_MIB_MAX, 4096,
               "the bytes one owner's build layers (the per-step cache) keep on this host; past it the least "
               "recently used go; 0 keeps none"),
        NUMBER("image-tree-max-mib-per-owner", cfg.image_tree_max_mib_per_owner, 0, 1024u * 1024, 8192,
               "the bytes of one owner's images pulled from registries that no image, layer, snapshot or sandbox "
               "uses any more, kept on this host for later FROMs; past it the least recently used go"),
        NUMBER("image-context-max-mib-per-owner", cfg.image_context_max_mib_per_owner, 8, 1024u * 1024, 512,
               "the bytes of build-context chunks one owner keeps; past it the least recently used that no queued "
               "or running build names go to make room"),
        NUMBER("image-context-max-age-hours", cfg.image_context_max_age_hours, 1, 24u * 365, 168,
               "the hours a build-context chunk that nothing named is kept"),

        HEADING("Limits"),
        NUMBER("max-sandboxes", cfg.max_sandboxes, 0, 100000, 256, "sandboxes on this host"),
        NUMBER("max-sandboxes-per-key", cfg.max_sandboxes_per_key, 0, 100000, 128, "sandboxes of one key"),
        NUMBER("volume-max-mib", volume_max_mib, VOLUME_MIN_MIB, 16u * 1024 * 1024, VOLUME_DEFAULT_MAX_MIB,
               "the size of one volume"),
        NUMBER("volume-max-count", volume_max_count, 0, 100000, VOLUME_DEFAULT_MAX_COUNT, "volumes of one owner"),
        NUMBER("volume-max-total-mib", volume_max_total_mib, VOLUME_MIN_MIB, 1024u * 1024 * 1024,
               VOLUME_DEFAULT_MAX_TOTAL_MIB, "the sizes of one owner's volumes together"),
        NUMBER("volume-backup-sweep-seconds", volume_backup_sweep_seconds, 1, 3600, VOLUME_SWEEP_DEFAULT_SECONDS,
               "how often scheduled volume backups are taken and expired ones deleted"),
        NUMBER("volume-backup-day-seconds", volume_backup_day_seconds, 1, VOLUME_DAY_SECONDS, VOLUME_DAY_SECONDS,
               "the length of a day in volume backup schedules and retention (shorter only for tests)"),
        NUMBER("max-vcpu", cfg.max_vcpu, 1, 1024, 8, "vCPUs of one sandbox"),
        NUMBER("max-memory-mib", cfg.max_memory_mib, 64, 16u * 1024 * 1024, 16384, "memory of one sandbox"),
        NUMBER("max-disk-mib", cfg.max_disk_mib, 64, 64u * 1024 * 1024, 65536, "disk of one sandbox"),
        NUMBER("max-file-mib", cfg.max_file_mib, 0, 1024u * 1024, 1024,
               "the largest file or archive one files call moves"),
        NUMBER("max-uploads-per-owner", cfg.max_uploads_per_owner, 1, UPLOADS_MAX, UPLOADS_PER_OWNER_DEFAULT,
               "uploads in parts one owner has in progress"),
        NUMBER("max-upload-mib-per-owner", cfg.max_upload_mib_per_owner, 1, UPLOADS_MAX_TOTAL_MIB,
               UPLOADS_PER_OWNER_MIB_DEFAULT, "the declared bytes of one owner's uploads in progress"),
        NUMBER("max-snapshot-mib-per-owner", cfg.max_snapshot_mib_per_owner, 1, SNAPSHOT_OWNER_MIB_MAX,
               SNAPSHOT_OWNER_MIB_DEFAULT, "the bytes one owner's snapshots hold in all (their sizeBytes)"),
        NUMBER("max-processes-per-owner", cfg.max_processes_per_owner, 1, PROC_OWNER_RUNNING_MAX,
               PROC_OWNER_RUNNING_DEFAULT, "processes one owner runs at once across its sandboxes on this host"),
        NUMBER("max-connections", cfg.max_connections, 1, 65536, 512,
               "HTTP connections the server holds at once; past it a whole head waits for room"),
        NUMBER("max-connections-per-peer", cfg.max_connections_per_peer, 1, 65536, 256,
               "HTTP connections at once from one peer address"),
        NUMBER("max-waiting-connections", cfg.max_waiting_connections, 1, 1048576, HTTP_MAX_WAITING_DEFAULT,
               "connections awaiting their first request's head, all peers; past it the oldest is closed"),
        NUMBER("http-head-timeout-seconds", cfg.http_head_timeout_s, 1, 600, HTTP_HEADER_TIMEOUT_S,
               "the time a connection has for a request's whole head, from its start or the answer before"),
        NUMBER("max-requests-per-owner", cfg.max_requests_per_owner, 1, 65536, HTTP_REQUESTS_PER_OWNER_DEFAULT,
               "requests one owner has in progress at once, streams and WebSockets included"),

        HEADING("Prices (micro-dollars) and trials"),
        NUMBER("price-vcpu-hour-micros", cfg.price_vcpu_hour_micros, 0, PRICE_MAX, 9375,
               "a running sandbox's vCPU-hour"),
        NUMBER("price-gib-hour-micros", cfg.price_gib_hour_micros, 0, PRICE_MAX, 3125,
               "a running sandbox's GiB-hour of memory"),
        NUMBER("price-disk-gib-hour-micros", cfg.price_disk_gib_hour_micros, 0, PRICE_MAX, 100,
               "a paused sandbox's disk, per GiB of diskMiB and hour"),
        NUMBER("idle-pause-min-seconds", cfg.idle_pause_min_seconds, 0, 86400, 60,
               "the shortest idlePauseSeconds; a shorter one is raised to it"),
        { .name = "trial-hours", .kind = OPTION_UINT, .arg = "N", FIELD(cfg.trial_allowance_seconds), .min = 0,
          .max = 100000, .def = KEYS_TRIAL_ALLOWANCE_SECONDS / 3600, .scale = 3600,
          .help = "free sandbox-hours per trial key" },
        NUMBER("max-trial-keys", cfg.max_trial_keys, 0, 100000, 100, "trial keys handed out on this host, 0: none"),

        HEADING("Egress"),
        LIST("egress-public-cidr", "CIDR", cfg.egress_public_cidrs, cfg.n_egress_public_cidrs,
             "treat addresses in CIDR as public upstreams, for a package gateway or proxy on a private or "
             "reserved address (repeatable; never loopback, link-local, metadata or this host's own addresses)"),
        STRING("egress-trust-ca", "FILE", cfg.egress_trust_ca, NULL,
               "trust the CA certificates in FILE (PEM) for upstream TLS and inside every sandbox"),
        { .name = "egress-workers", .kind = OPTION_UINT, .arg = "N", FIELD(cfg.egress_workers), .min = 1,
          .max = EGRESS_MAX_WORKERS, .def_text = "256",
          .help = "threads serving egress connections at once, each with one more for a tunnel" },
        { .name = "egress-workers-per-sandbox", .kind = OPTION_UINT, .arg = "N",
          FIELD(cfg.egress_workers_per_sandbox), .min = 1, .max = EGRESS_MAX_WORKERS, .def_text = "64",
          .help = "of those, at most N for one sandbox" },
        { .name = "egress-wait-timeout-ms", .kind = OPTION_UINT, .arg = "N", FIELD(egress_wait_timeout_ms),
          .min = EGRESS_MIN_WAIT_TIMEOUT_MS, .max = EGRESS_MAX_WAIT_TIMEOUT_MS, .def_text = "30000",
          .help = "a connection waiting for a worker longer than this is refused with a 503" },
        LIST("egress-test-upstream", "NAME=127.0.0.1:PORT", cfg.egress_test_upstreams, cfg.n_egress_test_upstreams,
             "TESTS ONLY: the egress proxy sends NAME to this loopback server, past the address checks "
             "(repeatable)"),
        STRING("egress-extra-ca", "FILE", cfg.egress_extra_ca, NULL,
               "TESTS ONLY: also trust FILE for upstream certificates"),

        HEADING("Other"),
        { .name = "log-level", .kind = OPTION_LOG_LEVEL, .arg = "error|warn|info|debug", FIELD(log_level),
          .def = LOG_INFO, .def_text = "info", .help = "the least serious event logged" },
        { .name = "doctor", .kind = OPTION_SWITCH, FIELD(doctor), .command_line_only = true,
          .help = "print what this host supports (with --json, as JSON) and exit" },
        { .name = "json", .kind = OPTION_SWITCH, FIELD(json), .command_line_only = true,
          .help = "with --doctor: JSON" },
        { .name = "help", .kind = OPTION_ACTION, .action = OPTIONS_HELP, .command_line_only = true,
          .help = "print this and exit" },
        { .name = "version", .kind = OPTION_ACTION, .action = OPTIONS_VERSION, .command_line_only = true,
          .help = "print the version and exit" },
        { .name = "help-man", .kind = OPTION_ACTION, .action = OPTIONS_HELP_MAN, .command_line_only = true,
          .help = "print the manual page runtimed(8) in roff and exit" },
        { .name = "help-man-conf", .kind = OPTION_ACTION, .action = OPTIONS_HELP_MAN_CONF,
          .command_line_only = true, .help = "print the manual page runtimed.conf(5) in roff and exit" },
};

_Static_assert(ELEMENTSOF(options) <= OPTIONS_MAX, "OPTIONS_MAX is too small for the table");

/* getopt_long's values for the table's rows: past every character. */
#define OPTION_VAL_BASE 256

static int fail(char *why, size_t why_len, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t why_len, int r, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
        return r;
}

static void *slot(DaemonOptions *o, const OptionSpec *s) {
        return (char *)o + s->offset;
}

/* String slots are char * in the options and const char * in the
 * DaemonConfig inside them; memcpy reads and writes either without a cast
 * through an incompatible pointer type. */
static char *string_get(DaemonOptions *o, size_t offset) {
        char *v;
        memcpy(&v, (char *)o + offset, sizeof v);
        return v;
}

static void string_put(DaemonOptions *o, size_t offset, char *v) {
        memcpy((char *)o + offset, &v, sizeof v);
}

static const OptionSpec *find(const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(options); i++)
                if (options[i].kind != OPTION_HEADING && strcmp(options[i].name, name) == 0)
                        return &options[i];
        return NULL;
}

static bool takes_value(const OptionSpec *s) {
        return s->kind != OPTION_SWITCH && s->kind != OPTION_ACTION;
}

static void number_put(DaemonOptions *o, const OptionSpec *s, unsigned long long v) {
        v *= s->scale ? s->scale : 1;
        if (s->size == sizeof(uint64_t)) {
                uint64_t w = v;
                memcpy(slot(o, s), &w, sizeof w);
        } else {
                unsigned w = (unsigned)v;
                memcpy(slot(o, s), &w, sizeof w);
        }
}

static int check_driver(const char *value, char *why, size_t why_len) {
        if (strcmp(value, "auto") == 0)
                return 0;
        return check_drivers(value, why, why_len);
}

/* Names this build's drivers, so that a typo is refused before the probes. */
static int check_drivers(const char *value, char *why, size_t why_len) {
        const char *p = value;
        do {
                size_t n = strcspn(p, ",");
                bool known = false;
                for (const Driver *const *d = driver_all(); *d && !known; d++)
                        known = strlen((*d)->name) == n && strncmp((*d)->name, p, n) == 0;
                if (!known && n > 0) {
                        char names[256] = "";
                        for (const Driver *const *d = driver_all(); *d; d++)
                                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                                         names[0] ? ", " : "", (*d)->name);
                        return fail(why, why_len, -EINVAL, "names no driver '%.*s' (this build has %s)",
                                    (int)(n > 64 ? 64 : n), p, names);
                }
                p += n;
        } while (*p++ == ',');
        return 0;
}

static int check_warm_pool(const char *value, char *why, size_t why_len) {
        WarmPoolSpec s;
        return warm_pool_spec_parse(value, &s, why, why_len);
}

/* Checks value for s and, when apply, stores it. The message in why follows
 * the option's name: "--max-vcpu wants ..." or "FILE:3: max-vcpu wants ...". */
static int option_set(DaemonOptions *o, const OptionSpec *s, const char *value, bool apply, char *why,
                      size_t why_len) {
        int r;
        switch (s->kind) {
        case OPTION_STRING: {
                if (s->check && (r = s->check(value, why, why_len)) < 0)
                        return r;
                if (!apply)
                        return 0;
                char *copy = strdup(value);
                if (!copy)
                        return fail(why, why_len, -ENOMEM, "out of memory");
                free(string_get(o, s->offset));
                string_put(o, s->offset, copy);
                return 0;
        }
        case OPTION_UINT: {
                char *end;
                errno = 0;
                unsigned long long v = strtoull(value, &end, 10);
                if (errno || end == value || *end || value[0] == '-' || v < s->min || v > s->max)
                        return fail(why, why_len, -EINVAL, "wants a number %llu..%llu, not '%.64s'", s->min, s->max,
                                    value);
                if (apply)
                        number_put(o, s, v);
                return 0;
        }
        case OPTION_LIST: {
                unsigned *n = (unsigned *)((char *)o + s->count_offset);
                if (s->check && (r = s->check(value, why, why_len)) < 0)
                        return r;
                if (!apply)
                        return 0;
                if (*n >= s->capacity)
                        return fail(why, why_len, -EINVAL, "is given more than %u times", s->capacity);
                char *copy = strdup(value);
                if (!copy)
                        return fail(why, why_len, -ENOMEM, "out of memory");
                string_put(o, s->offset + *n * sizeof(char *), copy);
                (*n)++;
                return 0;
        }
        case OPTION_LOG_LEVEL: {
                LogLevel l;
                if (log_parse_level(value, &l) < 0)
                        return fail(why, why_len, -EINVAL, "is error, warn, info or debug, not '%.64s'", value);
                if (apply)
                        memcpy(slot(o, s), &l, sizeof l);
                return 0;
        }
        case OPTION_SWITCH:
                if (apply)
                        *(bool *)slot(o, s) = true;
                return 0;
        case OPTION_ACTION:
                if (apply)
                        o->action = s->action;
                return 0;
        case OPTION_HEADING:
                break;
        }
        return fail(why, why_len, -EINVAL, "is not an option");
}

int options_init(DaemonOptions *o) {
        *o = (DaemonOptions){ .action = OPTIONS_RUN };
        for (size_t i = 0; i < ELEMENTSOF(options); i++) {
                const OptionSpec *s = &options[i];
                if (s->kind == OPTION_STRING && s->def_str) {
                        char *copy = strdup(s->def_str);
                        if (!copy)
                                return -ENOMEM;
                        string_put(o, s->offset, copy);
                } else if (s->kind == OPTION_UINT && s->def)
                        number_put(o, s, s->def);
                else if (s->kind == OPTION_LOG_LEVEL)
                        memcpy(slot(o, s), &(LogLevel){ (LogLevel)s->def }, sizeof(LogLevel));
        }
        return 0;
}

void options_done(DaemonOptions *o) {
        for (size_t i = 0; i < ELEMENTSOF(options); i++) {
                const OptionSpec *s = &options[i];
                if (s->kind == OPTION_STRING) {
                        free(string_get(o, s->offset));
                        string_put(o, s->offset, NULL);
                } else if (s->kind == OPTION_LIST) {
                        unsigned *n = (unsigned *)((char *)o + s->count_offset);
                        for (unsigned k = 0; k < *n; k++) {
                                free(string_get(o, s->offset + k * sizeof(char *)));
                                string_put(o, s->offset + k * sizeof(char *), NULL);
                        }
                        *n = 0;
                }
        }
}

static int parse_argv(DaemonOptions *o, int argc, char **argv, char *why, size_t why_len) {
        struct option longopts[ELEMENTSOF(options) + 1] = {};
        size_t k = 0;
        for (size_t i = 0; i < ELEMENTSOF(options); i++)
                if (options[i].kind != OPTION_HEADING)
                        longopts[k++] = (struct option){ options[i].name,
                                                         takes_value(&options[i]) ? required_argument : no_argument,
                                                         NULL, OPTION_VAL_BASE + (int)i };
        /* 0, not 1: glibc then starts afresh, for a second parse in one process. */
        optind = 0;
        opterr = 0;
        int c;
        while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
                if (c == 'h')
                        c = OPTION_VAL_BASE + (int)(find("help") - options);
                if (c == '?') {
                        if (optopt > 0 && optopt < OPTION_VAL_BASE)
                                return fail(why, why_len, -EINVAL, "unknown option '-%c'", optopt);
                        return fail(why, why_len, -EINVAL, "unknown or ambiguous option '%.128s'", argv[optind - 1]);
                }
                if (c == ':') {
                        if (optopt >= OPTION_VAL_BASE)
                                return fail(why, why_len, -EINVAL, "--%s wants a value",
                                            options[optopt - OPTION_VAL_BASE].name);
                        return fail(why, why_len, -EINVAL, "'%.128s' wants a value", argv[optind - 1]);
                }
                size_t i = (size_t)(c - OPTION_VAL_BASE);
                char msg[512];
                int r = option_set(o, &options[i], optarg, true, msg, sizeof msg);
                if (r < 0)
                        return fail(why, why_len, r, "--%s %s", options[i].name, msg);
                o->given[i] = true;
                if (o->action != OPTIONS_RUN)
                        return 0;
        }
        if (optind < argc)
                return fail(why, why_len, -EINVAL, "unexpected argument '%.128s'", argv[optind]);
        return 0;
}

int options_parse(DaemonOptions *o, int argc, char **argv, char *why, size_t why_len) {
        int r = parse_argv(o, argc, argv, why, why_len);
        if (r < 0 || o->action != OPTIONS_RUN || !o->config_path)
                return r;
        return options_load_file(o, o->config_path, why, why_len);
}

static bool blank(char c) {
        return c == ' ' || c == '\t' || c == '\r';
}

static char *trim(char *s) {
        while (blank(*s))
                s++;
        size_t n = strlen(s);
        while (n > 0 && blank(s[n - 1]))
                s[--n] = '\0';
        return s;
}

/* One line of a config file, without its newline. *set_on holds the line
 * each key was first set on, so that a setting given twice is refused. */
static int parse_line(DaemonOptions *o, char *line, unsigned lineno, unsigned *set_on, char *why,
                      size_t why_len) {
        /* A comment starts the line or follows a blank: a value may hold a
         * '#' of its own (a#b) but not " #". */
        for (char *p = line; *p; p++)
                if (*p == '#' && (p == line || blank(p[-1]))) {
                        *p = '\0';
                        break;
                }
        char *text = trim(line);
        if (!*text)
                return 0;
        char *eq = strchr(text, '=');
        if (!eq)
                return fail(why, why_len, -EINVAL, "'%.64s' is not `key = value`", text);
        *eq = '\0';
        char *key = trim(text), *value = trim(eq + 1);
        const OptionSpec *s = find(key);
        if (!s)
                return fail(why, why_len, -EINVAL, "unknown key '%.64s'", key);
        size_t i = (size_t)(s - options);
        if (s->command_line_only)
                return fail(why, why_len, -EINVAL, "%s is given on the command line only (--%s)", key, key);
        if (!*value)
                return fail(why, why_len, -EINVAL, "%s has no value", key);
        if (s->kind != OPTION_LIST && set_on[i])
                return fail(why, why_len, -EINVAL, "%s is set again (first on line %u)", key, set_on[i]);
        if (!set_on[i])
                set_on[i] = lineno;
        /* The command line wins; its values are checked all the same, so a
         * file that is wrong is wrong whatever the flags say. */
        char msg[512];
        int r = option_set(o, s, value, !o->given[i], msg, sizeof msg);
        if (r < 0)
                return fail(why, why_len, r, "%s %s", key, msg);
        return 0;
}

int options_load_file(DaemonOptions *o, const char *path, char *why, size_t why_len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return fail(why, why_len, -errno, "cannot read the config file %s: %s", path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) < 0)
                return fail(why, why_len, -errno, "cannot read the config file %s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return fail(why, why_len, -EINVAL, "the config file %s is not a regular file", path);
        _cleanup_fclose_ FILE *f = fdopen(fd, "r");
        if (!f)
                return fail(why, why_len, -errno, "cannot read the config file %s: %s", path, strerror(errno));
        TAKE_FD(fd);
        unsigned set_on[ELEMENTSOF(options)] = {};
        char line[OPTIONS_MAX_LINE + 1];
        for (unsigned lineno = 1;; lineno++) {
                size_t len = 0;
                int c;
                while ((c = getc(f)) != EOF && c != '\n') {
                        if (len == OPTIONS_MAX_LINE)
                                return fail(why, why_len, -EINVAL, "%s:%u: the line is longer than %u bytes", path,
                                            lineno, OPTIONS_MAX_LINE);
                        if (c == '\0')
                                return fail(why, why_len, -EINVAL, "%s:%u: the line holds a NUL byte", path,
                                            lineno);
                        line[len++] = (char)c;
                }
                if (ferror(f))
                        return fail(why, why_len, -EIO, "%s:%u: cannot read the config file", path, lineno);
                if (c == EOF && len == 0)
                        return 0;
                if (lineno > OPTIONS_MAX_LINES)
                        return fail(why, why_len, -EINVAL, "%s: more than %u lines", path, OPTIONS_MAX_LINES);
                line[len] = '\0';
                char msg[1024];
                int r = parse_line(o, line, lineno, set_on, msg, sizeof msg);
                if (r < 0)
                        return fail(why, why_len, r, "%s:%u: %s", path, lineno, msg);
                if (c == EOF)
                        return 0;
        }
}

/* Writes text from column `col` on, wrapped at word breaks to fit width,
 * continuation lines indented by indent. */
static void wrap(FILE *f, const char *text, int col, int indent, int width) {
        const char *p = text;
        while (*p) {
                size_t word = strcspn(p, " ");
                if (col > indent && col + 1 + (int)word > width) {
                        fprintf(f, "\n%*s", indent, "");
                        col = indent;
                } else if (col > indent) {
                        fputc(' ', f);
                        col++;
                }
                fprintf(f, "%.*s", (int)word, p);
                col += (int)word;
                p += word;
                while (*p == ' ')
                        p++;
        }
        fputc('\n', f);
}

void options_help(FILE *f) {
        enum { INDENT = 32, WIDTH = 100 };
        fputs("Usage: runtimed [OPTIONS]\n"
              "       runtimed --doctor [--json]\n\n"
              "Serves the Runtime HTTP API: sandboxes for running untrusted code. Every option but\n"
              "--config, --doctor, --json, --help and --version is also a key of the config file.\n",
              f);
        for (size_t i = 0; i < ELEMENTSOF(options); i++) {
                const OptionSpec *s = &options[i];
                if (s->kind == OPTION_HEADING) {
                        fprintf(f, "\n%s:\n", s->help);
                        continue;
                }
                int col = fprintf(f, "  --%s%s%s", s->name, s->arg ? " " : "", s->arg ? s->arg : "");
                if (col >= INDENT - 1) {
                        fprintf(f, "\n%*s", INDENT, "");
                        col = INDENT;
                } else {
                        col += fprintf(f, "%*s", INDENT - col, "");
                }
                char text[1024];
                int n = snprintf(text, sizeof text, "%s", s->help);
                if (s->def_text)
                        n += snprintf(text + n, sizeof text - n, " (default %s", s->def_text);
                else if (s->kind == OPTION_STRING && s->def_str)
                        n += snprintf(text + n, sizeof text - n, " (default %s", s->def_str);
                else if (s->kind == OPTION_UINT)
                        n += snprintf(text + n, sizeof text - n, " (default %llu", s->def);
                if (s->kind == OPTION_UINT)
                        n += snprintf(text + n, sizeof text - n, "; %llu..%llu)", s->min, s->max);
                else if (s->def_text || s->def_str)
                        snprintf(text + n, sizeof text - n, ")");
                wrap(f, text, col, INDENT, WIDTH);
        }
}

/* Text for roff: backslashes and hyphens escaped (a "-" is a hyphen to
 * groff, "\-" the minus an option is typed with), and a line never starts
 * with a control character. */
static void roff(FILE *f, const char *text) {
        if (*text == '.' || *text == '\'')
                fputs("\\&", f);
        for (const char *p = text; *p; p++) {
                if (*p == '\\')
                        fputs("\\e", f);
                else if (*p == '-')
                        fputs("\\-", f);
                else if (*p == '\n') {
                        fputc('\n', f);
                        if (p[1] == '.' || p[1] == '\'')
                                fputs("\\&", f);
                } else
                        fputc(*p, f);
        }
}

/* The help of one row, with its default and bounds, as --help says it. */
static void man_row_text(FILE *f, const OptionSpec *s) {
        roff(f, s->help);
        char text[512] = "";
        int n = 0;
        if (s->def_text)
                n = snprintf(text, sizeof text, " (default %s", s->def_text);
        else if (s->kind == OPTION_STRING && s->def_str)
                n = snprintf(text, sizeof text, " (default %s", s->def_str);
        else if (s->kind == OPTION_UINT)
                n = snprintf(text, sizeof text, " (default %llu", s->def);
        if (s->kind == OPTION_UINT)
                snprintf(text + n, sizeof text - n, "; %llu..%llu)", s->min, s->max);
        else if (n > 0)
                snprintf(text + n, sizeof text - n, ")");
        if (s->kind == OPTION_LIST && !strstr(s->help, "repeatable"))
                snprintf(text + strlen(text), sizeof text - strlen(text), " (repeatable)");
        roff(f, text);
        fputs(".\n", f);
}

static void man_options(FILE *f, OptionsManPage page) {
        const char *heading = NULL;
        for (size_t i = 0; i < ELEMENTSOF(options); i++) {
                const OptionSpec *s = &options[i];
                if (s->kind == OPTION_HEADING) {
                        heading = s->help;
                        continue;
                }
                if (page == OPTIONS_MAN_CONF && s->command_line_only)
                        continue;
                if (heading) {
                        fputs(".SS ", f);
                        roff(f, heading);
                        fputc('\n', f);
                        heading = NULL;
                }
                if (page == OPTIONS_MAN_DAEMON) {
                        fputs(".TP\n\\fB\\-\\-", f);
                        roff(f, s->name);
                        fputs("\\fR", f);
                } else {
                        fputs(".TP\n\\fB", f);
                        roff(f, s->name);
                        fputs("\\fR =", f);
                }
                if (s->arg) {
                        fputs(" \\fI", f);
                        roff(f, s->arg);
                        fputs("\\fR", f);
                }
                fputc('\n', f);
                man_row_text(f, s);
        }
}

void options_man(FILE *f, OptionsManPage page) {
        if (page == OPTIONS_MAN_DAEMON) {
                fprintf(f, ".TH RUNTIMED 8 \"\" \"runtime %s\" \"System Administration\"\n", RUNTIME_VERSION);
                fputs(".SH NAME\n"
                      "runtimed \\- the Runtime daemon: secure sandboxes for AI agents\n"
                      ".SH SYNOPSIS\n"
                      ".B runtimed\n"
                      "[\\fIOPTIONS\\fR]\n"
                      ".br\n"
                      ".B runtimed \\-\\-doctor\n"
                      "[\\fB\\-\\-json\\fR]\n"
                      ".SH DESCRIPTION\n"
                      ".B runtimed\n"
                      "serves the Runtime HTTP API: it creates sandboxes (throwaway Linux machines behind a\n"
                      "microVM, gVisor or namespace boundary), runs commands and file operations in them for\n"
                      "API clients, and enforces the guard rails around them: egress policy, leases, costs,\n"
                      "keys and secrets.\n"
                      ".PP\n"
                      "Every option but those marked as given on the command line only is also a key of the\n"
                      "configuration file that \\fB\\-\\-config\\fR names (see \\fBruntimed.conf\\fR(5));\n"
                      "an option on the command line wins over the file.\n"
                      ".PP\n"
                      "Started by systemd (\\fBType=notify\\fR), it reports readiness once its HTTP server\n"
                      "listens, pings the watchdog while \\fBGET /healthz\\fR answers, and reports stopping\n"
                      "on \\fBSIGTERM\\fR; logs go to standard error, which the journal keeps.\n"
                      ".SH OPTIONS\n",
                      f);
                man_options(f, page);
                fputs(".SH SIGNALS\n"
                      ".TP\n.B SIGTERM\\fR, \\fBSIGINT\n"
                      "stop: no new connection, every sandbox's supervisor told, the stores closed.\n"
                      ".SH ENVIRONMENT\n"
                      ".TP\n.B RUNTIME_STATE_DIR\n"
                      "the state directory when \\fB\\-\\-state\\-dir\\fR is not given.\n"
                      ".TP\n.B NOTIFY_SOCKET\\fR, \\fBWATCHDOG_USEC\n"
                      "set by systemd: readiness and watchdog notifications (\\fBsd_notify\\fR(3)).\n"
                      ".SH FILES\n"
                      ".TP\n.I /etc/runtime/runtimed.conf\n"
                      "the packaged service's configuration file.\n"
                      ".TP\n.I /var/lib/runtime\n"
                      "the state directory of a daemon run as root: the database, \\fIadmin.key\\fR,\n"
                      "images, layers and snapshots.\n"
                      ".TP\n.I /usr/libexec/runtime\n"
                      "the companion programs: runtime\\-agent, runtime\\-egress, runtime\\-image\\-build,\n"
                      "runtime\\-microvm\\-build.\n"
                      ".SH SEE ALSO\n"
                      "\\fBruntime\\fR(1), \\fBruntimed.conf\\fR(5), \\fBsystemd.service\\fR(5)\n",
                      f);
                return;
        }
        fprintf(f, ".TH RUNTIMED.CONF 5 \"\" \"runtime %s\" \"File Formats\"\n", RUNTIME_VERSION);
        fputs(".SH NAME\n"
              "runtimed.conf \\- the configuration file of runtimed\n"
              ".SH SYNOPSIS\n"
              ".I /etc/runtime/runtimed.conf\n"
              ".SH DESCRIPTION\n"
              "\\fBruntimed\\fR(8) reads the file its \\fB\\-\\-config\\fR option names; the packaged\n"
              "service passes \\fI/etc/runtime/runtimed.conf\\fR. Each line is\n"
              ".IP\n"
              ".I key\n"
              "=\n"
              ".I value\n"
              ".PP\n"
              "where \\fIkey\\fR is the name of one of runtimed's options without its dashes. Blanks\n"
              "around either are ignored; a \\fB#\\fR at the start of a line or after a blank starts a\n"
              "comment. A key may be set once, but for the repeatable ones, which are given on a line\n"
              "each. An unknown key, a value out of its bounds or a line longer than 4096 bytes stops\n"
              "the daemon's start with the file's name and the line's number. An option given on the\n"
              "command line wins over the file; the file's value is still checked.\n"
              ".SH KEYS\n",
              f);
        man_options(f, page);
        fputs(".SH EXAMPLE\n"
              ".nf\n"
              "# serve on every interface, at most 64 sandboxes\n"
              "listen = 0.0.0.0:7878\n"
              "max\\-sandboxes = 64\n"
              "egress\\-public\\-cidr = 203.0.113.80/32\n"
              ".fi\n"
              ".SH SEE ALSO\n"
              "\\fBruntimed\\fR(8), \\fBruntime\\fR(1)\n",
              f);
}
