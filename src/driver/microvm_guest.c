/*
 * What a guest is made of, whichever way it starts: the host's TSC rate it
 * is told, its kernel command line, and the key of a saved guest (everything
 * a restore depends on). Shared by the QEMU process (microvm_vmm.c), the
 * templates and the memory snapshots, none of which it needs.
 */
#include "driver/microvm_guest.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/path.h"

/* Under TCG, with tsc_early_khz and lpj (microvm_kernel_cmdline): with no
 * calibration reference on microvm (no PIT, HPET or PM timer to calibrate
 * against) the kernel would otherwise spin. */
#define TCG_KERNEL_OPTS "tsc=reliable no_timer_check"

/* The format of a saved guest's key: a change of what it describes makes
 * every older template stale. 2: the empty disk slots (microvm_slots.h). */
#define SAVED_GUEST_FORMAT 2

/* The host's TSC rate in kHz, rounded to whole MHz so that it reads the same
 * at every start of the daemon (a template's command line depends on it).
 * Under TCG the guest's TSC is the host's own counter: a guest told another
 * rate runs its clock that much fast or slow. 0 when it cannot be measured. */
unsigned microvm_host_tsc_khz(void) {
#if defined(__x86_64__)
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static unsigned khz;
        pthread_mutex_lock(&lock);
        if (khz == 0) {
                unsigned best = 0;
                /* Three 20 ms samples, the median: a preempted sample is off. */
                unsigned samples[3];
                for (int i = 0; i < 3; i++) {
                        struct timespec a, b, d = { .tv_nsec = 20 * 1000 * 1000 };
                        unsigned lo, hi, lo2, hi2;
                        clock_gettime(CLOCK_MONOTONIC_RAW, &a);
                        __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
                        nanosleep(&d, NULL);
                        __asm__ volatile("rdtsc" : "=a"(lo2), "=d"(hi2));
                        clock_gettime(CLOCK_MONOTONIC_RAW, &b);
                        uint64_t ticks = ((uint64_t)hi2 << 32 | lo2) - ((uint64_t)hi << 32 | lo);
                        int64_t ns = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
                        samples[i] = ns > 0 ? (unsigned)((double)ticks / (double)ns * 1000.0 + 0.5) : 0; /* MHz */
                }
                unsigned x = samples[0], y = samples[1], z = samples[2];
                best = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
                /* Plausible rates only; anything else keeps the old guess. */
                khz = best >= 100 && best <= 10000 ? best * 1000 : 2000000;
        }
        unsigned r = khz;
        pthread_mutex_unlock(&lock);
        return r;
#else
        return 0;
#endif
}

int microvm_kernel_cmdline(const char *id, MicrovmAccel accel, unsigned pids_max, char *buf, size_t len) {
        /* quiet: every console byte costs a VM exit (or, under TCG, an
         * emulated UART write); errors and panics still print. panic=-1 and
         * QEMU's -no-reboot turn a guest panic into QEMU's exit, which the
         * daemon sees as the channel's end. Under TCG the guest is told the
         * TSC's rate (there is nothing on microvm to calibrate it against)
         * and the delay loop's (lpj at the kernel's HZ=250). */
        char tcg[160] = "";
        unsigned khz = microvm_host_tsc_khz();
        if (khz == 0)
                khz = 2000000;
        if (accel == MICROVM_ACCEL_TCG)
                snprintf(tcg, sizeof(tcg), " tsc_early_khz=%u lpj=%u " TCG_KERNEL_OPTS, khz, khz * 4);
        char pids[32] = "";
        if (pids_max > 0)
                snprintf(pids, sizeof(pids), " runtime.pids=%u", pids_max);
        int n = snprintf(buf, len,
                         "console=ttyS0 quiet panic=-1 reboot=t 8250.nr_uarts=1 rdinit=/init "
                         "runtime.hostname=%s%s%s -- --vm --channel %s",
                         id, pids, tcg, MICROVM_CHANNEL_PATH);
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

/* The host's kernel release and a hash of its CPU's feature flags: under
 * KVM a restored guest keeps the code paths its kernel chose for the CPU it
 * booted on. */
static int host_cpu_id(char *buf, size_t len) {
        struct utsname u;
        if (uname(&u) < 0)
                return -errno;
        _cleanup_close_ int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        char text[16384];
        ssize_t n = read(fd, text, sizeof(text) - 1);
        if (n < 0)
                return -errno;
        text[n] = 0;
        char *flags = strstr(text, "\nflags");
        uint64_t h = FNV1A64_INIT;
        for (const char *p = flags; p && *p && (p == flags || *p != '\n'); p++)
                h = fnv1a64_byte(h, (uint8_t)*p);
        int m = snprintf(buf, len, "%s:%016llx", u.release, (unsigned long long)h);
        return m < 0 || (size_t)m >= len ? -ENOBUFS : 0;
}

/* The description of everything a saved guest depends on; equal keys mean
 * the same devices, command line, kernel, root, modules, agent and QEMU. */
static int saved_guest_key(const char *qemu, const char *image_dir, const char *agent, MicrovmAccel accel, unsigned vcpu,
                        unsigned mem, unsigned disk, unsigned pids, char *buf, size_t len) {
        char p[PATH_MAX], q[PATH_IDENTITY_MAX], k[PATH_IDENTITY_MAX], root[PATH_IDENTITY_MAX],
                mods[PATH_IDENTITY_MAX], ag[PATH_IDENTITY_MAX];
        int r;
        if ((r = path_identity(qemu, q, sizeof(q))) < 0 ||
            (r = path_join(p, sizeof(p), image_dir, "microvm/vmlinuz")) < 0 ||
            (r = path_identity(p, k, sizeof(k))) < 0 ||
            (r = path_join(p, sizeof(p), image_dir, "microvm/root.ext4")) < 0 ||
            (r = path_identity(p, root, sizeof(root))) < 0 ||
            (r = path_join(p, sizeof(p), image_dir, "microvm/modules")) < 0 ||
            (r = path_identity(p, mods, sizeof(mods))) < 0 || (r = path_identity(agent, ag, sizeof(ag))) < 0)
                return r;
        /* The command line as a template's (its name aside: it derives
         * from the key) and, under KVM, the host's CPU. */
        char cmdline[1024], cpu[128] = "-";
        if ((r = microvm_kernel_cmdline("tpl", accel, pids, cmdline, sizeof(cmdline))) < 0)
                return r;
        if (accel == MICROVM_ACCEL_KVM && (r = host_cpu_id(cpu, sizeof(cpu))) < 0)
                return r;
        int n = snprintf(buf, len,
                         "format=%d accel=%s vcpu=%u mem=%u disk=%u pids=%u\n"
                         "cmdline=%s\ncpu=%s\nqemu=%s\nkernel=%s\nroot=%s\nmodules=%s\nagent=%s\n",
                         SAVED_GUEST_FORMAT, accel == MICROVM_ACCEL_KVM ? "kvm" : "tcg", vcpu, mem, disk, pids, cmdline,
                         cpu, q, k, root, mods, ag);
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

int microvm_saved_guest_key(const MicrovmStart *s, char *buf, size_t len) {
        return saved_guest_key(s->qemu, microvm_boot_dir(s->spec), s->spec->agent_path, s->accel, s->vcpu, s->mem, s->disk,
                            s->pids, buf, len);
}
