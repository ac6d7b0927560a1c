#include "driver/microvm_slots.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "driver/microvm_vmm.h"

#define SLOTS_FILE "slots"
/* QEMU's fd set of slot j (QMP add-fd): far from the sets of a boot. */
#define SLOT_FDSET_BASE 100

typedef struct Slots {
        char name[MICROVM_SLOTS][DRIVER_LIVE_NAME_LEN + 1]; /* "" when free */
} Slots;

static int slots_read(const char *sandbox_dir, Slots *s) {
        memset(s, 0, sizeof *s);
        char p[PATH_MAX], text[MICROVM_SLOTS * 32 + 1];
        if (snprintf(p, sizeof p, "%s/" SLOTS_FILE, sandbox_dir) >= (int)sizeof p)
                return -ENAMETOOLONG;
        int r = io_read_text(p, text, sizeof text);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return r;
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                unsigned j;
                char name[DRIVER_LIVE_NAME_LEN + 1];
                if (sscanf(line, "%u %16[0-9a-f]", &j, name) != 2 || j >= MICROVM_SLOTS ||
                    strlen(name) != DRIVER_LIVE_NAME_LEN)
                        return -EBADMSG;
                memcpy(s->name[j], name, sizeof name);
        }
        return 0;
}

/* The record replaced whole (a new file renamed over it), synced. */
static int slots_write(const char *sandbox_dir, const Slots *s) {
        char text[MICROVM_SLOTS * 32 + 1] = "";
        size_t off = 0;
        for (unsigned j = 0; j < MICROVM_SLOTS; j++)
                if (s->name[j][0])
                        off += (size_t)snprintf(text + off, sizeof text - off, "%u %s\n", j, s->name[j]);
        _cleanup_close_ int dfd = open(sandbox_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        (void)unlinkat(dfd, SLOTS_FILE ".new", 0);
        int r = io_write_text_at(dfd, SLOTS_FILE ".new", text, true, 0600);
        if (r == 0 && renameat(dfd, SLOTS_FILE ".new", dfd, SLOTS_FILE) < 0)
                r = -errno;
        return r;
}

void microvm_slots_forget(const char *sandbox_dir) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/" SLOTS_FILE, sandbox_dir) < (int)sizeof p)
                (void)unlink(p);
}

/* One command built by jansson (every name in it is ours, but the form is
 * the library's), on the VM's monitor; a failure's reason, named by
 * "what", goes to the sandbox's vmm.log unless quiet. */
static int qmp(DriverInstance *inst, json_t *cmd, int pass_fd, const char *what, bool quiet, char *why,
               size_t why_len) {
        if (!cmd)
                return -ENOMEM;
        char *text = json_dumps(cmd, JSON_COMPACT);
        json_decref(cmd);
        size_t n = text ? strlen(text) : 0;
        char *line = text ? realloc(text, n + 2) : NULL;
        if (!line) {
                free(text);
                return -ENOMEM;
        }
        memcpy(line + n, "\n", 2);
        int r = microvm_vm_qmp(inst, line, pass_fd, why, why_len);
        free(line);
        if (r < 0 && !quiet) {
                char p[PATH_MAX];
                _cleanup_close_ int fd = -1;
                if (snprintf(p, sizeof p, "%s/vmm.log", microvm_vm_sandbox_dir(inst)) < (int)sizeof p)
                        fd = open(p, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
                if (fd >= 0)
                        dprintf(fd, "runtimed: a volume's disk slot: %s: %s\n", what, why[0] ? why : strerror(-r));
        }
        return r;
}

static int add_fd(DriverInstance *inst, unsigned j, int fd, char *why, size_t why_len) {
        return qmp(inst, json_pack("{s:s,s:{s:i}}", "execute", "add-fd", "arguments", "fdset-id", SLOT_FDSET_BASE + (int)j),
                   fd, "add-fd", false, why, why_len);
}

/* Slot j back to its null medium, the image's node and fds closed. Each
 * step whatever the one before said: a crash half-way through an attach
 * leaves any of them undone. */
static void slot_empty(DriverInstance *inst, unsigned j, bool quiet) {
        char node[32], file[32], null[32], why[256] = "";
        snprintf(node, sizeof node, "slot%u", j);
        snprintf(file, sizeof file, "slotfile%u", j);
        snprintf(null, sizeof null, "slotnull%u", j);
        bool ro = j >= MICROVM_SLOTS_RW;
        (void)qmp(inst,
                  json_pack("{s:s,s:{s:[{s:s,s:s,s:s,s:b}]}}", "execute", "blockdev-reopen", "arguments", "options",
                            "driver", "raw", "node-name", node, "file", null, "read-only", ro),
                  -1, "the slot's null medium back", quiet, why, sizeof why);
        (void)qmp(inst, json_pack("{s:s,s:{s:s}}", "execute", "blockdev-del", "arguments", "node-name", file), -1,
                  "blockdev-del", quiet, why, sizeof why);
        (void)qmp(inst,
                  json_pack("{s:s,s:{s:i}}", "execute", "remove-fd", "arguments", "fdset-id",
                            SLOT_FDSET_BASE + (int)j),
                  -1, "remove-fd", quiet, why, sizeof why);
}

int microvm_mount_live(DriverInstance *inst, const DriverSpec *spec, const DriverMount *m,
                       char name[DRIVER_LIVE_NAME_LEN + 1]) {
        if (!inst || !microvm_vm_alive(inst))
                return -ESRCH;
        if (m->image_fd < 0)
                return -EBADF;
        char want[DRIVER_LIVE_NAME_LEN + 1];
        driver_live_name(m->dest, want);
        Slots s;
        int r = slots_read(spec->sandbox_dir, &s);
        if (r < 0)
                return r;
        unsigned first = m->read_only ? MICROVM_SLOTS_RW : 0, j = MICROVM_SLOTS;
        for (unsigned k = 0; k < MICROVM_SLOTS; k++) {
                if (strcmp(s.name[k], want) == 0)
                        return -EBUSY;
                if (j == MICROVM_SLOTS && k >= first && k < first + MICROVM_SLOTS_RW && !s.name[k][0])
                        j = k;
        }
        if (j == MICROVM_SLOTS)
                return -ENOSPC;
        /* Recorded first: a daemon that dies in the middle leaves a slot
         * that a detach empties. */
        memcpy(s.name[j], want, sizeof want);
        if ((r = slots_write(spec->sandbox_dir, &s)) < 0)
                return r;

        char why[256] = "", node[32], file[32], set[32];
        snprintf(node, sizeof node, "slot%u", j);
        snprintf(file, sizeof file, "slotfile%u", j);
        snprintf(set, sizeof set, "/dev/fdset/%d", SLOT_FDSET_BASE + (int)j);
        /* The held descriptor (its lock goes with QEMU's copy) and, for a
         * writable one, a read-only one for the block layer's probes, as at
         * a boot. */
        r = add_fd(inst, j, m->image_fd, why, sizeof why);
        if (r == 0 && !m->read_only) {
                char p[64];
                snprintf(p, sizeof p, "/proc/self/fd/%d", m->image_fd);
                _cleanup_close_ int ro_fd = open(p, O_RDONLY | O_CLOEXEC | O_DIRECT);
                r = ro_fd < 0 ? -errno : add_fd(inst, j, ro_fd, why, sizeof why);
        }
        if (r == 0)
                r = qmp(inst,
                        json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:{s:b},s:s,s:b}}", "execute", "blockdev-add", "arguments",
                                  "driver", "file", "node-name", file, "filename", set, "aio", "threads", "cache",
                                  "direct", true, "locking", "off", "read-only", m->read_only),
                        -1, "blockdev-add", false, why, sizeof why);
        if (r == 0) {
                r = qmp(inst,
                        json_pack("{s:s,s:{s:[{s:s,s:s,s:s,s:b}]}}", "execute", "blockdev-reopen", "arguments",
                                  "options", "driver", "raw", "node-name", node, "file", file, "read-only",
                                  m->read_only),
                        -1, "blockdev-reopen", false, why, sizeof why);
                /* A guest started before the slots existed has no such node. */
                if (r < 0 && strstr(why, node))
                        r = -ENOSYS;
        }
        if (r < 0) {
                slot_empty(inst, j, true);
                s.name[j][0] = 0;
                (void)slots_write(spec->sandbox_dir, &s);
                return r == -ENOSYS || r == -ENOMEM ? r : -EIO;
        }
        snprintf(name, DRIVER_LIVE_NAME_LEN + 1, MICROVM_SLOT_SERIAL_FMT, j);
        return 0;
}

/* The slot that holds dest (its index), -ENOENT when none does; s gets
 * the record. */
static int slot_of(const DriverSpec *spec, const char *dest, Slots *s) {
        char want[DRIVER_LIVE_NAME_LEN + 1];
        driver_live_name(dest, want);
        int r = slots_read(spec->sandbox_dir, s);
        if (r < 0)
                return r;
        for (unsigned j = 0; j < MICROVM_SLOTS; j++)
                if (strcmp(s->name[j], want) == 0)
                        return (int)j;
        return -ENOENT;
}

int microvm_unmount_live(DriverInstance *inst, const DriverSpec *spec, const char *dest) {
        if (!inst || !microvm_vm_alive(inst))
                return -ESRCH;
        Slots s;
        int j = slot_of(spec, dest, &s);
        if (j < 0)
                return j == -ENOENT ? -EINVAL : j;
        slot_empty(inst, (unsigned)j, false);
        s.name[j][0] = 0;
        return slots_write(spec->sandbox_dir, &s);
}

int microvm_live_held(DriverInstance *inst, const DriverSpec *spec, const char *dest) {
        Slots s;
        int j = slot_of(spec, dest, &s);
        return j >= 0 ? 1 : j == -ENOENT ? 0 : j;
}
