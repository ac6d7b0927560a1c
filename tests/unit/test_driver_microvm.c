/*
 * The microVM driver (src/driver/microvm.c). The pure parts (kernel command
 * line, VMM uid, the initramfs writer, spec validation) always run. The live
 * tests boot real guests through the Driver table and talk to the real agent
 * over the daemon's channel; they need root, qemu-system-x86_64 and a built
 * image (RUNTIME_TEST_IMAGE_DIR, default /var/cache/runtime/images, image
 * `default`), and skip with the reason otherwise. Under TCG a boot takes
 * several seconds.
 */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "daemon/manager/channel.h"
#include "driver/driver.h"
#include "driver/microvm.h"
#include "driver/microvm_initramfs.h"
#include "driver/microvm_spawn.h"
#include "driver/microvm_vmm.h"
#include "driver/microvm_guest.h"
#include "driver/microvm_spawn.h"

#define CG_PARENT "runtime-test-microvm"
#define HELLO_MS 120000

static char build_dir[PATH_MAX];
static char agent_path[PATH_MAX + 32];
static char image_dir[PATH_MAX - 64];
static char work_dir[256];

/* ---- pure parts ---------------------------------------------------------- */

static void test_cmdline(void **state) {
        (void)state;
        char buf[1024];
        assert_int_equal(microvm_kernel_cmdline("sb-1", MICROVM_ACCEL_TCG, 4096, buf, sizeof(buf)), 0);
        assert_non_null(strstr(buf, "runtime.hostname=sb-1 "));
        assert_non_null(strstr(buf, " runtime.pids=4096 "));
        assert_non_null(strstr(buf, "tsc_early_khz="));
#if defined(__x86_64__)
        /* The host's own TSC rate, in whole MHz. */
        char want[64];
        snprintf(want, sizeof(want), "tsc_early_khz=%u lpj=%u ", microvm_host_tsc_khz(), microvm_host_tsc_khz() * 4);
        assert_non_null(strstr(buf, want));
        assert_int_equal(microvm_host_tsc_khz() % 1000, 0);
        assert_true(microvm_host_tsc_khz() >= 100000);
#endif
        assert_non_null(strstr(buf, "panic=-1"));
        /* The agent's arguments come last, after the kernel's "--". */
        const char *dd = strstr(buf, " -- ");
        assert_non_null(dd);
        assert_string_equal(dd, " -- --vm --channel /dev/virtio-ports/org.runtime.agent.0");
        assert_int_equal(microvm_kernel_cmdline("sb-1", MICROVM_ACCEL_KVM, 0, buf, sizeof(buf)), 0);
        assert_null(strstr(buf, "tsc_early_khz="));
        assert_null(strstr(buf, "runtime.pids="));
        assert_int_equal(microvm_kernel_cmdline("sb-1", MICROVM_ACCEL_KVM, 0, buf, 20), -ENOBUFS);
}

static void test_uid(void **state) {
        (void)state;
        uint32_t a = microvm_uid_for("a"), b = microvm_uid_for("b");
        assert_true(a >= MICROVM_UID_BASE && a < MICROVM_UID_BASE + MICROVM_UID_COUNT);
        assert_true(b >= MICROVM_UID_BASE && b < MICROVM_UID_BASE + MICROVM_UID_COUNT);
        assert_int_not_equal(a, b);
        assert_int_equal(a, microvm_uid_for("a"));
}

static void write_file(const char *path, const char *content) {
        FILE *f = fopen(path, "we");
        assert_non_null(f);
        fputs(content, f);
        fclose(f);
}

static unsigned hex8(const char *p) {
        char b[9];
        memcpy(b, p, 8);
        b[8] = 0;
        return (unsigned)strtoul(b, NULL, 16);
}

static void test_initramfs(void **state) {
        (void)state;
        char dir[] = "/tmp/microvm-test-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char mods[PATH_MAX], p[PATH_MAX + 32], agent[PATH_MAX];
        snprintf(mods, sizeof(mods), "%s/modules", dir);
        assert_int_equal(mkdir(mods, 0755), 0);
        snprintf(p, sizeof(p), "%s/20-b.ko", mods);
        write_file(p, "BBBB");
        snprintf(p, sizeof(p), "%s/10-a.ko", mods);
        write_file(p, "A");
        snprintf(p, sizeof(p), "%s/README", mods);
        write_file(p, "not a module");
        snprintf(agent, sizeof(agent), "%s/agent", dir);
        write_file(agent, "#!agent");

        int fd = memfd_create("initrd", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(microvm_write_initramfs(fd, mods, agent, NULL), 0);
        off_t end = lseek(fd, 0, SEEK_END);
        if (end <= 0 || end > 1024 * 1024) {
                fail_msg("initramfs of %lld bytes", (long long)end);
                return;
        }
        size_t size = (size_t)end;
        assert_true(size % 512 == 0);
        char *buf = malloc(size);
        assert_non_null(buf);
        assert_int_equal(pread(fd, buf, size, 0), (ssize_t)size);
        close(fd);

        static const char *const want[] = { "dev", "dev/console", "lib", "lib/runtime-modules",
                                            "lib/runtime-modules/10-a.ko", "lib/runtime-modules/20-b.ko",
                                            "init", "TRAILER!!!" };
        size_t off = 0;
        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                assert_true(off + 110 <= size);
                assert_memory_equal(buf + off, "070701", 6);
                unsigned mode = hex8(buf + off + 14), filesize = hex8(buf + off + 54);
                unsigned rmaj = hex8(buf + off + 78), rmin = hex8(buf + off + 86), namesize = hex8(buf + off + 94);
                const char *name = buf + off + 110;
                assert_string_equal(name, want[i]);
                off = (off + 110 + namesize + 3) & ~(size_t)3;
                if (strcmp(name, "dev/console") == 0) {
                        assert_true(S_ISCHR(mode));
                        assert_int_equal(rmaj, 5);
                        assert_int_equal(rmin, 1);
                }
                if (strcmp(name, "init") == 0) {
                        assert_int_equal(mode, S_IFREG | 0755);
                        assert_int_equal(filesize, 7);
                        assert_memory_equal(buf + off, "#!agent", 7);
                }
                if (strcmp(name, "lib/runtime-modules/20-b.ko") == 0)
                        assert_memory_equal(buf + off, "BBBB", 4);
                off = (off + filesize + 3) & ~(size_t)3;
        }
        free(buf);
        /* A missing agent is an error, not an archive without /init. */
        fd = memfd_create("initrd", MFD_CLOEXEC);
        snprintf(p, sizeof(p), "%s/missing", dir);
        assert_int_equal(microvm_write_initramfs(fd, mods, p, NULL), -ENOENT);
        close(fd);
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
}

/* The volumes' list rides in the archive as a file of its own, just before
 * /init, with the text given; without volumes there is none. */
static void test_initramfs_volumes(void **state) {
        (void)state;
        char dir[] = "build/tests/microvm-volumes-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char mods[PATH_MAX], agent[PATH_MAX];
        snprintf(mods, sizeof(mods), "%s/modules", dir);
        assert_int_equal(mkdir(mods, 0755), 0);
        snprintf(agent, sizeof(agent), "%s/agent", dir);
        write_file(agent, "#!agent");
        static const char text[] = "vol0 rw /data\nvol1 ro /srv/my data\n";
        int fd = memfd_create("initrd", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(microvm_write_initramfs(fd, mods, agent, text), 0);
        off_t at_end = lseek(fd, 0, SEEK_END);
        /* Bounded where the compiler sees it (the fortified pread checks). */
        size_t end = at_end > 0 && at_end < 1024 * 1024 ? (size_t)at_end : 0;
        assert_true(end > 0);
        char *buf = calloc(1, end + 1);
        assert_non_null(buf);
        assert_int_equal(pread(fd, buf, end, 0), (ssize_t)end);
        close(fd);
        bool found = false;
        for (size_t off = 0; off + 110 <= end;) {
                unsigned filesize = hex8(buf + off + 54), namesize = hex8(buf + off + 94);
                const char *name = buf + off + 110;
                size_t body = (off + 110 + namesize + 3) & ~(size_t)3;
                if (strcmp(name, "volumes") == 0) {
                        assert_int_equal(filesize, strlen(text));
                        assert_memory_equal(buf + body, text, filesize);
                        found = true;
                }
                if (strcmp(name, "TRAILER!!!") == 0)
                        break;
                off = (body + filesize + 3) & ~(size_t)3;
        }
        assert_true(found);
        free(buf);
        /* A list past its bound is refused, not cut. */
        char big[5000];
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        fd = memfd_create("initrd", MFD_CLOEXEC);
        assert_int_equal(microvm_write_initramfs(fd, mods, agent, big), -E2BIG);
        close(fd);
        snprintf(mods, sizeof(mods), "rm -rf %s", dir);
        assert_int_equal(system(mods), 0);
}

static void test_bad_specs(void **state) {
        (void)state;
        int fd;
        DriverInstance *inst;
        DriverSpec s = { .id = "ok", .vcpu = 1, .memory_mib = 256, .disk_mib = 64, .image_dir = "/nonexistent",
                         .sandbox_dir = "/nonexistent/sb", .agent_path = "/nonexistent/agent",
                         .cgroup_parent = CG_PARENT };
        assert_int_equal(driver_microvm.start(NULL, &fd, &inst, NULL), -EINVAL);
        DriverSpec b = s;
        b.id = "../etc";
        assert_int_equal(driver_microvm.start(&b, &fd, &inst, NULL), -EINVAL);
        b = s;
        b.id = "UPPER"; /* ends up in the guest's hostname and the kernel command line */
        assert_int_equal(driver_microvm.start(&b, &fd, &inst, NULL), -EINVAL);
        b = s;
        b.id = "a b";
        assert_int_equal(driver_microvm.start(&b, &fd, &inst, NULL), -EINVAL);
        b = s;
        b.memory_mib = 16;
        assert_int_equal(driver_microvm.start(&b, &fd, &inst, NULL), -EINVAL);
        b = s;
        b.vcpu = 1000;
        assert_int_equal(driver_microvm.start(&b, &fd, &inst, NULL), -EINVAL);
        b = s;
        b.cgroup_parent = "../..";
        assert_int_equal(driver_microvm.start(&b, &fd, &inst, NULL), -EINVAL);
        /* A valid spec on a missing image. */
        if (access("/usr/bin/qemu-system-x86_64", X_OK) == 0) {
                DriverError err = { .reason = "" };
                assert_int_equal(driver_microvm.start(&s, &fd, &inst, &err), -ENOENT);
                assert_non_null(strstr(err.reason, "runtime image build"));
                assert_null(strchr(err.reason, '/')); /* no host path for the client */
        }
        /* Idempotent cleanups of a sandbox that never was. */
        driver_microvm.stop(NULL, NULL);
        assert_int_equal(driver_microvm.destroy(&s), 0);
        assert_int_equal(driver_microvm.reap_orphan(&s), 0);
}

/* The state a supervisor keeps for a later daemon: strict, every field in
 * its place, bounded; anything else is not this driver's. */
static void test_vm_state(void **state) {
        (void)state;
        MicrovmVmState st;
        assert_int_equal(microvm_vm_state_parse("v=1,pid=4242,qmp=1,accel=tcg,host=sb-1,key=-", &st), 0);
        assert_int_equal(st.pid, 4242);
        assert_true(st.qmp_ready);
        assert_int_equal(st.accel, MICROVM_ACCEL_TCG);
        assert_string_equal(st.hostname, "sb-1");
        assert_false(st.has_key);
        assert_int_equal(microvm_vm_state_parse("v=1,pid=7,qmp=0,accel=kvm,host=tpl-00ff,key=0123456789abcdef", &st), 0);
        assert_false(st.qmp_ready);
        assert_int_equal(st.accel, MICROVM_ACCEL_KVM);
        assert_true(st.has_key);
        assert_true(st.key_hash == 0x0123456789abcdefull);
        char host64[128];
        snprintf(host64, sizeof(host64), "v=1,pid=9,qmp=1,accel=tcg,host=%064d,key=-", 0);
        assert_int_equal(microvm_vm_state_parse(host64, &st), 0);
        assert_int_equal(strlen(st.hostname), 64);
        static const char *const bad[] = {
                "",
                "v=1",
                "v=2,pid=4242,qmp=1,accel=tcg,host=sb-1,key=-",      /* a version this daemon does not know */
                "v=1,pid=1,qmp=1,accel=tcg,host=sb-1,key=-",         /* init is nobody's QEMU */
                "v=1,pid=0,qmp=1,accel=tcg,host=sb-1,key=-",
                "v=1,pid=-5,qmp=1,accel=tcg,host=sb-1,key=-",
                "v=1,pid=+5,qmp=1,accel=tcg,host=sb-1,key=-",
                "v=1,pid=05,qmp=1,accel=tcg,host=sb-1,key=-",
                "v=1,pid=99999999999,qmp=1,accel=tcg,host=sb-1,key=-", /* past a pid_t */
                "v=1,pid=4242,qmp=2,accel=tcg,host=sb-1,key=-",
                "v=1,pid=4242,qmp=1,accel=hvf,host=sb-1,key=-",
                "v=1,pid=4242,qmp=1,accel=tcg,host=,key=-",
                "v=1,pid=4242,qmp=1,accel=tcg,host=a/b,key=-",
                "v=1,pid=4242,qmp=1,accel=tcg,host=a.b,key=-",
                "v=1,pid=4242,qmp=1,accel=tcg,host=sb-1,key=0123",
                "v=1,pid=4242,qmp=1,accel=tcg,host=sb-1,key=0123456789ABCDEF",
                "v=1,pid=4242,qmp=1,accel=tcg,host=sb-1,key=0123456789abcdef0",
                "v=1,pid=4242,qmp=1,accel=tcg,host=sb-1,key=-,more=1", /* nothing after the last field */
                "v=1,qmp=1,pid=4242,accel=tcg,host=sb-1,key=-",        /* fields in their order only */
                "v=1,pid=4242,qmp=1,accel=tcg,host=sb-1",
                "pid=4242,tmpfs=0",                                    /* another driver's */
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                if (microvm_vm_state_parse(bad[i], &st) != -EBADMSG)
                        fail_msg("accepted: %s", bad[i]);
        }
        snprintf(host64, sizeof(host64), "v=1,pid=9,qmp=1,accel=tcg,host=%065d,key=-", 0);
        assert_int_equal(microvm_vm_state_parse(host64, &st), -EBADMSG);
        assert_int_equal(microvm_vm_state_parse(NULL, &st), -EBADMSG);
        /* A take-over with a state that is not the driver's closes the
         * descriptors it was given and starts nothing. */
        int fds[2];
        assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
        DriverSpec spec = { .id = "adopt-bad", .vcpu = 1, .memory_mib = 256, .disk_mib = 64,
                            .image_dir = "/nonexistent", .sandbox_dir = "/nonexistent/sb",
                            .agent_path = "/nonexistent/agent", .cgroup_parent = CG_PARENT };
        DriverInstance *inst = NULL;
        assert_int_equal(driver_microvm.adopt(&spec, "pid=4242,tmpfs=0", fds, 2, &inst), -EBADMSG);
        assert_null(inst);
        assert_int_equal(fcntl(fds[0], F_GETFD), -1);
        assert_int_equal(fcntl(fds[1], F_GETFD), -1);
}

/* An image with a root filesystem but no microVM parts: refused at once
 * with what to do, and nothing is built or started. */
static void test_missing_parts(void **state) {
        (void)state;
        if (access("/usr/bin/qemu-system-x86_64", X_OK) < 0) {
                skip();
                return;
        }
        char dir[] = "/var/tmp/runtime-test-noparts-XXXXXX", p[PATH_MAX];
        assert_non_null(mkdtemp(dir));
        snprintf(p, sizeof(p), "%s/default", dir);
        assert_int_equal(mkdir(p, 0755), 0);
        snprintf(p, sizeof(p), "%s/default/rootfs", dir);
        assert_int_equal(mkdir(p, 0755), 0);
        char image[PATH_MAX], sb[PATH_MAX];
        snprintf(image, sizeof(image), "%s/default", dir);
        snprintf(sb, sizeof(sb), "%s/sb", dir);
        DriverSpec s = { .id = "noparts", .vcpu = 1, .memory_mib = 256, .disk_mib = 64, .image_dir = image,
                         .sandbox_dir = sb, .agent_path = agent_path, .cgroup_parent = CG_PARENT };
        int fd = -1;
        DriverInstance *inst = NULL;
        DriverError err = { .reason = "" };
        assert_int_equal(driver_microvm.start(&s, &fd, &inst, &err), -ENOENT);
        assert_null(inst);
        assert_non_null(strstr(err.reason, "image default has no current microVM kernel and disk"));
        assert_non_null(strstr(err.reason, "runtime image build"));
        assert_null(strstr(err.reason, dir));
        snprintf(p, sizeof(p), "%s/default/microvm", dir);
        assert_int_equal(access(p, F_OK), -1); /* no builder ran */
        assert_int_equal(access(sb, F_OK), -1);
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
}

static void test_probe(void **state) {
        (void)state;
        char why[256] = "";
        int r = driver_microvm.probe(why, sizeof(why));
        if (access("/usr/bin/qemu-system-x86_64", X_OK) < 0) {
                assert_true(r < 0);
                return;
        }
        /* 0 with a KVM that boots guests; 1 (on request only) under TCG. */
        assert_true(r == 0 || r == 1);
        assert_non_null(strstr(why, "microvm"));
        assert_true(r == 0 ? strstr(why, "KVM") != NULL : strstr(why, "TCG") != NULL);
        print_message("probe: %s\n", why);
}

/* ---- live guests ----------------------------------------------------------- */

typedef struct Vm {
        DriverSpec spec;
        char id[32], sandbox_dir[PATH_MAX];
        DriverInstance *inst;
        Channel *c;
} Vm;

static void on_closed(void *userdata, const char *reason) {
        (void)userdata;
        (void)reason;
}

/* The agent is the guest's /init: it must not need a dynamic loader (the
 * sanitizer lane builds a dynamic one). */
static bool is_static_elf(const char *path) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        Elf64_Ehdr eh;
        if (fd < 0 || pread(fd, &eh, sizeof(eh), 0) != (ssize_t)sizeof(eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
                return false;
        for (unsigned i = 0; i < eh.e_phnum; i++) {
                Elf64_Phdr ph;
                if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + (uint64_t)i * eh.e_phentsize)) != (ssize_t)sizeof(ph))
                        return false;
                if (ph.p_type == PT_INTERP)
                        return false;
        }
        return true;
}

static bool live_ready(void) {
        const char *live = getenv("RUNTIME_TEST_MICROVM_LIVE");
        if (live && strcmp(live, "0") == 0) {
                print_message("skipped: RUNTIME_TEST_MICROVM_LIVE=0\n");
                return false;
        }
        if (geteuid() != 0) {
                print_message("skipped: the live tests need root (cgroups, VMM uids)\n");
                return false;
        }
        if (access("/usr/bin/qemu-system-x86_64", X_OK) < 0) {
                print_message("skipped: qemu-system-x86_64 is not installed\n");
                return false;
        }
        char p[PATH_MAX + 16];
        snprintf(p, sizeof(p), "%s/rootfs", image_dir);
        if (access(p, F_OK) < 0) {
                print_message("skipped: no image at %s (images/build.sh)\n", image_dir);
                return false;
        }
        if (access(agent_path, X_OK) < 0) {
                print_message("skipped: no agent at %s (make)\n", agent_path);
                return false;
        }
        /* A start never builds the image's microVM parts: made here, ahead,
         * as the image build does (a no-op when they are current). */
        static int parts = -1;
        if (parts < 0) {
                char root[PATH_MAX], cmd[5 * PATH_MAX];
                snprintf(root, sizeof(root), "%s", image_dir);
                *strrchr(root, '/') = 0;
                snprintf(cmd, sizeof(cmd),
                         "'%s/runtime-microvm-build' --check '%s' default || '%s/runtime-microvm-build' '%s' default",
                         build_dir, root, build_dir, root);
                parts = system(cmd) == 0;
        }
        if (!parts) {
                print_message("skipped: runtime-microvm-build could not make the image's microVM parts\n");
                return false;
        }
        if (!is_static_elf(agent_path)) {
                print_message("skipped: %s is not a static binary (a sanitizer build?)\n", agent_path);
                return false;
        }
        return true;
}

/* The guests of the running test, cleaned up by live_teardown even when an
 * assertion ended the test half-way. */
static Vm *live_vms[4];
static size_t n_live_vms;

static void vm_init(Vm *v, const char *name, unsigned disk_mib) {
        memset(v, 0, sizeof(*v));
        bool known = false;
        for (size_t i = 0; i < n_live_vms; i++)
                known = known || live_vms[i] == v;
        if (!known && n_live_vms < ELEMENTSOF(live_vms))
                live_vms[n_live_vms++] = v;
        snprintf(v->id, sizeof(v->id), "%s-%d", name, (int)getpid());
        snprintf(v->sandbox_dir, sizeof(v->sandbox_dir), "%s/%s", work_dir, v->id);
        v->spec = (DriverSpec){ .id = v->id, .vcpu = 1, .memory_mib = 256, .disk_mib = disk_mib, .pids_max = 256,
                                .image_dir = image_dir, .sandbox_dir = v->sandbox_dir, .agent_path = agent_path,
                                .cgroup_parent = CG_PARENT };
}

/* Starts the VM and waits for the agent's HELLO; returns the milliseconds
 * it took. */
static int64_t vm_boot(Vm *v) {
        int64_t t0 = (int64_t)time_now_mono_ms();
        int fd = -1;
        int r = driver_microvm.start(&v->spec, &fd, &v->inst, NULL);
        if (r < 0)
                print_message("start: %s\n", strerror(-r));
        assert_int_equal(r, 0);
        v->c = channel_new(fd, on_closed, v);
        assert_non_null(v->c);
        _cleanup_json_ json_t *hello = NULL;
        r = channel_wait_hello(v->c, HELLO_MS, &hello);
        if (r < 0) {
                char cmd[2 * PATH_MAX + 64];
                snprintf(cmd, sizeof(cmd), "tail -n 30 %s/console.log %s/vmm.log", v->sandbox_dir, v->sandbox_dir);
                assert_true(system(cmd) >= 0);
        }
        assert_int_equal(r, 0);
        assert_int_equal(json_integer_value(json_object_get(hello, "pid")), 1);
        return (int64_t)time_now_mono_ms() - t0;
}

static void vm_halt(Vm *v, const char **ret_reason) {
        channel_free(v->c);
        v->c = NULL;
        driver_microvm.stop(v->inst, ret_reason);
        v->inst = NULL;
}

/* Runs `command` under sh in the guest: exit code, stdout into out. */
static int vm_run(Vm *v, const char *command, char *out, size_t out_len) {
        _cleanup_json_ json_t *req =
                json_pack("{s:s, s:[s,s,s], s:i}", "op", "exec", "argv", "/bin/sh", "-c", command, "timeoutMs", 60000);
        ChanStream *s = NULL;
        assert_int_equal(channel_open_stream(v->c, req, &s), 0);
        size_t used = 0;
        if (out_len)
                out[0] = 0;
        int code = -1000;
        for (;;) {
                ChanEvent e;
                int r = chan_stream_next(s, 90000, &e);
                assert_int_equal(r, 0);
                if (e.type == CHAN_EV_DATA && e.fd == 1 && out_len) {
                        size_t n = e.len < out_len - 1 - used ? e.len : out_len - 1 - used;
                        memcpy(out + used, e.data, n);
                        used += n;
                        out[used] = 0;
                } else if (e.type == CHAN_EV_RESULT) {
                        json_t *ec = json_object_get(e.json, "exitCode");
                        code = ec ? (int)json_integer_value(ec) : -1001;
                        chan_event_clear(&e);
                        break;
                } else if (e.type == CHAN_EV_CLOSED) {
                        chan_event_clear(&e);
                        break;
                }
                chan_event_clear(&e);
        }
        chan_stream_free(s);
        return code;
}

static bool cgroup_present(const char *id) {
        static const char *const hier[] = { "memory", "cpu", "pids", "unified", "" };
        for (size_t i = 0; i < ELEMENTSOF(hier); i++) {
                char p[PATH_MAX];
                snprintf(p, sizeof(p), "/sys/fs/cgroup/%s%s" CG_PARENT "/%s", hier[i], hier[i][0] ? "/" : "", id);
                if (access(p, F_OK) == 0)
                        return true;
        }
        return false;
}

/* Number of live host processes running as `uid`. */
static int procs_of_uid(uint32_t uid) {
        DIR *d = opendir("/proc");
        assert_non_null(d);
        int n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] < '0' || de->d_name[0] > '9')
                        continue;
                char p[300];
                struct stat st;
                snprintf(p, sizeof(p), "/proc/%s", de->d_name);
                if (stat(p, &st) < 0 || st.st_uid != uid)
                        continue;
                /* A killed child of this test stays a zombie until it is
                 * reaped; it holds nothing. */
                char sp[320], buf[512] = "";
                snprintf(sp, sizeof(sp), "/proc/%s/stat", de->d_name);
                FILE *f = fopen(sp, "re");
                if (f) {
                        if (!fgets(buf, sizeof(buf), f))
                                buf[0] = 0;
                        fclose(f);
                }
                const char *rp = strrchr(buf, ')');
                if (rp && rp[1] == ' ' && rp[2] == 'Z')
                        continue;
                n++;
        }
        closedir(d);
        return n;
}

static void test_live_lifecycle(void **state) {
        (void)state;
        if (!live_ready())
                skip();
        static Vm v;
        vm_init(&v, "life", 64);
        int64_t ms = vm_boot(&v);
        /* A first start restores the shape's template (made now when
         * missing) unless RUNTIME_MICROVM_SNAPSHOTS=0. */
        print_message("first start to HELLO: %lld ms\n", (long long)ms);
        uint32_t uid = microvm_uid_for(v.id);
        assert_true(procs_of_uid(uid) >= 1); /* QEMU is not root */
        assert_true(cgroup_present(v.id));

        /* Its own kernel. */
        char out[4096];
        struct utsname u;
        assert_int_equal(uname(&u), 0);
        assert_int_equal(vm_run(&v, "uname -r", out, sizeof(out)), 0);
        out[strcspn(out, "\n")] = 0;
        print_message("guest kernel %s, host %s\n", out, u.release);
        assert_string_not_equal(out, u.release);
        assert_int_equal(vm_run(&v, "cat /proc/version", out, sizeof(out)), 0);
        assert_null(strstr(out, u.release));
        assert_int_equal(vm_run(&v, "hostname", out, sizeof(out)), 0);
        out[strcspn(out, "\n")] = 0;
        assert_string_equal(out, v.id);
        /* No network device but loopback; root is the overlay. */
        assert_int_equal(vm_run(&v, "ls /sys/class/net", out, sizeof(out)), 0);
        assert_string_equal(out, "lo\n");
        assert_int_equal(vm_run(&v, "awk '$2==\"/\"{print $3}' /proc/mounts", out, sizeof(out)), 0);
        assert_string_equal(out, "overlay\n");

        /* The writable layer is bounded by diskMiB. */
        assert_int_equal(vm_run(&v, "echo kept > /workspace/f && sync", out, sizeof(out)), 0);
        assert_int_not_equal(vm_run(&v, "dd if=/dev/zero of=/workspace/big bs=1M count=128 2>/dev/null; r=$?; sync; exit $r",
                                    out, sizeof(out)),
                             0);
        char upper[PATH_MAX + 16];
        snprintf(upper, sizeof(upper), "%s/upper.ext4", v.sandbox_dir);
        struct stat st;
        assert_int_equal(stat(upper, &st), 0);
        assert_true(st.st_size == 64LL * 1024 * 1024);
        assert_true((uint64_t)st.st_blocks * 512 <= (uint64_t)st.st_size);
        assert_int_equal(vm_run(&v, "rm /workspace/big; sync", out, sizeof(out)), 0);

        DriverStats ds;
        assert_int_equal(driver_microvm.stats(v.inst, &ds), 0);
        assert_true(ds.memory_bytes > 0);
        assert_true(ds.disk_used_bytes > 0);

        const char *reason = "unset";
        vm_halt(&v, &reason);
        assert_null(reason);
        assert_int_equal(procs_of_uid(uid), 0);
        assert_false(cgroup_present(v.id));
        char p[PATH_MAX + 32];
        snprintf(p, sizeof(p), "%s/initrd.cpio", v.sandbox_dir);
        assert_int_not_equal(access(p, F_OK), 0);
        assert_int_equal(access(upper, F_OK), 0);

        /* Started again on its own files. */
        vm_boot(&v);
        assert_int_equal(vm_run(&v, "cat /workspace/f", out, sizeof(out)), 0);
        assert_string_equal(out, "kept\n");

        /* A guest kernel that panics ends its VMM (panic=-1, -no-reboot): the
         * stop reports it, and console.log keeps the trace. */
        /* A guest printing without end costs the host a bounded file. */
        int64_t t_spam = (int64_t)time_now_mono_ms();
        assert_int_equal(vm_run(&v, "head -c 1100000 /dev/zero | tr '\\0' x > /dev/ttyS0", out, sizeof(out)), 0);
        print_message("1.1 MB to the serial console in %lld ms\n", (long long)((int64_t)time_now_mono_ms() - t_spam));
        vm_run(&v, "echo c > /proc/sysrq-trigger", out, sizeof(out));
        int64_t t_off = (int64_t)time_now_mono_ms();
        while (procs_of_uid(uid) > 0 && (int64_t)time_now_mono_ms() - t_off < 60000)
                usleep(50000);
        if (procs_of_uid(uid) > 0) {
                char cmd[2 * PATH_MAX + 64];
                snprintf(cmd, sizeof(cmd), "tail -n 20 %s/console.log %s/vmm.log", v.sandbox_dir, v.sandbox_dir);
                assert_true(system(cmd) >= 0);
                fail_msg("QEMU still runs %lld ms after the guest's panic", (long long)((int64_t)time_now_mono_ms() - t_off));
        }
        vm_halt(&v, &reason);
        assert_non_null(reason);
        assert_string_equal(reason, "exited");
        char console[PATH_MAX + 32];
        snprintf(console, sizeof(console), "%s/console.log", v.sandbox_dir);
        FILE *cf = fopen(console, "re");
        assert_non_null(cf);
        static char text[MICROVM_CONSOLE_MAX + 1];
        size_t tn = fread(text, 1, sizeof(text) - 1, cf);
        fclose(cf);
        text[tn] = 0;
        if (!strstr(text, "Kernel panic"))
                print_message("console.log (%zu bytes): %s\n", tn, tn > 2000 ? text + tn - 2000 : text);
        assert_non_null(strstr(text, "Kernel panic"));
        assert_true(tn <= MICROVM_CONSOLE_MAX);
        assert_non_null(strstr(text, "xxxxxxxx"));
        print_message("after a guest panic: %s, console.log %zu bytes with the panic\n", reason, tn);

        assert_int_equal(driver_microvm.destroy(&v.spec), 0);
        assert_int_not_equal(access(v.sandbox_dir, F_OK), 0);
        assert_int_equal(driver_microvm.destroy(&v.spec), 0);
}

static void test_live_reap_orphan(void **state) {
        (void)state;
        if (!live_ready())
                skip();
        static Vm v;
        vm_init(&v, "orphan", 32);
        vm_boot(&v);
        uint32_t uid = microvm_uid_for(v.id);
        /* What a restarted daemon does for a sandbox it finds running. */
        assert_int_equal(driver_microvm.reap_orphan(&v.spec), 0);
        assert_int_equal(procs_of_uid(uid), 0);
        assert_false(cgroup_present(v.id));
        char p[PATH_MAX + 32];
        snprintf(p, sizeof(p), "%s/upper.ext4", v.sandbox_dir);
        assert_int_equal(access(p, F_OK), 0);
        /* The instance of the old daemon sees its VMM killed from outside. */
        const char *reason = NULL;
        vm_halt(&v, &reason);
        assert_non_null(reason);
        assert_string_equal(reason, "killed");
        assert_int_equal(driver_microvm.destroy(&v.spec), 0);
        assert_int_not_equal(access(v.sandbox_dir, F_OK), 0);
}

/* RUNTIME_TEST_MICROVM_BOOTS=N: N consecutive cold boots, then N restores
 * from the shape's template, each to the agent's HELLO and an exec, with the
 * time of each. */
static void test_live_boots(void **state) {
        (void)state;
        const char *env = getenv("RUNTIME_TEST_MICROVM_BOOTS");
        int n = env ? atoi(env) : 0;
        if (n <= 0) {
                print_message("skipped: set RUNTIME_TEST_MICROVM_BOOTS=N to measure N cold boots and N restores\n");
                skip();
        }
        if (!live_ready())
                skip();
        const char *was = getenv("RUNTIME_MICROVM_SNAPSHOTS");
        char saved[16] = "";
        if (was)
                snprintf(saved, sizeof(saved), "%s", was);
        for (int round = 0; round < 2; round++) {
                setenv("RUNTIME_MICROVM_SNAPSHOTS", round == 0 ? "0" : "1", 1);
                for (int i = 0; i < n; i++) {
                        static Vm v;
                        char name[16];
                        snprintf(name, sizeof(name), "boot%d", i);
                        vm_init(&v, name, 64);
                        int64_t t0 = (int64_t)time_now_mono_ms();
                        int64_t hello = vm_boot(&v);
                        char out[64];
                        assert_int_equal(vm_run(&v, "echo 42", out, sizeof(out)), 0);
                        assert_string_equal(out, "42\n");
                        int64_t exec = (int64_t)time_now_mono_ms() - t0;
                        print_message("%s %d: hello %lld ms, first exec %lld ms\n", round == 0 ? "cold boot" : "restore",
                                      i, (long long)hello, (long long)exec);
                        vm_halt(&v, NULL);
                        assert_int_equal(driver_microvm.destroy(&v.spec), 0);
                }
        }
        if (saved[0])
                setenv("RUNTIME_MICROVM_SNAPSHOTS", saved, 1);
        else
                unsetenv("RUNTIME_MICROVM_SNAPSHOTS");
}

/* Whether the file holds `needle`, waiting up to timeout_ms for it. */
static bool file_gets(const char *path, const char *needle, int timeout_ms) {
        int64_t end = (int64_t)time_now_mono_ms() + timeout_ms;
        static char buf[MICROVM_CONSOLE_MAX + 1];
        do {
                FILE *f = fopen(path, "re");
                size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
                if (f)
                        fclose(f);
                buf[n] = 0;
                if (memmem(buf, n, needle, strlen(needle)))
                        return true;
                usleep(50000);
        } while ((int64_t)time_now_mono_ms() < end);
        return false;
}

/* Live restore at the driver: a VM handed over (handles, then release)
 * runs on with no instance; a new instance adopts it from the state and
 * the descriptors. Its monitor is back in step after a command whose reply
 * nobody read, what the guest printed on its console meanwhile reaches
 * console.log, a memory snapshot of it is made (its key and initramfs came
 * through), pause and resume work, and a stop kills the adopted QEMU
 * (no reason: it was alive). A state naming another pid is refused and
 * leaves QEMU running. An adopted QEMU that ended on its own reads
 * "exited". */
static void test_live_handover(void **state) {
        (void)state;
        if (!live_ready())
                skip();
        static Vm v, w;
        char out[4096], st[DRIVER_STATE_MAX + 1], p[PATH_MAX + 32];
        vm_init(&v, "hand", 64);
        vm_boot(&v);
        uint32_t uid = microvm_uid_for(v.id);
        int fds[DRIVER_MAX_HANDLES];
        size_t n = DRIVER_MAX_HANDLES;
        assert_int_equal(driver_microvm.handles(v.inst, fds, &n, st, sizeof(st)), 0);
        assert_int_equal(n, 5);
        print_message("state: %s\n", st);
        driver_microvm.release(v.inst);
        v.inst = NULL;
        assert_true(procs_of_uid(uid) >= 1);
        assert_true(cgroup_present(v.id));
        assert_int_equal(vm_run(&v, "echo printed-while-away > /dev/ttyS0", out, sizeof(out)), 0);
        /* A daemon killed in the middle of a monitor command. */
        static const char cmd[] = "{\"execute\":\"query-status\"}\n";
        assert_int_equal(write(fds[1], cmd, sizeof(cmd) - 1), (ssize_t)(sizeof(cmd) - 1));
        int64_t t0 = (int64_t)time_now_mono_ms();
        assert_int_equal(driver_microvm.adopt(&v.spec, st, fds, n, &v.inst), 0);
        print_message("take-over: %lld ms\n", (long long)((int64_t)time_now_mono_ms() - t0));
        snprintf(p, sizeof(p), "%s/console.log", v.sandbox_dir);
        assert_true(file_gets(p, "printed-while-away", 10000));
        assert_true(driver_microvm.alive(v.inst));
        /* Its start came through whole (the saved guest's key, the
         * initramfs): a memory snapshot of it is made while it is paused. */
        char snap[PATH_MAX + 64];
        snprintf(snap, sizeof(snap), "%s-snap", v.sandbox_dir);
        assert_int_equal(mkdir(snap, 0700), 0);
        assert_int_equal(driver_microvm.pause(v.inst), 0);
        assert_int_equal(driver_microvm.snapshot_memory(v.inst, &v.spec, snap), 0);
        assert_int_equal(driver_microvm.resume(v.inst), 0);
        char rm[PATH_MAX + 96];
        snprintf(rm, sizeof(rm), "rm -rf '%s'", snap);
        assert_int_equal(system(rm), 0);
        assert_int_equal(vm_run(&v, "echo on", out, sizeof(out)), 0);
        assert_string_equal(out, "on\n");
        DriverStats ds;
        assert_int_equal(driver_microvm.stats(v.inst, &ds), 0);
        assert_true(ds.memory_bytes > 0);

        /* The adopted instance hands over again; a state with another
         * pid is not taken, and QEMU runs on. */
        n = DRIVER_MAX_HANDLES;
        assert_int_equal(driver_microvm.handles(v.inst, fds, &n, st, sizeof(st)), 0);
        MicrovmVmState vs;
        assert_int_equal(microvm_vm_state_parse(st, &vs), 0);
        char lie[DRIVER_STATE_MAX + 1];
        const char *rest = strchr(st + strlen("v=1,pid="), ',');
        snprintf(lie, sizeof(lie), "v=1,pid=%d%s", (int)vs.pid + 1, rest);
        DriverInstance *other = NULL;
        assert_int_equal(driver_microvm.adopt(&v.spec, lie, fds, n, &other), -ESRCH);
        assert_null(other);
        assert_true(driver_microvm.alive(v.inst));
        const char *reason = "unset";
        vm_halt(&v, &reason);
        assert_null(reason);
        assert_int_equal(procs_of_uid(uid), 0);
        assert_false(cgroup_present(v.id));

        /* Adopted, then ended from outside: no wait status to read. */
        vm_init(&w, "hand2", 64);
        vm_boot(&w);
        n = DRIVER_MAX_HANDLES;
        assert_int_equal(driver_microvm.handles(w.inst, fds, &n, st, sizeof(st)), 0);
        driver_microvm.release(w.inst);
        w.inst = NULL;
        assert_int_equal(driver_microvm.adopt(&w.spec, st, fds, n, &w.inst), 0);
        assert_int_equal(microvm_vm_state_parse(st, &vs), 0);
        assert_int_equal(kill(vs.pid, SIGKILL), 0);
        int64_t end = (int64_t)time_now_mono_ms() + 10000;
        while (driver_microvm.alive(w.inst) && (int64_t)time_now_mono_ms() < end)
                usleep(20000);
        assert_false(driver_microvm.alive(w.inst));
        reason = "unset";
        vm_halt(&w, &reason);
        assert_non_null(reason);
        assert_string_equal(reason, "exited");
        assert_false(cgroup_present(w.id));
        (void)waitpid(vs.pid, NULL, WNOHANG); /* the test's own child */
}

static int live_teardown(void **state) {
        (void)state;
        for (size_t i = 0; i < n_live_vms; i++) {
                Vm *v = live_vms[i];
                channel_free(v->c);
                v->c = NULL;
                driver_microvm.stop(v->inst, NULL);
                v->inst = NULL;
                (void)driver_microvm.destroy(&v->spec);
        }
        n_live_vms = 0;
        return 0;
}

static int setup(void **state) {
        (void)state;
        char self[PATH_MAX - 64];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0)
                return -1;
        self[n] = 0;
        char *slash = strrchr(self, '/');
        *slash = 0; /* build/tests */
        slash = strrchr(self, '/');
        *slash = 0; /* build */
        snprintf(agent_path, sizeof(agent_path), "%s/runtime-agent", self);
        snprintf(build_dir, sizeof(build_dir), "%s", self);
        /* The sanitizer lane (build/asan) has a dynamic agent, which cannot
         * be a guest's /init: its guests run the release build's. */
        if (!is_static_elf(agent_path)) {
                char alt[PATH_MAX + 32];
                snprintf(alt, sizeof(alt), "%s/../runtime-agent", self);
                if (is_static_elf(alt))
                        memcpy(agent_path, alt, sizeof(agent_path));
        }
        const char *root = getenv("RUNTIME_TEST_IMAGE_DIR");
        if (snprintf(image_dir, sizeof(image_dir), "%s/default", root ? root : "/var/cache/runtime/images") >=
            (int)sizeof(image_dir))
                return -1;
        snprintf(work_dir, sizeof(work_dir), "/var/tmp/runtime-test-microvm-%d", (int)getpid());
        if (mkdir(work_dir, 0700) < 0 && errno != EEXIST)
                return -1;
        return 0;
}

static int teardown(void **state) {
        (void)state;
        rmdir(work_dir);
        char p[PATH_MAX];
        static const char *const hier[] = { "memory", "cpu", "cpuacct", "pids", "freezer", "unified" };
        for (size_t i = 0; i < ELEMENTSOF(hier); i++) {
                snprintf(p, sizeof(p), "/sys/fs/cgroup/%s/" CG_PARENT, hier[i]);
                rmdir(p);
        }
        return 0;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_cmdline),       cmocka_unit_test(test_uid),
                cmocka_unit_test(test_initramfs),     cmocka_unit_test(test_initramfs_volumes),
                cmocka_unit_test(test_bad_specs),
                cmocka_unit_test(test_probe),         cmocka_unit_test(test_missing_parts),
                cmocka_unit_test(test_vm_state),
                cmocka_unit_test_teardown(test_live_lifecycle, live_teardown),
                cmocka_unit_test_teardown(test_live_reap_orphan, live_teardown),
                cmocka_unit_test_teardown(test_live_handover, live_teardown),
                cmocka_unit_test_teardown(test_live_boots, live_teardown),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
