#pragma once
/* runtimed's options. One table (options.c) names each option, its argument,
 * its default, its help and where its value goes; the command line, a config
 * file (--config FILE) and --help all read it, so no setting exists in one
 * and not the others. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/log.h"
#include "daemon/manager/config.h"

/* A config file's line, and the file's lines, are bounded: the daemon reads
 * it as root before anything else runs. */
#define OPTIONS_MAX_LINE 4096u
#define OPTIONS_MAX_LINES 10000u
/* Room for the table's rows (options.c checks it at compile time). */
#define OPTIONS_MAX 128u

typedef enum OptionsAction {
        OPTIONS_RUN,     /* serve the API */
        OPTIONS_HELP,    /* --help: print options_help(), exit 0 */
        OPTIONS_VERSION, /* --version */
        OPTIONS_HELP_MAN,      /* --help-man: print options_man(.., OPTIONS_MAN_DAEMON), exit 0 */
        OPTIONS_HELP_MAN_CONF, /* --help-man-conf: the same for OPTIONS_MAN_CONF */
} OptionsAction;

typedef struct DaemonOptions {
        /* The settings the daemon's parts read. Its strings belong to the
         * options (options_done frees them); paths left NULL are resolved by
         * the wiring (daemon.c): the state directory, images, companions. */
        DaemonConfig cfg;
        char *driver;  /* "auto" or a driver's name */
        char *drivers; /* driver names, comma-separated; NULL: every driver whose probe passes */
        char *egress_proxy;
        char *advertise; /* the URL other hosts reach this one at; NULL: what it listens on */
        char *host_id;   /* NULL: the one kept in the state directory's host.id */
        unsigned host_dead_after_seconds; /* a host silent this long is declared dead */
        unsigned event_retention_days;    /* events older than this are dropped */
        unsigned audit_retention_days;    /* audit records older than this are dropped */
        unsigned sandbox_metrics_interval_seconds; /* how often a live sandbox is read */
        unsigned sandbox_metrics_retention_days;   /* readings older than this are dropped */
        unsigned otel_interval_seconds;            /* how often an OpenTelemetry export is pushed */
        const char *webhook_allow_cidrs[32]; /* ranges a webhook's receiver may be in although not public */
        unsigned n_webhook_allow_cidrs;
        unsigned webhook_retry_seconds; /* the wait after a delivery's first failed attempt */
        unsigned webhook_workers;       /* deliveries sent at once by this host */
        unsigned webhook_workers_per_owner; /* of them, one owner's at most; 0: half */
        char *fleet_secret_file;          /* the hosts' shared secret for forwarding; NULL: none */
        char *fleet_tls_dir;              /* the hop's TLS files; NULL: plain HTTP */
        char *fleet_listen;               /* ADDR:PORT of the hop's TLS listener */
        unsigned volume_max_mib;          /* one volume's size */
        unsigned volume_max_count;        /* volumes of one owner */
        unsigned volume_max_total_mib;    /* an owner's volumes together */
        unsigned volume_backup_sweep_seconds; /* the backups' sweep */
        unsigned volume_backup_day_seconds;   /* a day in backup policies (tests shorten it) */
        char *preview_listen;             /* ADDR:PORT of the preview listener; NULL: no previews */
        char *preview_domain;             /* previews are PORT-SANDBOX.DOMAIN */
        unsigned preview_public_port;     /* the port in preview URLs; 0: the listener's */
        bool preview_https;               /* preview URLs say https (TLS ends in front) */
        char *preview_tls_dir;            /* the preview listener's cert.pem and key.pem; NULL: plain */
        unsigned preview_relay_max;       /* connections relayed to or from one other host of a fleet */
        char *secrets_key_file;           /* the key egress secrets are sealed with; NULL: the state dir's */
        unsigned egress_wait_timeout_ms;                     /* 0: the egress service's default */
        int64_t heartbeat_interval_ms, heartbeat_timeout_ms; /* 0: the manager's defaults */
        LogLevel log_level;
        char *config_path;
        bool doctor, json;
        OptionsAction action;
        /* Which rows of the table the command line set: the config file
         * does not override them. */
        bool given[OPTIONS_MAX];
} DaemonOptions;

/* The table's defaults; -ENOMEM. options_done() afterwards either way. */
int options_init(DaemonOptions *o);
void options_done(DaemonOptions *o);

/* The command line, then the file --config names, whose keys the command
 * line's flags override. -EINVAL (or a negative errno of the file) with a
 * message in why, to be printed after "runtimed: ". On --help or --version,
 * parsing stops there and o->action says which. */
int options_parse(DaemonOptions *o, int argc, char **argv, char *why, size_t why_len);
/* A config file alone: "key = value" lines, "#" comments. Keys the command
 * line set are checked but not applied. */
int options_load_file(DaemonOptions *o, const char *path, char *why, size_t why_len);

/* --help: every option with its argument, default and bounds. */
void options_help(FILE *f);

/* The manual pages, in roff, from the same table: runtimed(8) (every
 * option) and runtimed.conf(5) (every key of the config file). The build
 * writes them with --help-man and --help-man-conf, so they never drift from
 * what the daemon accepts. */
typedef enum OptionsManPage {
        OPTIONS_MAN_DAEMON,
        OPTIONS_MAN_CONF,
} OptionsManPage;
void options_man(FILE *f, OptionsManPage page);
