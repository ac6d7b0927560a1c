#include "driver/microvm_kvm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/launch.h"
#include "driver/microvm_spawn.h"


/* The kernel probe: a guest kernel gets this long under KVM to boot and
 * panic for want of a root (which, with panic=-1 and -no-reboot, ends QEMU).
 * A working KVM needs well under a second. */
#define PROBE_KERNEL_MS 4000
#define PROBE_FIRMWARE_MS 2000

typedef enum AccelState {
        ACCEL_UNKNOWN,
        ACCEL_KVM_FIRMWARE, /* KVM ran the firmware blob; no kernel tried yet */
        ACCEL_KVM,
        ACCEL_TCG,
} AccelState;

static pthread_mutex_t accel_lock = PTHREAD_MUTEX_INITIALIZER;
static AccelState accel_state = ACCEL_UNKNOWN;
static char accel_why[256];

/* 64 KiB of firmware: at the reset vector, write 0x21 to the isa-debug-exit
 * port (QEMU exits with status 0x43) and halt. */
static int write_probe_firmware(int fd) {
        _cleanup_free_ uint8_t *fw = malloc(65536);
        if (!fw)
                return -ENOMEM;
        memset(fw, 0xf4, 65536); /* hlt */
        static const uint8_t code[] = { 0xb0, 0x21, 0xe6, 0xf4, 0xf4, 0xeb, 0xfe };
        memcpy(fw + 0xfff0, code, sizeof(code));
        for (size_t off = 0; off < 65536;) {
                ssize_t w = write(fd, fw + off, 65536 - off);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return -EIO;
                off += (size_t)w;
        }
        return 0;
}

gid_t microvm_kvm_group(void) {
        struct stat st;
        if (stat("/dev/kvm", &st) < 0 || (st.st_mode & 0060) != 0060)
                return (gid_t)-1;
        return st.st_gid;
}

/* Runs QEMU under KVM as the unprivileged VMM user with a deadline: the
 * firmware blob (kernel NULL) or the kernel with no root, which panics and,
 * with panic=-1 and -no-reboot, ends QEMU with status 0. 0 when the guest
 * got to its end; else -errno and a reason in why. */
static int kvm_try(const char *kernel, char *why, size_t why_len) {
        const char *qemu = microvm_qemu_binary();
        if (!qemu) {
                snprintf(why, why_len, "qemu-system-x86_64 not found");
                return -ENOENT;
        }
        _cleanup_close_ int log_fd = memfd_create("microvm-probe-log", MFD_CLOEXEC);
        _cleanup_close_ int img_fd = -1;
        if (log_fd < 0)
                return -errno;
        if (kernel) {
                img_fd = open(kernel, O_RDONLY | O_CLOEXEC);
        } else {
                img_fd = memfd_create("microvm-probe-fw", MFD_CLOEXEC);
                if (img_fd >= 0 && write_probe_firmware(img_fd) < 0)
                        return -EIO;
        }
        if (img_fd < 0)
                return -errno;
        char img_path[64];
        snprintf(img_path, sizeof(img_path), "/proc/self/fd/%d", img_fd);
        char *argv[40];
        size_t n = 0;
        argv[n++] = (char *)qemu;
        argv[n++] = "-M";
        argv[n++] = "microvm,accel=kvm,x-option-roms=off,rtc=off";
        argv[n++] = "-cpu";
        argv[n++] = "host";
        argv[n++] = "-m";
        argv[n++] = "128";
        argv[n++] = "-smp";
        argv[n++] = "1";
        argv[n++] = "-nodefaults";
        argv[n++] = "-no-user-config";
        argv[n++] = "-display";
        argv[n++] = "none";
        argv[n++] = "-no-reboot";
        argv[n++] = "-sandbox";
        argv[n++] = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";
        if (kernel) {
                argv[n++] = "-kernel";
                argv[n++] = img_path;
                argv[n++] = "-append";
                argv[n++] = "panic=-1 reboot=t quiet console=none";
        } else {
                argv[n++] = "-bios";
                argv[n++] = img_path;
                argv[n++] = "-device";
                argv[n++] = "isa-debug-exit,iobase=0xf4,iosize=1";
        }
        argv[n] = NULL;

        const int keep[] = { img_fd };
        MicrovmSpawn sp = {
                .argv = argv,
                .keep = keep,
                .n_keep = ELEMENTSOF(keep),
                .log_fd = log_fd,
                .uid_name = "kvm-probe",
                .extra_gid = microvm_kvm_group(),
        };
        pid_t pid;
        int r = microvm_spawn_qemu(&sp, &pid);
        if (r < 0) {
                snprintf(why, why_len, "QEMU could not be started: %s", strerror(-r));
                return r;
        }
        int status;
        r = launch_wait_or_kill(pid, kernel ? PROBE_KERNEL_MS : PROBE_FIRMWARE_MS, &status);
        if (r == -ETIMEDOUT) {
                snprintf(why, why_len, "a guest %s under KVM did not finish within %d ms (KVM present but hangs guests)",
                         kernel ? "kernel" : "firmware", kernel ? PROBE_KERNEL_MS : PROBE_FIRMWARE_MS);
                return r;
        }
        if (r < 0)
                return r;
        int want = kernel ? 0 : 0x43;
        if (WIFEXITED(status) && WEXITSTATUS(status) == want)
                return 0;
        /* The first line QEMU wrote says why (no access to /dev/kvm, an MSR
         * the nested hypervisor refuses, ...). */
        char msg[160] = "";
        ssize_t got = pread(log_fd, msg, sizeof(msg) - 1, 0);
        if (got > 0) {
                msg[got] = 0;
                msg[strcspn(msg, "\n")] = 0;
        }
        if (WIFEXITED(status))
                snprintf(why, why_len, "QEMU under KVM exited %d%s%s", WEXITSTATUS(status), msg[0] ? ": " : "", msg);
        else
                snprintf(why, why_len, "QEMU under KVM died of signal %d%s%s", WTERMSIG(status), msg[0] ? ": " : "",
                         msg);
        return -ENODEV;
}

MicrovmAccel microvm_accel(const char *kernel, char *why, size_t why_len) {
        pthread_mutex_lock(&accel_lock);
        const char *force = getenv("RUNTIME_MICROVM_ACCEL");
        if (accel_state == ACCEL_UNKNOWN && force && (strcmp(force, "tcg") == 0 || strcmp(force, "kvm") == 0)) {
                accel_state = strcmp(force, "kvm") == 0 ? ACCEL_KVM : ACCEL_TCG;
                snprintf(accel_why, sizeof(accel_why), "%s, forced by RUNTIME_MICROVM_ACCEL",
                         accel_state == ACCEL_KVM ? "KVM" : "TCG");
        }
        bool have_kernel = kernel && access(kernel, R_OK) == 0;
        if (accel_state == ACCEL_UNKNOWN || (accel_state == ACCEL_KVM_FIRMWARE && have_kernel)) {
                char reason[200] = "";
                if (access("/dev/kvm", F_OK) < 0) {
                        accel_state = ACCEL_TCG;
                        snprintf(accel_why, sizeof(accel_why), "TCG: no /dev/kvm");
                } else if (kvm_try(have_kernel ? kernel : NULL, reason, sizeof(reason)) == 0) {
                        accel_state = have_kernel ? ACCEL_KVM : ACCEL_KVM_FIRMWARE;
                        snprintf(accel_why, sizeof(accel_why), "KVM: a guest %s booted under it",
                                 have_kernel ? "kernel" : "firmware");
                } else {
                        accel_state = ACCEL_TCG;
                        snprintf(accel_why, sizeof(accel_why), "TCG: %s", reason);
                }
        }
        MicrovmAccel a = accel_state == ACCEL_TCG ? MICROVM_ACCEL_TCG : MICROVM_ACCEL_KVM;
        if (why)
                snprintf(why, why_len, "%s", accel_why);
        pthread_mutex_unlock(&accel_lock);
        return a;
}
