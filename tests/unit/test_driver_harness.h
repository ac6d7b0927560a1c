#pragma once
/*
 * Shared body of test_driver_namespace.c and test_driver_gvisor.c: a real
 * sandbox through the Driver interface, with the built image and agent.
 * Skips (with the reason) unless run as root with the `default` image under
 * RUNTIME_TEST_IMAGE_DIR (default /var/cache/runtime/images, as for the
 * integration tests and test_driver_microvm) and the agent at
 * RUNTIME_TEST_AGENT (default build/runtime-agent of this tree).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/path.h"
#include "driver/driver.h"
#include "driver/gvisor.h"
#include "driver/rootfs.h"
#include "proto/proto.h"

#define HARNESS_CGROUP_PARENT "runtime-unit-test"

typedef struct Harness {
        const Driver *drv;
        char tmp[128];
        char sandboxes[PATH_MAX];
        char sandbox_dir[PATH_MAX];
        char image_dir[PATH_MAX];
        char agent[PATH_MAX];
        char id[64];
        DriverSpec spec;
} Harness;

static double harness_now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The repository's root, from this file's own path. */
static void harness_repo_root(char *buf, size_t len) {
        char here[PATH_MAX];
        snprintf(here, sizeof here, "%s", __FILE__);
        char *slash = strrchr(here, '/');
        if (slash)
                *slash = '\0';
        else
                snprintf(here, sizeof here, ".");
        char p[PATH_MAX + 8];
        snprintf(p, sizeof p, "%s/../..", here);
        if (!realpath(p, buf))
                snprintf(buf, len, ".");
}

static int harness_setup(void **state, const Driver *drv, const char *id) {
        Harness *h = calloc(1, sizeof *h);
        assert_non_null(h);
        h->drv = drv;
        *state = h;
        if (geteuid() != 0) {
                print_message("skip: %s driver tests need root (cgroups, mounts, uid maps)\n", drv->name);
                return 0;
        }
        const char *img = getenv("RUNTIME_TEST_IMAGE_DIR");
        snprintf(h->image_dir, sizeof h->image_dir, "%.4000s/default", img ? img : "/var/cache/runtime/images");
        const char *agent = getenv("RUNTIME_TEST_AGENT");
        if (agent)
                snprintf(h->agent, sizeof h->agent, "%s", agent);
        else {
                char root[PATH_MAX];
                harness_repo_root(root, sizeof root);
                snprintf(h->agent, sizeof h->agent, "%.4000s/build/runtime-agent", root);
        }
        snprintf(h->tmp, sizeof h->tmp, "/var/tmp/runtime-drvtest-XXXXXX");
        assert_non_null(mkdtemp(h->tmp));
        snprintf(h->sandboxes, sizeof h->sandboxes, "%s/sandboxes", h->tmp);
        assert_int_equal(mkdir(h->sandboxes, 0700), 0);
        snprintf(h->id, sizeof h->id, "%s-%d", id, (int)getpid());
        snprintf(h->sandbox_dir, sizeof h->sandbox_dir, "%s/sandboxes/%s", h->tmp, h->id);
        h->spec = (DriverSpec){
                .id = h->id,
                .vcpu = 1,
                .memory_mib = 512,
                .disk_mib = 256,
                .pids_max = 200,
                .image_dir = h->image_dir,
                .sandbox_dir = h->sandbox_dir,
                .agent_path = h->agent,
                .cgroup_parent = HARNESS_CGROUP_PARENT,
        };
        return 0;
}

static int harness_teardown(void **state) {
        Harness *h = *state;
        if (h->tmp[0]) {
                (void)h->drv->destroy(&h->spec);
                (void)path_remove_tree_at(AT_FDCWD, h->tmp);
                /* The tests' parent cgroup, once empty. */
                static const char *const hier[] = {"memory/", "cpu/", "cpuacct/", "pids/", "freezer/", "unified/", ""};
                for (size_t i = 0; i < sizeof hier / sizeof hier[0]; i++) {
                        char p[PATH_MAX];
                        snprintf(p, sizeof p, "/sys/fs/cgroup/%s%s", hier[i], HARNESS_CGROUP_PARENT);
                        (void)rmdir(p);
                }
        }
        free(h);
        return 0;
}

/* Skips the test (with the reason) when this host cannot run it. */
static bool harness_skip(Harness *h) {
        if (geteuid() != 0)
                return true;
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/rootfs", h->image_dir);
        if (access(p, F_OK) < 0) {
                print_message("skip: no image at %s (build it with runtime-image-build)\n", h->image_dir);
                return true;
        }
        if (access(h->agent, X_OK) < 0) {
                print_message("skip: no agent at %s (make build/runtime-agent)\n", h->agent);
                return true;
        }
        char why[256] = "";
        if (h->drv->probe(why, sizeof why) < 0) {
                print_message("skip: %s driver not usable here: %s\n", h->drv->name, why);
                return true;
        }
        return false;
}

/* Reads frames until one of `type` on `stream` arrives; collects DATA fd 1
 * of that stream into out. Returns the frame's payload as a string in
 * payload (for JSON frames). */
typedef struct Conn {
        int fd;
        ProtoReader *r;
} Conn;

static int conn_wait(Conn *c, uint8_t type, uint32_t stream, int timeout_ms, char *out, size_t out_len,
                     char *payload, size_t payload_len) {
        size_t got = 0;
        if (out && out_len)
                out[0] = '\0';
        double deadline = harness_now_ms() + timeout_ms;
        for (;;) {
                ProtoHeader hdr;
                const uint8_t *pl;
                int r;
                while ((r = proto_reader_next(c->r, &hdr, &pl)) == 1) {
                        if (hdr.type == PROTO_DATA && hdr.stream == stream && hdr.flags == PROTO_FD_OUT && out) {
                                size_t n = hdr.length < out_len - 1 - got ? hdr.length : out_len - 1 - got;
                                memcpy(out + got, pl, n);
                                got += n;
                                out[got] = '\0';
                        }
                        if (hdr.type == type && hdr.stream == stream) {
                                if (payload) {
                                        size_t n = hdr.length < payload_len - 1 ? hdr.length : payload_len - 1;
                                        memcpy(payload, pl, n);
                                        payload[n] = '\0';
                                }
                                return 0;
                        }
                }
                if (r < 0)
                        return r;
                int left = (int)(deadline - harness_now_ms());
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
                if (poll(&pfd, 1, left) <= 0)
                        return -ETIMEDOUT;
                uint8_t buf[65536];
                ssize_t n = read(c->fd, buf, sizeof buf);
                if (n <= 0)
                        return -EPIPE;
                if (proto_reader_feed(c->r, buf, (size_t)n) < 0)
                        return -EPROTO;
        }
}

/* Runs `sh -c cmd` through the agent; stdout into out; exit code. */
static int conn_exec(Conn *c, uint32_t stream, const char *cmd, char *out, size_t out_len) {
        json_t *req = json_pack("{s:s, s:[s,s,s], s:s}", "op", "exec", "argv", "/bin/sh", "-c", cmd, "cwd", "/");
        assert_non_null(req);
        char *s = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        assert_non_null(s);
        assert_int_equal(proto_write_frame(c->fd, PROTO_OPEN, 0, stream, s, strlen(s)), 0);
        free(s);
        char result[4096];
        int r = conn_wait(c, PROTO_RESULT, stream, 60000, out, out_len, result, sizeof result);
        if (r < 0)
                return r;
        json_t *j = json_loads(result, 0, NULL);
        assert_non_null(j);
        json_t *code = json_object_get(j, "exitCode");
        int rc = json_is_integer(code) ? (int)json_integer_value(code) : -1000;
        json_decref(j);
        return rc;
}

static int harness_start(Harness *h, Conn *c, DriverInstance **inst, double *ret_hello_ms) {
        double t0 = harness_now_ms();
        int fd;
        int r = h->drv->start(&h->spec, &fd, inst, NULL);
        if (r < 0)
                return r;
        c->fd = fd;
        c->r = proto_reader_new();
        assert_non_null(c->r);
        char hello[1024];
        r = conn_wait(c, PROTO_HELLO, 0, 30000, NULL, 0, hello, sizeof hello);
        if (r < 0)
                return r;
        if (ret_hello_ms)
                *ret_hello_ms = harness_now_ms() - t0;
        assert_non_null(strstr(hello, "\"version\""));
        return 0;
}

static void conn_close(Conn *c) {
        proto_reader_free(c->r);
        c->r = NULL;
        close(c->fd);
        c->fd = -1;
}

static bool read_small(const char *path, char *buf, size_t len) {
        FILE *f = fopen(path, "re");
        if (!f)
                return false;
        size_t n = fread(buf, 1, len - 1, f);
        buf[n] = '\0';
        fclose(f);
        buf[strcspn(buf, "\n")] = '\0';
        return true;
}

/* The cgroup's limit files hold what the spec asked for (gVisor's memory
 * with the room its Sentry needs above it). */
static void harness_check_limits(Harness *h) {
        char p[PATH_MAX], v[64], mem[32];
        snprintf(mem, sizeof mem, "%llu",
                 (unsigned long long)(h->drv == &driver_gvisor ? gvisor_host_memory_mib(512, 200) : 512) << 20);
        if (access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0) {
                snprintf(p, sizeof p, "/sys/fs/cgroup/%s/%s/memory.max", HARNESS_CGROUP_PARENT, h->id);
                assert_true(read_small(p, v, sizeof v));
                assert_string_equal(v, mem);
                snprintf(p, sizeof p, "/sys/fs/cgroup/%s/%s/pids.max", HARNESS_CGROUP_PARENT, h->id);
                assert_true(read_small(p, v, sizeof v));
                assert_string_equal(v, "200");
                snprintf(p, sizeof p, "/sys/fs/cgroup/%s/%s/cpu.max", HARNESS_CGROUP_PARENT, h->id);
                assert_true(read_small(p, v, sizeof v));
                assert_string_equal(v, "100000 100000");
                return;
        }
        snprintf(p, sizeof p, "/sys/fs/cgroup/memory/%s/%s/memory.limit_in_bytes", HARNESS_CGROUP_PARENT, h->id);
        assert_true(read_small(p, v, sizeof v));
        assert_string_equal(v, mem);
        snprintf(p, sizeof p, "/sys/fs/cgroup/pids/%s/%s/pids.max", HARNESS_CGROUP_PARENT, h->id);
        assert_true(read_small(p, v, sizeof v));
        assert_string_equal(v, "200");
        snprintf(p, sizeof p, "/sys/fs/cgroup/cpu/%s/%s/cpu.cfs_quota_us", HARNESS_CGROUP_PARENT, h->id);
        assert_true(read_small(p, v, sizeof v));
        assert_string_equal(v, "100000");
}

/* Pids in the sandbox's cgroup, or -1 when the cgroup is gone. */
/* The processes of the sandbox's cgroup and of its leaves (namespace's
 * "agent" and "work"); -1 when the sandbox's cgroup is gone. */
static int harness_cgroup_procs(Harness *h, pid_t *pids, int max) {
        static const char *const leaves[] = {"", "/agent", "/work"};
        int n = 0;
        for (size_t i = 0; i < sizeof leaves / sizeof leaves[0]; i++) {
                char p[PATH_MAX];
                if (access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0)
                        snprintf(p, sizeof p, "/sys/fs/cgroup/%s/%s%s/cgroup.procs", HARNESS_CGROUP_PARENT, h->id,
                                 leaves[i]);
                else
                        snprintf(p, sizeof p, "/sys/fs/cgroup/pids/%s/%s%s/cgroup.procs", HARNESS_CGROUP_PARENT,
                                 h->id, leaves[i]);
                FILE *f = fopen(p, "re");
                if (!f) {
                        if (i == 0)
                                return -1;
                        continue;
                }
                long v;
                while (n < max && fscanf(f, "%ld", &v) == 1)
                        pids[n++] = (pid_t)v;
                fclose(f);
        }
        return n;
}

/* Nothing of the sandbox left on the host: no cgroup in any hierarchy, no
 * mount under its dir in our namespace, no loop device on its layer. */
static void harness_check_clean(Harness *h) {
        pid_t pids[16];
        assert_int_equal(harness_cgroup_procs(h, pids, 16), -1);
        static const char *const hier[] = {"memory", "cpu", "cpuacct", "pids", "freezer", "unified", ""};
        for (size_t i = 0; i < sizeof hier / sizeof hier[0]; i++) {
                char p[PATH_MAX];
                snprintf(p, sizeof p, "/sys/fs/cgroup/%s%s%s/%s", hier[i], hier[i][0] ? "/" : "",
                         HARNESS_CGROUP_PARENT, h->id);
                assert_int_equal(access(p, F_OK), -1);
        }
        assert_false(rootfs_is_mounted(h->sandbox_dir));
        char want[PATH_MAX + 16];
        snprintf(want, sizeof want, "%s/layer.img", h->sandbox_dir);
        DIR *d = opendir("/sys/block");
        assert_non_null(d);
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strncmp(de->d_name, "loop", 4) != 0)
                        continue;
                char p[PATH_MAX], got[PATH_MAX] = "";
                snprintf(p, sizeof p, "/sys/block/%s/loop/backing_file", de->d_name);
                if (read_small(p, got, sizeof got))
                        assert_string_not_equal(got, want);
        }
        closedir(d);
}

/* The whole life of a sandbox: start, HELLO, limits, a write to the layer,
 * stop (nothing left), start again on the same files, destroy. */
static void harness_lifecycle(Harness *h, bool check_uid_map) {
        Conn c;
        DriverInstance *inst = NULL;
        double hello_ms;
        assert_int_equal(harness_start(h, &c, &inst, &hello_ms), 0);
        print_message("%s: start -> HELLO %.1f ms (fresh layer)\n", h->drv->name, hello_ms);
        harness_check_limits(h);

        pid_t pids[64];
        int n = harness_cgroup_procs(h, pids, 64);
        assert_true(n >= 1);

        char out[4096];
        assert_int_equal(conn_exec(&c, 1, "echo kept > /workspace/persist && id -u", out, sizeof out), 0);
        assert_string_equal(out, "0\n");
        if (check_uid_map) {
                /* Root inside is not root outside. */
                assert_int_equal(conn_exec(&c, 3, "cat /proc/self/uid_map", out, sizeof out), 0);
                unsigned in, outside, count;
                assert_int_equal(sscanf(out, "%u %u %u", &in, &outside, &count), 3);
                assert_int_equal(in, 0);
                assert_true(outside >= 65536);
                /* and every process of the sandbox runs as that uid. */
                n = harness_cgroup_procs(h, pids, 64);
                for (int i = 0; i < n; i++) {
                        char p[64];
                        snprintf(p, sizeof p, "/proc/%d", (int)pids[i]);
                        struct stat st;
                        if (stat(p, &st) == 0)
                                assert_int_equal(st.st_uid, outside);
                }
        }
        assert_int_equal(conn_exec(&c, 5, "touch /tmp/t /root/r && echo /workspace/*", out, sizeof out), 0);
        assert_non_null(strstr(out, "persist"));

        DriverStats st;
        assert_int_equal(h->drv->stats(inst, &st), 0);
        assert_true(st.memory_bytes > 0);
        assert_true(st.pids_current >= 1);
        assert_true(st.disk_used_bytes > 0);
        assert_false(st.oom_killed);

        const char *reason = "unset";
        double t0 = harness_now_ms();
        h->drv->stop(inst, &reason);
        print_message("%s: stop %.1f ms\n", h->drv->name, harness_now_ms() - t0);
        assert_null(reason);
        conn_close(&c);
        harness_check_clean(h);
        /* Every process is gone (an orphaned zombie may wait a moment for
         * the host's init to reap it). */
        for (int i = 0; i < n; i++) {
                int tries = 0;
                while (kill(pids[i], 0) == 0 && tries++ < 200) {
                        char p[64], stat[256] = "";
                        snprintf(p, sizeof p, "/proc/%d/stat", (int)pids[i]);
                        if (read_small(p, stat, sizeof stat) && strstr(stat, ") Z "))
                                break;
                        usleep(10000);
                }
                assert_true(tries <= 200);
        }

        /* Again, on the same layer. */
        assert_int_equal(harness_start(h, &c, &inst, &hello_ms), 0);
        print_message("%s: start -> HELLO %.1f ms (existing layer)\n", h->drv->name, hello_ms);
        assert_int_equal(conn_exec(&c, 1, "cat /workspace/persist", out, sizeof out), 0);
        assert_string_equal(out, "kept\n");
        h->drv->stop(inst, NULL);
        conn_close(&c);
        harness_check_clean(h);

        assert_int_equal(h->drv->destroy(&h->spec), 0);
        assert_int_equal(access(h->sandbox_dir, F_OK), -1);
        assert_int_equal(h->drv->destroy(&h->spec), 0);
        h->drv->stop(NULL, NULL);
}

/* A daemon that died: reap_orphan from the spec alone kills and cleans, and
 * keeps the files. */
static void harness_orphan(Harness *h) {
        Conn c;
        DriverInstance *inst = NULL;
        assert_int_equal(harness_start(h, &c, &inst, NULL), 0);
        char out[256];
        assert_int_equal(conn_exec(&c, 1, "echo orphan > /workspace/o", out, sizeof out), 0);
        assert_int_equal(h->drv->reap_orphan(&h->spec), 0);
        harness_check_clean(h);
        assert_int_equal(h->drv->reap_orphan(&h->spec), 0);
        /* The instance of the "dead daemon" is still safe to stop. */
        const char *reason = NULL;
        h->drv->stop(inst, &reason);
        assert_non_null(reason);
        conn_close(&c);
        assert_int_equal(harness_start(h, &c, &inst, NULL), 0);
        assert_int_equal(conn_exec(&c, 1, "cat /workspace/o", out, sizeof out), 0);
        assert_string_equal(out, "orphan\n");
        h->drv->stop(inst, NULL);
        conn_close(&c);
}

typedef struct HarnessThread {
        Harness *h;
        int n;
        int result; /* 0, or the step that failed */
} HarnessThread;

static void *harness_thread(void *arg) {
        HarnessThread *t = arg;
        char id[96], dir[PATH_MAX + 112];
        snprintf(id, sizeof id, "%.60s-t%d", t->h->id, t->n);
        snprintf(dir, sizeof dir, "%s/%s", t->h->sandboxes, id);
        DriverSpec spec = t->h->spec;
        spec.id = id;
        spec.sandbox_dir = dir;
        for (int round = 0; round < 2; round++) {
                int fd;
                DriverInstance *inst;
                if (t->h->drv->start(&spec, &fd, &inst, NULL) < 0) {
                        t->result = 1;
                        return NULL;
                }
                Conn c = {.fd = fd, .r = proto_reader_new()};
                char hello[512], out[256], want[64];
                if (conn_wait(&c, PROTO_HELLO, 0, 60000, NULL, 0, hello, sizeof hello) < 0)
                        t->result = 2;
                snprintf(want, sizeof want, "%d\n", t->n);
                char cmd[64];
                snprintf(cmd, sizeof cmd, "echo %d", t->n);
                if (!t->result && (conn_exec(&c, 1, cmd, out, sizeof out) != 0 || strcmp(out, want) != 0))
                        t->result = 3;
                t->h->drv->stop(inst, NULL);
                conn_close(&c);
                if (t->result)
                        break;
        }
        if (t->h->drv->destroy(&spec) < 0 && !t->result)
                t->result = 4;
        return NULL;
}

/* Several sandboxes started and stopped at once from threads of one
 * process, as the daemon does: forks in a threaded process, loop devices
 * and templates claimed concurrently. */
static void harness_concurrent(Harness *h, int n) {
        pthread_t th[16];
        HarnessThread ts[16];
        if (n > 16)
                n = 16;
        for (int i = 0; i < n; i++) {
                ts[i] = (HarnessThread){.h = h, .n = i};
                assert_int_equal(pthread_create(&th[i], NULL, harness_thread, &ts[i]), 0);
        }
        for (int i = 0; i < n; i++) {
                pthread_join(th[i], NULL);
                if (ts[i].result)
                        fail_msg("sandbox %d failed at step %d", i, ts[i].result);
        }
}

/* A layer that is not a filesystem: the start fails with an error (the
 * child's mount fails before exec), and nothing is left running. */
static void harness_bad_layer(Harness *h) {
        char p[PATH_MAX + 16];
        assert_int_equal(mkdir(h->sandbox_dir, 0700), 0);
        snprintf(p, sizeof p, "%s/layer.img", h->sandbox_dir);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        static const char junk[4096] = "not an ext4 filesystem";
        for (int i = 0; i < 256; i++)
                assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
        close(fd);
        int cfd = -1;
        DriverInstance *inst = NULL;
        int r = h->drv->start(&h->spec, &cfd, &inst, NULL);
        assert_true(r < 0);
        harness_check_clean(h);
        assert_int_equal(h->drv->destroy(&h->spec), 0);
        assert_int_equal(access(h->sandbox_dir, F_OK), -1);
}

/* Bad specs are refused before anything is made. */
static void harness_bad_specs(Harness *h) {
        int fd;
        DriverInstance *inst;
        DriverSpec s = h->spec;
        s.id = "../escape";
        assert_int_equal(h->drv->start(&s, &fd, &inst, NULL), -EINVAL);
        s = h->spec;
        s.id = "";
        assert_int_equal(h->drv->start(&s, &fd, &inst, NULL), -EINVAL);
        s = h->spec;
        s.cgroup_parent = "../../x";
        assert_int_equal(h->drv->start(&s, &fd, &inst, NULL), -EINVAL);
        s = h->spec;
        s.sandbox_dir = "relative/dir";
        assert_int_equal(h->drv->start(&s, &fd, &inst, NULL), -EINVAL);
        s = h->spec;
        s.image_dir = "/nonexistent-image";
        assert_int_equal(h->drv->start(&s, &fd, &inst, NULL), -ENOENT);
        s = h->spec;
        s.memory_mib = 1u << 30;
        assert_int_equal(h->drv->start(&s, &fd, &inst, NULL), -EINVAL);
        assert_int_equal(access(h->sandbox_dir, F_OK), -1);
        assert_int_equal(h->drv->destroy(&(DriverSpec){.id = "../x", .sandbox_dir = "/x", .image_dir = "/x",
                                                       .agent_path = "/x"}),
                         -EINVAL);
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/* RUNTIME_TEST_BENCH=N: N starts on one layer, start -> HELLO and
 * start -> first exec result, p50 and p90. */
static void harness_bench(Harness *h) {
        const char *env = getenv("RUNTIME_TEST_BENCH");
        int n = env ? atoi(env) : 0;
        if (n <= 0) {
                print_message("skip: set RUNTIME_TEST_BENCH=N to measure N starts\n");
                skip();
        }
        if (n > 1000)
                n = 1000;
        static double hello[1000], first[1000];
        for (int i = 0; i < n; i++) {
                Conn c;
                DriverInstance *inst;
                double t0 = harness_now_ms();
                assert_int_equal(harness_start(h, &c, &inst, &hello[i]), 0);
                char out[64];
                assert_int_equal(conn_exec(&c, 1, "true", out, sizeof out), 0);
                first[i] = harness_now_ms() - t0;
                h->drv->stop(inst, NULL);
                conn_close(&c);
        }
        qsort(hello, (size_t)n, sizeof *hello, cmp_double);
        qsort(first, (size_t)n, sizeof *first, cmp_double);
        print_message("%s: %d starts: start -> HELLO p50 %.1f ms p90 %.1f ms; start -> first exec p50 %.1f ms "
                      "p90 %.1f ms\n",
                      h->drv->name, n, hello[n / 2], hello[(n * 9) / 10], first[n / 2], first[(n * 9) / 10]);
}
