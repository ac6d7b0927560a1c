/* A volume attached to a running gVisor sandbox, the host's half
 * (docs/volumes.md, "Attaching to a running sandbox"). runsc cannot add a
 * mount to a running sandbox, but it serves LAUNCH_STAGE_LIVE, a directory
 * of the launcher's mount namespace with shared propagation, at
 * /.runtime/live inside with shared file access: a volume bound under it
 * later reaches the gofer and shows there. The agent's helper then binds it
 * at the path asked for (agent/live_mounts.h), and hides /.runtime/live from
 * everything else in the sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/cgroup.h"
#include "driver/driver.h"
#include "driver/gvisor.h"
#include "driver/launch.h"

/* A process of the sandbox's cgroup in runsc's launcher's mount namespace
 * (not the daemon's, with LAUNCH_STAGE_LIVE in it): runsc itself. -ESRCH
 * when there is none (the sandbox ended, or was started before live
 * attaches existed). */
static int launcher_pid(const DriverSpec *spec, pid_t *ret) {
        Cgroup *cg = NULL;
        int r = launch_cgroup(spec, false, &cg);
        if (r < 0)
                return r == -ENOENT ? -ESRCH : r;
        const char *dir = NULL;
        for (int h = 0; h < _CGROUP_HIER_MAX && !dir; h++)
                dir = cgroup_dir(cg, (CgroupHier)h);
        char path[PATH_MAX];
        FILE *f = dir && snprintf(path, sizeof path, "%s/cgroup.procs", dir) < (int)sizeof path ? fopen(path, "re")
                                                                                               : NULL;
        cgroup_free(cg);
        if (!f)
                return -ESRCH;
        struct stat self, ns, st;
        r = stat("/proc/self/ns/mnt", &self) < 0 ? -EIO : -ESRCH;
        long pid;
        while (r == -ESRCH && fscanf(f, "%ld", &pid) == 1) {
                char p[96];
                snprintf(p, sizeof p, "/proc/%ld/ns/mnt", pid);
                if (stat(p, &ns) < 0 || ns.st_ino == self.st_ino)
                        continue;
                snprintf(p, sizeof p, "/proc/%ld/root" LAUNCH_STAGE_LIVE, pid);
                if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
                        *ret = (pid_t)pid;
                        r = 0;
                }
        }
        fclose(f);
        return r;
}

/* in_launcher's tree for "is it there". */
#define LIVE_PROBE (-2)

typedef struct LauncherStep {
        char at[PATH_MAX];
        int tree;
} LauncherStep;

/* In the launcher's mount namespace (launch_in_mount_ns): the step
 * in_launcher describes. */
static int launcher_step(void *arg) {
        const LauncherStep *l = arg;
        if (l->tree == LIVE_PROBE)
                return access(l->at, F_OK) < 0 ? errno : 0;
        if (l->tree >= 0) {
                if (mkdir(l->at, 0755) < 0 && errno != EEXIST)
                        return errno;
                return syscall(SYS_move_mount, l->tree, "", AT_FDCWD, l->at, MOVE_MOUNT_F_EMPTY_PATH) < 0 ? errno : 0;
        }
        /* Never lazily: a file of the volume still open through the gofer
         * (EBUSY) keeps the volume in this sandbox. */
        if (umount2(l->at, UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT)
                return errno;
        (void)rmdir(l->at);
        return 0;
}

/* In runsc's launcher's mount namespace: tree (a detached mount) moved to
 * LAUNCH_STAGE_LIVE/name, or, with tree -1, that mount taken away, or with
 * LIVE_PROBE, 0 when it is there (-ENOENT when not). */
static int in_launcher(const DriverSpec *spec, const char *name, int tree) {
        pid_t pid;
        int r = launcher_pid(spec, &pid);
        if (r < 0)
                return r;
        LauncherStep l = { .tree = tree };
        snprintf(l.at, sizeof l.at, LAUNCH_STAGE_LIVE "/%s", name);
        return launch_in_mount_ns(pid, launcher_step, &l);
}

int gvisor_mount_live(DriverInstance *inst, const DriverSpec *spec, const DriverMount *m,
                      char name[DRIVER_LIVE_NAME_LEN + 1]) {
        (void)inst;
        uid_t shift;
        int r = launch_image_owner(spec, &shift);
        if (r < 0)
                return r;
        driver_live_name(m->dest, name);
        uid_t owner = shift + LAUNCH_SANDBOX_UID;
        /* The root of the volume is the sandbox user's, as at a start. */
        if (chown(m->source, owner, owner) < 0)
                return -errno;
        _cleanup_close_ int tree = (int)syscall(SYS_open_tree, AT_FDCWD, m->source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree < 0)
                return -errno;
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                               (m->read_only ? MOUNT_ATTR_RDONLY : 0) };
        if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
                return -errno;
        return in_launcher(spec, name, tree);
}

int gvisor_unmount_live(DriverInstance *inst, const DriverSpec *spec, const char *dest) {
        (void)inst;
        char name[DRIVER_LIVE_NAME_LEN + 1];
        driver_live_name(dest, name);
        return in_launcher(spec, name, -1);
}

int gvisor_live_held(DriverInstance *inst, const DriverSpec *spec, const char *dest) {
        (void)inst;
        char name[DRIVER_LIVE_NAME_LEN + 1];
        driver_live_name(dest, name);
        int r = in_launcher(spec, name, LIVE_PROBE);
        return r == 0 ? 1 : r == -ENOENT ? 0 : r;
}
