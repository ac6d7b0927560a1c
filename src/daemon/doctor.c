#include "daemon/doctor.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "driver/driver.h"
#include "driver/gvisor.h"

static const char *cgroup_layout(void) {
        struct statfs fs;
        if (statfs("/sys/fs/cgroup", &fs) < 0)
                return "none";
        if (fs.f_type == CGROUP2_SUPER_MAGIC)
                return "v2";
        if (statfs("/sys/fs/cgroup/unified", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC)
                return "hybrid";
        return "v1";
}

static long read_long(const char *path) {
        FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        long v = -1;
        if (fscanf(f, "%ld", &v) != 1)
                v = -1;
        fclose(f);
        return v;
}

/* Unprivileged user namespaces: Debian's sysctl, then the generic limit. */
static bool userns_enabled(char *why, size_t n) {
        long clone = read_long("/proc/sys/kernel/unprivileged_userns_clone");
        long max = read_long("/proc/sys/user/max_user_namespaces");
        if (clone == 0) {
                snprintf(why, n, "kernel.unprivileged_userns_clone = 0");
                return false;
        }
        if (max == 0) {
                snprintf(why, n, "user.max_user_namespaces = 0");
                return false;
        }
        snprintf(why, n, "max_user_namespaces = %ld", max);
        return true;
}

/* The first line a tool prints for --version, or NULL. Fixed commands only. */
static char *tool_version(const char *cmd) {
        FILE *p = popen(cmd, "re");
        if (!p)
                return NULL;
        char line[256] = "";
        char *got = fgets(line, sizeof(line), p);
        pclose(p);
        if (!got || !line[0])
                return NULL;
        line[strcspn(line, "\n")] = '\0';
        return strdup(line);
}

static const char *fs_name(const char *dir) {
        struct statfs fs;
        if (statfs(dir, &fs) < 0)
                return "an unknown filesystem";
        switch ((unsigned long)fs.f_type) {
        case XFS_SUPER_MAGIC:
                return "xfs";
        case BTRFS_SUPER_MAGIC:
                return "btrfs";
        case EXT4_SUPER_MAGIC:
                return "ext4";
        case TMPFS_MAGIC:
                return "tmpfs";
        case OVERLAYFS_SUPER_MAGIC:
                return "overlayfs";
        default:
                return "another filesystem";
        }
}

bool doctor_layer_copies(const char *state_dir, char *why, size_t why_len) {
        int r = io_clone_probe(state_dir);
        if (r == 0) {
                snprintf(why, why_len, "shared blocks (FICLONE on the %s of %s): a snapshot or fork copies no data",
                         fs_name(state_dir), state_dir);
                return true;
        }
        if (r == -ENOENT)
                snprintf(why, why_len, "unknown: %s does not exist yet", state_dir);
        else
                snprintf(why, why_len,
                         "sparse copies (the %s of %s refuses FICLONE: %s): a snapshot copies every written block; "
                         "scripts/layer-pool.sh makes a pool that shares them",
                         fs_name(state_dir), state_dir, strerror(-r));
        return false;
}

int doctor_run(bool json, const char *state_dir) {
        json_t *drivers = json_array();
        for (const Driver *const *d = driver_all(); *d; d++) {
                char why[512] = "";
                int r = (*d)->probe(why, sizeof(why));
                json_array_append_new(drivers, json_pack("{s:s,s:b,s:b,s:s}", "name", (*d)->name, "available", r >= 0,
                                                         "auto", r == 0, "reason", why));
        }
        char auto_why[1024] = "";
        const Driver *pick = driver_pick_auto(auto_why, sizeof(auto_why));
        char userns_why[128];
        bool userns = userns_enabled(userns_why, sizeof(userns_why));
        bool kvm = access("/dev/kvm", F_OK) == 0;
        /* The runsc the gvisor driver runs, not the first on PATH. */
        const char *runsc_path = NULL, *runsc_version = NULL, *runsc_platform = NULL;
        char *runsc = NULL;
        if (gvisor_runsc_info(&runsc_path, &runsc_version, &runsc_platform) == 0 &&
            asprintf(&runsc, "%s at %s, %s platform", runsc_version, runsc_path, runsc_platform) < 0)
                runsc = NULL;
        char *bwrap = tool_version("bwrap --version 2>/dev/null");
        char layer_why[PATH_MAX + 256] = "";
        bool reflink = state_dir && doctor_layer_copies(state_dir, layer_why, sizeof layer_why);
        _cleanup_json_ json_t *out = json_pack(
                "{s:s,s:o,s:{s:s?,s:s},s:s,s:{s:b,s:s},s:{s:b,s:s},s:s?,s:{s:s?,s:s?,s:s?},s:s?,s:{s:b,s:s}}", "version",
                RUNTIME_VERSION, "drivers", drivers, "auto", "driver", pick ? pick->name : NULL, "why", auto_why, "cgroups", cgroup_layout(),
                "userNamespaces", "enabled", userns, "detail", userns_why, "kvm", "present", kvm, "detail",
                kvm ? "/dev/kvm exists (whether KVM boots a guest is the microvm probe's answer)" : "/dev/kvm is missing",
                "runsc", runsc, "gvisor", "runsc", runsc_path, "version", runsc_version, "platform", runsc_platform,
                "bwrap", bwrap, "layerCopies", "reflink", reflink, "detail", layer_why);
        free(runsc);
        free(bwrap);
        if (!out)
                return 1;
        if (json) {
                json_dumpf(out, stdout, JSON_INDENT(2));
                putchar('\n');
                return 0;
        }
        printf("runtimed %s\n\ndrivers:\n", RUNTIME_VERSION);
        size_t i;
        json_t *d;
        json_array_foreach(json_object_get(out, "drivers"), i, d)
                printf("  %-10s %-4s %s\n", json_string_value(json_object_get(d, "name")),
                       json_is_true(json_object_get(d, "available")) ? "yes" : "no",
                       json_string_value(json_object_get(d, "reason")));
        printf("\nauto picks: %s\n  %s\n", pick ? pick->name : "(none)", auto_why);
        printf("\ncgroups:          %s\n", cgroup_layout());
        printf("user namespaces:  %s (%s)\n", userns ? "enabled" : "disabled", userns_why);
        printf("/dev/kvm:         %s\n", kvm ? "present" : "missing");
        const char *rv = json_string_value(json_object_get(out, "runsc"));
        const char *bv = json_string_value(json_object_get(out, "bwrap"));
        printf("runsc:            %s\n", rv ? rv : "none usable (see the gvisor driver above)");
        printf("bwrap:            %s\n", bv ? bv : "not found");
        printf("layer copies:     %s\n", layer_why);
        return 0;
}
