/* runtimed: the Runtime daemon. Reads its options (daemon/options.c: the
 * command line and a config file), then hands over to the wiring
 * (daemon/daemon.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/journal.h"
#include "common/macro.h"
#include "daemon/daemon.h"
#include "daemon/doctor.h"
#include "daemon/options.h"

static void options_donep(DaemonOptions *o) {
        options_done(o);
}

int main(int argc, char **argv) {
        _cleanup_(options_donep) DaemonOptions opts = {};
        char why[2048];
        int r = options_init(&opts);
        if (r < 0) {
                fprintf(stderr, "runtimed: out of memory\n");
                return 1;
        }
        if ((r = options_parse(&opts, argc, argv, why, sizeof why)) < 0) {
                fprintf(stderr, "runtimed: %s\n", why);
                return 2;
        }
        switch (opts.action) {
        case OPTIONS_HELP:
                options_help(stdout);
                return 0;
        case OPTIONS_HELP_MAN:
                options_man(stdout, OPTIONS_MAN_DAEMON);
                return 0;
        case OPTIONS_HELP_MAN_CONF:
                options_man(stdout, OPTIONS_MAN_CONF);
                return 0;
        case OPTIONS_VERSION:
                printf("runtimed %s\n", RUNTIME_VERSION);
                return 0;
        case OPTIONS_RUN:
                break;
        }
        log_set_level(opts.log_level);
        (void)journal_log_setup();
        if (opts.doctor) {
                _cleanup_free_ char *dir =
                        opts.cfg.state_dir ? strdup(opts.cfg.state_dir) : daemon_default_state_dir();
                return doctor_run(opts.json, dir);
        }
        return daemon_run(&opts);
}
