/*
 * The microVM driver's operations: QEMU's `microvm` machine, one guest
 * kernel per sandbox (docs/microvm.md has the reasons for every choice, and
 * microvm.h the map of the files by concern).
 *
 * A start never builds anything of the image: the kernel, modules and ext4
 * root are made ahead by the image build (`runtime image build`, which runs
 * runtime-microvm-build after the root filesystem). A create on an image
 * without them fails at once and says how to make them.
 */
#include "driver/microvm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/timeutil.h"
#include "driver/launch.h"
#include "driver/microvm_disk.h"
#include "driver/microvm_guest.h"
#include "driver/microvm_initramfs.h"
#include "driver/microvm_kvm.h"
#include "driver/microvm_layers.h"
#include "driver/microvm_slots.h"
#include "driver/microvm_snapshot.h"
#include "driver/microvm_spawn.h"
#include "driver/microvm_template.h"
#include "driver/microvm_vmm.h"
#include "driver/rootfs.h"

/* A 4096-byte page of the guest's mke2fs input: the upper disk is at least
 * this big, whatever diskMiB says. */
#define MIN_DISK_MIB 16u
#define MAX_DISK_MIB (1024u * 1024u)

/* The image's name (the last part of image_dir), for messages to clients;
 * "the image" when it is not a plain name. */
static void image_name(const char *image_dir, char *buf, size_t len) {
        const char *slash = strrchr(image_dir, '/');
        const char *name = slash ? slash + 1 : image_dir;
        size_t n = strlen(name);
        if (n == 0 || n > 64 || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != n) {
                snprintf(buf, len, "the image");
                return;
        }
        snprintf(buf, len, "image %s", name);
}

/* Whether the image has every part a start needs, made from this build of
 * the image: root.stamp is "<built-at> <recipe>", and a rebuilt image needs a
 * new root.ext4 (a changed recipe is the builder's to notice). */
static bool image_parts_current(const char *image_dir) {
        char p[PATH_MAX], stamp[160], built[64];
        static const char *const parts[] = { "microvm/vmlinuz", "microvm/root.ext4", "microvm/modules" };
        for (size_t i = 0; i < ELEMENTSOF(parts); i++)
                if (path_join(p, sizeof(p), image_dir, parts[i]) < 0 || access(p, R_OK) < 0)
                        return false;
        if (path_join(p, sizeof(p), image_dir, "microvm/root.stamp") < 0 || io_read_text(p, stamp, sizeof(stamp)) < 0)
                return false;
        if (path_join(p, sizeof(p), image_dir, "built-at") < 0 || io_read_text(p, built, sizeof(built)) < 0)
                return true; /* an image without a stamp: the builder's own check decides */
        size_t l = strlen(built);
        return strncmp(stamp, built, l) == 0 && (stamp[l] == ' ' || stamp[l] == 0);
}

static int microvm_probe(char *why, size_t why_len) {
        if (!microvm_qemu_binary()) {
                if (why)
                        snprintf(why, why_len, "qemu-system-x86_64 not found (Debian: qemu-system-x86)");
                return -ENOENT;
        }
        if (!microvm_disk_tool_found()) {
                if (why)
                        snprintf(why, why_len, "mke2fs not found (Debian: e2fsprogs)");
                return -ENOENT;
        }
        char reason[256];
        char kernel[PATH_MAX];
        /* The default image's kernel, when it is built, makes the probe a
         * real boot; start() re-checks with each image's own kernel. */
        const char *k = NULL;
        const char *root = getenv("RUNTIME_IMAGE_DIR");
        if (snprintf(kernel, sizeof(kernel), "%s/default/microvm/vmlinuz", root ? root : "/var/cache/runtime/images") <
                    (int)sizeof(kernel) &&
            access(kernel, R_OK) == 0)
                k = kernel;
        MicrovmAccel accel = microvm_accel(k, reason, sizeof(reason));
        if (why)
                snprintf(why, why_len, "QEMU microvm, %s", reason);
        /* Under TCG it works, but far too slowly to be anybody's default:
         * offered when asked for by name only. */
        return accel == MICROVM_ACCEL_KVM ? 0 : 1;
}

static void remove_start_files(const char *sandbox_dir) {
        char p[PATH_MAX];
        /* A guest's slots are empty at its start, and gone at its stop. */
        microvm_slots_forget(sandbox_dir);
        if (path_join(p, sizeof(p), sandbox_dir, "initrd.cpio") == 0)
                unlink(p);
}

/* A cold boot on the sandbox's own disk (made when missing). */
/* The agent's list of the volumes (MICROVM_VOLUMES_FILE). */
static int volumes_list(const DriverSpec *spec, char *buf, size_t n) {
        size_t off = 0;
        buf[0] = '\0';
        for (size_t i = 0; i < spec->n_mounts; i++) {
                const DriverMount *m = &spec->mounts[i];
                if (strpbrk(m->dest, "\n") || m->dest[0] != '/')
                        return -EINVAL;
                int k = snprintf(buf + off, n - off, MICROVM_VOLUME_SERIAL "%zu %s %s\n", i,
                                 m->read_only ? "ro" : "rw", m->dest);
                if (k < 0 || (size_t)k >= n - off)
                        return -ENAMETOOLONG;
                off += (size_t)k;
        }
        return 0;
}

static int start_booted(const MicrovmStart *s, const char *p_upper, int *ret_fd, DriverInstance **ret,
                        DriverError *err) {
        const DriverSpec *spec = s->spec;
        int r = microvm_disk_make(p_upper, s->disk, s->log_fd);
        if (r < 0) {
                driver_error(err, r == -ENOSPC ? "the host is out of disk space for the sandbox's disk"
                                               : "the sandbox's disk could not be made");
                return r;
        }
        char p_initrd[PATH_MAX];
        if (path_join(p_initrd, sizeof(p_initrd), spec->sandbox_dir, "initrd.cpio") < 0)
                return -ENAMETOOLONG;
        char vols[DRIVER_MAX_MOUNTS * (PATH_MAX + 16)];
        if ((r = volumes_list(spec, vols, sizeof vols)) < 0)
                return r;
        r = microvm_initramfs_file(p_initrd, s->p_modules, spec->agent_path, spec->n_mounts ? vols : NULL);
        if (r < 0) {
                driver_error(err, "the sandbox's initramfs could not be written");
                return r;
        }
        _cleanup_close_ int initrd_fd = open(p_initrd, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (initrd_fd < 0)
                return -errno;
        r = microvm_vm_start(s, spec->id, initrd_fd, p_upper, -1, -1, ret_fd, ret);
        if (r < 0) {
                driver_error(err, "QEMU could not be started on this host; the daemon's log has the details");
                remove_start_files(spec->sandbox_dir);
        }
        return r;
}

/* The VM's shape from the spec, with the defaults and bounds a start gives
 * it; a take-over recomputes it to know the saved guest's key. */
static int vm_shape(const DriverSpec *spec, MicrovmStart *s) {
        int r = microvm_spec_check(spec);
        if (r < 0)
                return r;
        s->spec = spec;
        s->vcpu = spec->vcpu ? spec->vcpu : 1;
        s->mem = spec->memory_mib;
        s->disk = spec->disk_mib ? spec->disk_mib : 1024;
        s->pids = spec->pids_max;
        if (s->vcpu > MICROVM_MAX_VCPU || s->mem < MICROVM_MIN_MEMORY_MIB || s->disk > MAX_DISK_MIB)
                return -EINVAL;
        if (s->disk < MIN_DISK_MIB)
                s->disk = MIN_DISK_MIB;
        return 0;
}

/* The files of a VM: the sandbox's and the image's. */
typedef struct VmPaths {
        char log[PATH_MAX], console[PATH_MAX], upper[PATH_MAX], kernel[PATH_MAX], root[PATH_MAX], modules[PATH_MAX];
} VmPaths;

static int vm_paths(const DriverSpec *spec, VmPaths *p) {
        if (path_join(p->log, sizeof(p->log), spec->sandbox_dir, "vmm.log") < 0 ||
            path_join(p->console, sizeof(p->console), spec->sandbox_dir, "console.log") < 0 ||
            path_join(p->upper, sizeof(p->upper), spec->sandbox_dir, "upper.ext4") < 0 ||
            path_join(p->kernel, sizeof(p->kernel), microvm_boot_dir(spec), "microvm/vmlinuz") < 0 ||
            path_join(p->root, sizeof(p->root), microvm_boot_dir(spec), "microvm/root.ext4") < 0 ||
            path_join(p->modules, sizeof(p->modules), microvm_boot_dir(spec), "microvm/modules") < 0)
                return -ENAMETOOLONG;
        return 0;
}

static int microvm_start(const DriverSpec *spec, int *ret_fd, DriverInstance **ret, DriverError *err) {
        MicrovmStart s = { 0 };
        if (spec && spec->n_mounts > DRIVER_MAX_MOUNTS)
                return -E2BIG;
        int r = vm_shape(spec, &s);
        if (r < 0)
                return r;
        const char *qemu = microvm_qemu_binary();
        if (!qemu) {
                driver_error(err, "QEMU (qemu-system-x86_64) is not installed on this host");
                return -ENOENT;
        }

        char name[80], rootfs[PATH_MAX];
        image_name(spec->image_dir, name, sizeof(name));
        if (path_join(rootfs, sizeof(rootfs), spec->image_dir, "rootfs") < 0)
                return -ENAMETOOLONG;
        if (access(rootfs, F_OK) < 0) {
                driver_error(err, "%s is not built: build it with `runtime image build`", name);
                return -ENOENT;
        }
        /* Never built here: a builder may take minutes, far longer than a
         * create should wait, and it is the image build's job. */
        if (!image_parts_current(microvm_boot_dir(spec))) {
                image_name(microvm_boot_dir(spec), name, sizeof(name));
                driver_error(err,
                             "%s has no current microVM kernel and disk: build them with `runtime image build` "
                             "(it makes them whenever QEMU is installed)",
                             name);
                return -ENOENT;
        }
        if (mkdir(spec->sandbox_dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        microvm_slots_forget(spec->sandbox_dir);

        VmPaths p;
        if ((r = vm_paths(spec, &p)) < 0)
                return r;
        const char *p_upper = p.upper;

        /* QEMU's own messages and the start's: the daemon's log gets the
         * reason of a failure from here. Truncated at each start. */
        _cleanup_close_ int log_fd =
                open(p.log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (log_fd < 0)
                return -errno;
        s.qemu = qemu;
        s.accel = microvm_accel(p.kernel, NULL, 0);
        s.log_fd = log_fd;
        s.p_kernel = p.kernel;
        s.p_root = p.root;
        s.p_modules = p.modules;
        s.p_console = p.console;

        /* A copy of a memory snapshot resumes the saved guest once, on the
         * disk restore_disk made; it fails rather than boot in its place:
         * the processes asked for would not be there. */
        if (microvm_snapshot_pending(spec->sandbox_dir)) {
                char why[256] = "";
                uint64_t t0 = time_now_mono_ms();
                r = microvm_snapshot_start(&s, p_upper, ret_fd, ret, why, sizeof(why));
                if (r == 0) {
                        dprintf(log_fd, "runtimed: resumed from a memory snapshot in %llu ms\n",
                                (unsigned long long)(time_now_mono_ms() - t0));
                        return 0;
                }
                dprintf(log_fd, "runtimed: resuming the memory snapshot failed: %s\n", why[0] ? why : strerror(-r));
                driver_error(err, r == -ESTALE ? "the memory snapshot was taken with another QEMU, kernel, image or "
                                                 "shape than this host has now; take a new one"
                                               : "the memory snapshot could not be resumed; the daemon's log has the "
                                                 "details");
                return r;
        }
        /* The first start restores its shape's template; a stopped sandbox
         * starts again by booting on its own disk. */
        /* A template's guest has its devices fixed: a start with volumes
         * boots, its volumes being disks from the first (docs/microvm.md,
         * "Volumes", has the two ways measured). */
        s.volumes = spec->n_mounts > 0;
        if (!s.volumes && microvm_templates_enabled() && access(p_upper, F_OK) < 0 && errno == ENOENT) {
                char why[256] = "";
                uint64_t t0 = time_now_mono_ms();
                r = microvm_template_start(&s, p_upper, ret_fd, ret, why, sizeof(why));
                if (r == 0) {
                        dprintf(log_fd, "runtimed: restored from a template in %llu ms\n",
                                (unsigned long long)(time_now_mono_ms() - t0));
                        return 0;
                }
                dprintf(log_fd, "runtimed: no fast start (%s); booting\n", why[0] ? why : strerror(-r));
                unlink(p_upper);
        }
        return start_booted(&s, p_upper, ret_fd, ret, err);
}

static void microvm_stop(DriverInstance *inst, const char **ret_reason) {
        const char *reason = microvm_vm_stop(inst);
        if (inst)
                remove_start_files(microvm_vm_sandbox_dir(inst));
        microvm_vm_free(inst);
        if (ret_reason)
                *ret_reason = reason;
}

/* Live restore: a VM an earlier daemon started, from what its supervisor
 * kept (microvm_vm_handles). */
static int microvm_adopt(const DriverSpec *spec, const char *state, int *fds, size_t n, DriverInstance **ret) {
        MicrovmStart s = { 0 };
        MicrovmVmState st;
        VmPaths p;
        _cleanup_close_ int log_fd = -1;
        int r;
        if ((r = vm_shape(spec, &s)) == 0 && (r = vm_paths(spec, &p)) == 0 &&
            (r = microvm_vm_state_parse(state, &st)) == 0) {
                log_fd = open(p.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (log_fd < 0)
                        r = -errno;
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        if (fds[i] >= 0)
                                close(fds[i]);
                return r;
        }
        s.qemu = microvm_qemu_binary();
        s.accel = st.accel;
        s.log_fd = log_fd;
        s.p_kernel = p.kernel;
        s.p_root = p.root;
        s.p_modules = p.modules;
        s.p_console = p.console;
        /* Its guest can be saved (a memory snapshot records the key) only
         * while the files it was started from are the ones the key names
         * now: after an upgrade of QEMU, the kernel, the image or the agent
         * the running guest is not what the recomputed key would say. */
        char key[4096];
        bool same = st.has_key && s.qemu && microvm_saved_guest_key(&s, key, sizeof(key)) == 0 &&
                    fnv1a64_str(FNV1A64_INIT, key) == st.key_hash;
        uint64_t t0 = time_now_mono_ms();
        r = microvm_vm_adopt(&s, &st, p.upper, same ? key : NULL, fds, n, ret);
        if (r == 0)
                dprintf(log_fd, "runtimed: taken over by a new daemon in %llu ms%s\n",
                        (unsigned long long)(time_now_mono_ms() - t0), same ? "" : " (no memory snapshots of it)");
        else
                dprintf(log_fd, "runtimed: a new daemon could not take it over: %s\n", strerror(-r));
        return r;
}

static int microvm_destroy(const DriverSpec *spec) {
        int r = microvm_vmm_cgroup_kill(spec);
        if (r == -EINVAL)
                return r;
        if (spec->sandbox_dir && spec->sandbox_dir[0] == '/') {
                int q = path_remove_tree_at(AT_FDCWD, spec->sandbox_dir);
                if (q < 0 && r >= 0)
                        r = q;
        }
        return r < 0 && r != -ENOENT ? r : 0;
}

static int microvm_reap_orphan(const DriverSpec *spec) {
        int r = microvm_vmm_cgroup_kill(spec);
        if (r == -EINVAL)
                return r;
        if (spec->sandbox_dir) {
                remove_start_files(spec->sandbox_dir);
                /* A copy that never resumed its memory snapshot boots from
                 * its disk, as every sandbox after a daemon's restart. */
                microvm_snapshot_forget(spec->sandbox_dir);
        }
        return r < 0 && r != -ENOENT ? r : 0;
}

/* Disk snapshots: the VM is stopped (QMP stop, which drains its block
 * requests; the daemon had the guest sync first) while its own disk,
 * upper.ext4 (cache=none: every write QEMU made is in the file), is copied
 * sparse and the copy's journal replayed. A copy boots on a sparse copy of
 * it: a qcow2 overlay backed by the snapshot would share its blocks, but
 * the VM's drive is raw, passed in by descriptor. */
static int microvm_snapshot_disk(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir) {
        char from[PATH_MAX], to[PATH_MAX];
        if (!spec->sandbox_dir || path_join(from, sizeof(from), spec->sandbox_dir, "upper.ext4") < 0 ||
            path_join(to, sizeof(to), dest_dir, "upper.ext4") < 0)
                return -ENAMETOOLONG;
        if (inst && !microvm_vm_alive(inst))
                return -ESRCH;
        if (access(from, F_OK) < 0)
                return -errno;
        return rootfs_copy_image(from, to);
}

/* Memory snapshots: the daemon has stopped the VM with its agent's channel
 * empty; the guest and its disk are saved together (microvm_snapshot.c). */
static int microvm_snapshot_memory(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir) {
        if (!inst || !microvm_vm_alive(inst))
                return -ESRCH;
        char why[256] = "";
        int r = microvm_snapshot_save(inst, dest_dir, why, sizeof(why));
        char p_log[PATH_MAX];
        /* The reason goes where the start's do: the sandbox's vmm.log. */
        if (r < 0 && path_join(p_log, sizeof(p_log), spec->sandbox_dir, "vmm.log") == 0) {
                _cleanup_close_ int fd = open(p_log, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
                if (fd >= 0)
                        dprintf(fd, "runtimed: memory snapshot failed: %s\n", why[0] ? why : strerror(-r));
        }
        return r;
}

/* The disk of an image of another driver's layers: made the first time,
 * kept in the snapshot's directory for every later copy (microvm_layers.c).
 * Over a registry's tree (a spec with a boot image of its own), the tree is
 * copied beneath the layers as the whole root. */
static int layers_disk(const DriverSpec *spec, const char *snap_dir, bool *ret_made) {
        uid_t shift;
        int r = launch_image_owner(spec, &shift);
        if (r < 0)
                return r;
        char tree[PATH_MAX], boot_root[PATH_MAX], p[PATH_MAX], bytes[32] = "";
        MicrovmLayersBase base = { .tree = tree, .boot_root = boot_root };
        if (spec->boot_image_dir) {
                if (path_join(tree, sizeof(tree), spec->image_dir, "rootfs") < 0 ||
                    path_join(boot_root, sizeof(boot_root), spec->boot_image_dir, "microvm/root.ext4") < 0 ||
                    path_join(p, sizeof(p), spec->image_dir, "bytes") < 0)
                        return -ENAMETOOLONG;
                /* The pull's record of the tree's size (oci_pull.c). */
                if (io_read_text(p, bytes, sizeof(bytes)) == 0)
                        base.tree_bytes = strtoull(bytes, NULL, 10);
        }
        return microvm_layers_disk(snap_dir, spec->disk_mib ? spec->disk_mib : 1024, shift,
                                   spec->boot_image_dir ? &base : NULL, ret_made);
}

/* A copy boots on a sparse copy of the snapshot's upper.ext4. Another
 * driver's disk snapshot (an image built here: layer.img and bases/) has
 * none: layers_disk makes it. */
static int microvm_restore_disk(const DriverSpec *spec, const char *snap_dir) {
        char from[PATH_MAX], to[PATH_MAX], part[PATH_MAX];
        if (!spec->sandbox_dir || path_join(from, sizeof(from), snap_dir, "upper.ext4") < 0 ||
            path_join(to, sizeof(to), spec->sandbox_dir, "upper.ext4") < 0 ||
            path_join(part, sizeof(part), spec->sandbox_dir, "upper.ext4.part") < 0)
                return -ENAMETOOLONG;
        /* An image without current microVM parts (desktop) fails the start
         * in the words for it: no disk is worth making for it. */
        if (!image_parts_current(microvm_boot_dir(spec)))
                return 0;
        int r;
        bool made = false;
        if (access(from, F_OK) < 0 && errno == ENOENT && (r = layers_disk(spec, snap_dir, &made)) < 0)
                return r;
        if (mkdir(spec->sandbox_dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (access(to, F_OK) == 0)
                return -EEXIST;
        (void)unlink(part);
        r = rootfs_copy_sparse(from, part);
        if (r >= 0 && rename(part, to) < 0)
                r = -errno;
        if (r < 0)
                (void)unlink(part);
        if (r >= 0 && microvm_snapshot_has_memory(snap_dir)) {
                r = microvm_snapshot_link(snap_dir, spec->sandbox_dir);
                if (r < 0)
                        (void)unlink(to);
        }
        return r < 0 ? r : made ? DRIVER_DISK_CONVERTED : 0;
}

const Driver driver_microvm = {
        .name = "microvm",
        .volume_images = true,
        .probe = microvm_probe,
        .start = microvm_start,
        .stop = microvm_stop,
        .destroy = microvm_destroy,
        .reap_orphan = microvm_reap_orphan,
        .hello_timeout_ms = 120000,
        .heartbeat_timeout_ms = 90000,
        .console_log = "console.log",
        .stats = microvm_vm_stats,
        .alive = microvm_vm_alive,
        .pause = microvm_vm_pause,
        .resume = microvm_vm_resume,
        .snapshot_disk = microvm_snapshot_disk,
        .restore_disk = microvm_restore_disk,
        .snapshot_memory = microvm_snapshot_memory,
        .handles = microvm_vm_handles,
        .adopt = microvm_adopt,
        .release = microvm_vm_release,
        .mount_live = microvm_mount_live,
        .unmount_live = microvm_unmount_live,
        .live_bind_by_agent = true,
        .live_held = microvm_live_held,
};
