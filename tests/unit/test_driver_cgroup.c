/*
 * src/driver/cgroup.c against fake cgroup trees of plain files: layout
 * detection (v1, hybrid, v2), limits written where the kernel expects them,
 * stats parsed from the files the kernel writes, and the pure helpers.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/path.h"
#include "driver/cgroup.h"
#include "driver/rootfs.h"

static void mkdirs(const char *fmt, ...) {
        char p[PATH_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p, sizeof p, fmt, ap);
        va_end(ap);
        for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
                *s = '\0';
                (void)mkdir(p, 0755);
                *s = '/';
        }
        (void)mkdir(p, 0755);
}

static void put(const char *dir, const char *name, const char *content) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fputs(content, f);
        fclose(f);
}

static void get(const char *dir, const char *name, char *buf, size_t len) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        FILE *f = fopen(p, "r");
        assert_non_null(f);
        size_t n = fread(buf, 1, len - 1, f);
        buf[n] = '\0';
        fclose(f);
}

typedef struct Tree {
        char root[128];
} Tree;

static int tree_setup(void **state) {
        Tree *t = calloc(1, sizeof *t);
        snprintf(t->root, sizeof t->root, "/tmp/runtime-cgtest-XXXXXX");
        assert_non_null(mkdtemp(t->root));
        *state = t;
        return 0;
}

static int tree_teardown(void **state) {
        Tree *t = *state;
        (void)path_remove_tree_at(AT_FDCWD, t->root);
        free(t);
        return 0;
}

/* A v1 hierarchy as the kernel shows it, with the sandbox's files. */
static void v1_hier(const Tree *t, const char *ctrl, const char *const *files) {
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s/%s", t->root, ctrl);
        mkdirs("%s", d);
        put(d, "cgroup.procs", "");
        snprintf(d, sizeof d, "%s/%s/runtime/sbx1", t->root, ctrl);
        mkdirs("%s", d);
        put(d, "cgroup.procs", "");
        for (size_t i = 0; files && files[i]; i++)
                put(d, files[i], "");
}

static void make_v1(const Tree *t, bool hybrid) {
        static const char *const mem[] = {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                                          "memory.oom_control", "memory.usage_in_bytes",
                                          "memory.max_usage_in_bytes", NULL};
        static const char *const cpu[] = {"cpu.cfs_period_us", "cpu.cfs_quota_us", NULL};
        static const char *const acct[] = {"cpuacct.usage", NULL};
        static const char *const pids[] = {"pids.max", "pids.current", NULL};
        static const char *const frz[] = {"freezer.state", NULL};
        v1_hier(t, "memory", mem);
        v1_hier(t, "cpu", cpu);
        v1_hier(t, "cpuacct", acct);
        v1_hier(t, "pids", pids);
        v1_hier(t, "freezer", frz);
        if (hybrid) {
                v1_hier(t, "unified", NULL);
                char d[PATH_MAX];
                snprintf(d, sizeof d, "%s/unified", t->root);
                put(d, "cgroup.controllers", "");
        }
}

static void test_detect_v1_hybrid(void **state) {
        Tree *t = *state;
        make_v1(t, true);
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        assert_false(l.v2);
        assert_non_null(l.hier[CGROUP_MEMORY]);
        assert_non_null(l.hier[CGROUP_PIDS]);
        assert_non_null(l.hier[CGROUP_FREEZER]);
        assert_non_null(l.hier[CGROUP_UNIFIED]);
        assert_true(strstr(l.hier[CGROUP_UNIFIED], "/unified") != NULL);
        cgroup_layout_done(&l);
}

static void test_detect_v1_plain_and_missing(void **state) {
        Tree *t = *state;
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), -ENOENT);
        make_v1(t, false);
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        assert_false(l.v2);
        assert_null(l.hier[CGROUP_UNIFIED]);
        cgroup_layout_done(&l);
}

static void test_v1_limits_and_stats(void **state) {
        Tree *t = *state;
        make_v1(t, true);
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        Cgroup *cg;
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", true, &cg), 0);
        CgroupLimits lim = {.memory_bytes = 512ull << 20, .vcpu = 2, .pids_max = 256};
        assert_int_equal(cgroup_set_limits(cg, &lim), 0);

        char d[PATH_MAX], buf[128];
        snprintf(d, sizeof d, "%s/memory/runtime/sbx1", t->root);
        get(d, "memory.limit_in_bytes", buf, sizeof buf);
        assert_string_equal(buf, "536870912");
        get(d, "memory.memsw.limit_in_bytes", buf, sizeof buf);
        assert_string_equal(buf, "536870912");
        snprintf(d, sizeof d, "%s/cpu/runtime/sbx1", t->root);
        get(d, "cpu.cfs_quota_us", buf, sizeof buf);
        assert_string_equal(buf, "200000");
        get(d, "cpu.cfs_period_us", buf, sizeof buf);
        assert_string_equal(buf, "100000");
        snprintf(d, sizeof d, "%s/pids/runtime/sbx1", t->root);
        get(d, "pids.max", buf, sizeof buf);
        assert_string_equal(buf, "256");

        /* Stats as the kernel writes them. */
        put(d, "pids.current", "7\n");
        snprintf(d, sizeof d, "%s/cpuacct/runtime/sbx1", t->root);
        put(d, "cpuacct.usage", "123456789\n");
        snprintf(d, sizeof d, "%s/memory/runtime/sbx1", t->root);
        put(d, "memory.usage_in_bytes", "1048576\n");
        put(d, "memory.max_usage_in_bytes", "4194304\n");
        put(d, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
        CgroupStats s;
        assert_int_equal(cgroup_read_stats(cg, &s), 0);
        assert_int_equal(s.cpu_usage_ns, 123456789);
        assert_int_equal(s.memory_bytes, 1048576);
        assert_int_equal(s.memory_peak_bytes, 4194304);
        assert_int_equal(s.pids_current, 7);
        assert_int_equal(s.oom_kills, 2);

        /* No limits: the "unlimited" spellings of v1. */
        CgroupLimits none = {0};
        assert_int_equal(cgroup_set_limits(cg, &none), 0);
        get(d, "memory.limit_in_bytes", buf, sizeof buf);
        assert_string_equal(buf, "-1");
        snprintf(d, sizeof d, "%s/cpu/runtime/sbx1", t->root);
        get(d, "cpu.cfs_quota_us", buf, sizeof buf);
        assert_string_equal(buf, "-1");

        /* An empty cgroup is killed at once. */
        assert_int_equal(cgroup_count_procs(cg), 0);
        assert_int_equal(cgroup_kill_all(cg, 100), 0);
        assert_true(cgroup_exists(cg));
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

/* The namespace driver's leaves: made in every hierarchy the sandbox has,
 * limits and CPU weight where the kernel keeps them, join files opened
 * (v1 "tasks", the v2 mount's cgroup.procs). */
static void test_children(void **state) {
        Tree *t = *state;
        make_v1(t, true);
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        Cgroup *cg, *work, *agent;
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", true, &cg), 0);
        assert_int_equal(cgroup_new_child(cg, "..", true, &work), -EINVAL);
        assert_int_equal(cgroup_new_child(cg, "a/b", true, &work), -EINVAL);
        assert_int_equal(cgroup_new_child(cg, "work", true, &work), 0);
        assert_int_equal(cgroup_new_child(cg, "agent", true, &agent), 0);
        static const char *const ctrls[] = {"memory", "cpu", "cpuacct", "pids", "freezer", "unified"};
        char d[PATH_MAX], buf[128];
        for (size_t i = 0; i < sizeof ctrls / sizeof ctrls[0]; i++) {
                snprintf(d, sizeof d, "%s/%s/runtime/sbx1/work", t->root, ctrls[i]);
                struct stat st;
                assert_int_equal(stat(d, &st), 0);
                assert_true(S_ISDIR(st.st_mode));
                put(d, strcmp(ctrls[i], "unified") == 0 ? "cgroup.procs" : "tasks", "");
        }
        /* What the kernel would show in the leaves. */
        snprintf(d, sizeof d, "%s/memory/runtime/sbx1/work", t->root);
        put(d, "memory.limit_in_bytes", "");
        put(d, "memory.oom_control", "");
        snprintf(d, sizeof d, "%s/cpu/runtime/sbx1/work", t->root);
        put(d, "cpu.cfs_period_us", "");
        put(d, "cpu.cfs_quota_us", "");
        snprintf(d, sizeof d, "%s/pids/runtime/sbx1/work", t->root);
        put(d, "pids.max", "");
        snprintf(d, sizeof d, "%s/cpu/runtime/sbx1/agent", t->root);
        put(d, "cpu.shares", "1024");

        CgroupLimits lim = {.memory_bytes = 480ull << 20, .vcpu = 1, .pids_max = 4032};
        assert_int_equal(cgroup_set_limits(work, &lim), 0);
        snprintf(d, sizeof d, "%s/pids/runtime/sbx1/work", t->root);
        get(d, "pids.max", buf, sizeof buf);
        assert_string_equal(buf, "4032");
        assert_int_equal(cgroup_set_cpu_weight(agent, 10240, 1000), 0);
        snprintf(d, sizeof d, "%s/cpu/runtime/sbx1/agent", t->root);
        get(d, "cpu.shares", buf, sizeof buf);
        assert_string_equal(buf, "10240");
        /* v1: children need nothing enabled. */
        assert_int_equal(cgroup_enable_children(cg), 0);

        int fds[_CGROUP_HIER_MAX];
        assert_int_equal(cgroup_open_join(work, fds, 2), -ENOBUFS);
        assert_int_equal(cgroup_open_join(work, fds, _CGROUP_HIER_MAX), 0);
        size_t n = 0;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++)
                if (fds[i] >= 0) {
                        assert_int_equal(write(fds[i], "0", 1), 1);
                        n++;
                }
        assert_int_equal(n, 6);
        cgroup_close_fds(fds, _CGROUP_HIER_MAX);
        snprintf(d, sizeof d, "%s/pids/runtime/sbx1/work", t->root);
        get(d, "tasks", buf, sizeof buf);
        assert_string_equal(buf, "0");
        snprintf(d, sizeof d, "%s/unified/runtime/sbx1/work", t->root);
        get(d, "cgroup.procs", buf, sizeof buf);
        assert_string_equal(buf, "0");
        /* The agent leaf lacks tasks files: refused, nothing left open. */
        assert_int_equal(cgroup_open_join(agent, fds, _CGROUP_HIER_MAX), -ENOENT);
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++)
                assert_int_equal(fds[i], -1);

        snprintf(d, sizeof d, "%s/memory/runtime/sbx1/work", t->root);
        get(d, "memory.limit_in_bytes", buf, sizeof buf);
        assert_string_equal(buf, "503316480");
        put(d, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
        CgroupStats s;
        assert_int_equal(cgroup_read_stats(work, &s), 0);
        assert_int_equal(s.oom_kills, 3);
        /* Opened without create: the same directories. */
        Cgroup *again;
        assert_int_equal(cgroup_new_child(cg, "work", false, &again), 0);
        assert_string_equal(cgroup_dir(again, CGROUP_PIDS), cgroup_dir(work, CGROUP_PIDS));
        cgroup_free(again);
        cgroup_free(work);
        cgroup_free(agent);
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

static void test_v2_limits_and_stats(void **state) {
        Tree *t = *state;
        put(t->root, "cgroup.controllers", "cpu memory pids\n");
        put(t->root, "cgroup.procs", "");
        put(t->root, "cgroup.subtree_control", "");
        char d[PATH_MAX], buf[PATH_MAX];
        snprintf(d, sizeof d, "%s/runtime", t->root);
        mkdirs("%s", d);
        put(d, "cgroup.subtree_control", "");
        snprintf(d, sizeof d, "%s/runtime/sbx1", t->root);
        mkdirs("%s", d);
        static const char *const files[] = {"memory.max", "memory.swap.max", "cpu.max", "pids.max",
                                            "cgroup.procs", "cpu.stat", "memory.current", "memory.peak",
                                            "pids.current", "memory.events", NULL};
        for (size_t i = 0; files[i]; i++)
                put(d, files[i], "");

        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        assert_true(l.v2);
        Cgroup *cg;
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", true, &cg), 0);
        CgroupLimits lim = {.memory_bytes = 1ull << 30, .vcpu = 1, .pids_max = 100};
        assert_int_equal(cgroup_set_limits(cg, &lim), 0);
        get(d, "memory.max", buf, sizeof buf);
        assert_string_equal(buf, "1073741824");
        get(d, "memory.swap.max", buf, sizeof buf);
        assert_string_equal(buf, "0");
        get(d, "cpu.max", buf, sizeof buf);
        assert_string_equal(buf, "100000 100000");
        get(d, "pids.max", buf, sizeof buf);
        assert_string_equal(buf, "100");
        /* The controllers were enabled on the way down (last write wins in
         * a plain file). */
        snprintf(buf, sizeof buf, "%s/runtime", t->root);
        char sc[64];
        get(buf, "cgroup.subtree_control", sc, sizeof sc);
        assert_string_equal(sc, "+pids");

        put(d, "cpu.stat", "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n");
        put(d, "memory.current", "8192\n");
        put(d, "memory.peak", "16384\n");
        put(d, "pids.current", "3\n");
        put(d, "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n");
        CgroupStats s;
        assert_int_equal(cgroup_read_stats(cg, &s), 0);
        assert_int_equal(s.cpu_usage_ns, 2500000);
        assert_int_equal(s.memory_bytes, 8192);
        assert_int_equal(s.memory_peak_bytes, 16384);
        assert_int_equal(s.pids_current, 3);
        assert_int_equal(s.oom_kills, 1);
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

/* The freezer: v1 (and hybrid) writes freezer.state and waits until it
 * reads FROZEN; v2 writes cgroup.freeze and waits for "frozen 1" in
 * cgroup.events, undoing the freeze when it never comes. */
static void test_freeze(void **state) {
        Tree *t = *state;
        make_v1(t, true);
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        Cgroup *cg;
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", true, &cg), 0);
        char d[PATH_MAX], buf[64];
        snprintf(d, sizeof d, "%s/freezer/runtime/sbx1", t->root);
        assert_int_equal(cgroup_freeze(cg, true, 1000), 0);
        get(d, "freezer.state", buf, sizeof buf);
        assert_string_equal(buf, "FROZEN");
        assert_int_equal(cgroup_freeze(cg, false, 0), 0);
        get(d, "freezer.state", buf, sizeof buf);
        assert_string_equal(buf, "THAWED");
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

static void test_freeze_v2_timeout(void **state) {
        Tree *t = *state;
        put(t->root, "cgroup.controllers", "cpu memory pids\n");
        put(t->root, "cgroup.procs", "");
        put(t->root, "cgroup.subtree_control", "");
        char d[PATH_MAX], buf[64];
        snprintf(d, sizeof d, "%s/runtime/sbx1", t->root);
        mkdirs("%s", d);
        put(d, "cgroup.procs", "");
        put(d, "cgroup.freeze", "0");
        /* A task that never freezes: the kernel would keep saying 0. */
        put(d, "cgroup.events", "populated 1\nfrozen 0\n");
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        Cgroup *cg;
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", false, &cg), 0);
        assert_int_equal(cgroup_freeze(cg, true, 50), -ETIMEDOUT);
        get(d, "cgroup.freeze", buf, sizeof buf);
        assert_string_equal(buf, "0");
        put(d, "cgroup.events", "populated 1\nfrozen 1\n");
        assert_int_equal(cgroup_freeze(cg, true, 50), 0);
        get(d, "cgroup.freeze", buf, sizeof buf);
        assert_string_equal(buf, "1");
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

static void test_open_missing_and_remove(void **state) {
        Tree *t = *state;
        make_v1(t, false);
        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        Cgroup *cg;
        /* Opening one that does not exist: nothing to do, no error. */
        assert_int_equal(cgroup_new(&l, "runtime", "gone", false, &cg), 0);
        assert_false(cgroup_exists(cg));
        assert_int_equal(cgroup_count_procs(cg), 0);
        assert_int_equal(cgroup_kill_all(cg, 100), 0);
        assert_int_equal(cgroup_remove(cg), 0);
        CgroupStats s;
        assert_true(cgroup_read_stats(cg, &s) < 0);
        cgroup_free(cg);
        /* Created, empty dirs (a fake tree has no kernel to empty them):
         * removed in every hierarchy. */
        assert_int_equal(cgroup_new(&l, "runtime", "fresh", true, &cg), 0);
        assert_true(cgroup_exists(cg));
        assert_int_equal(cgroup_remove(cg), 0);
        assert_false(cgroup_exists(cg));
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

/* The CPUs of a sandbox's cgroup (gVisor's start, gvisor.c): v1 writes
 * the cpuset directory made with the parent's CPUs and memory nodes, NULL
 * gives back all of the parent's; v2 enables the cpuset controller above
 * and takes the parent's effective set; anything but a CPU list is
 * refused before it reaches the kernel. */
static void test_set_cpus(void **state) {
        Tree *t = *state;
        make_v1(t, true);
        CgroupLayout l;
        Cgroup *cg;
        char d[PATH_MAX], buf[64];

        /* No cpuset hierarchy: nothing to pin with. */
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", true, &cg), 0);
        assert_int_equal(cgroup_set_cpus(cg, "0"), -ENOENT);
        cgroup_free(cg);
        cgroup_layout_done(&l);

        static const char *const cpuset[] = {"cpuset.cpus", "cpuset.mems", NULL};
        v1_hier(t, "cpuset", cpuset);
        snprintf(d, sizeof d, "%s/cpuset", t->root);
        put(d, "cpuset.cpus", "0-3\n");
        put(d, "cpuset.mems", "0\n");
        snprintf(d, sizeof d, "%s/cpuset/runtime", t->root);
        put(d, "cpuset.cpus", "");
        put(d, "cpuset.mems", "");
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", true, &cg), 0);
        snprintf(d, sizeof d, "%s/cpuset/runtime/sbx1", t->root);
        get(d, "cpuset.cpus", buf, sizeof buf);
        assert_string_equal(buf, "0-3\n");
        assert_int_equal(cgroup_set_cpus(cg, "1,3"), 0);
        get(d, "cpuset.cpus", buf, sizeof buf);
        assert_string_equal(buf, "1,3");
        assert_int_equal(cgroup_set_cpus(cg, NULL), 0);
        get(d, "cpuset.cpus", buf, sizeof buf);
        assert_string_equal(buf, "0-3");
        assert_int_equal(cgroup_set_cpus(cg, ""), -EINVAL);
        assert_int_equal(cgroup_set_cpus(cg, "0\n1"), -EINVAL);
        assert_int_equal(cgroup_set_cpus(cg, "max"), -EINVAL);
        get(d, "cpuset.cpus", buf, sizeof buf);
        assert_string_equal(buf, "0-3");
        /* A parent with no CPUs to give. */
        snprintf(d, sizeof d, "%s/cpuset/runtime", t->root);
        put(d, "cpuset.cpus", "\n");
        assert_int_equal(cgroup_set_cpus(cg, NULL), -ENOENT);
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

static void test_set_cpus_v2(void **state) {
        Tree *t = *state;
        put(t->root, "cgroup.controllers", "cpuset cpu memory pids\n");
        put(t->root, "cgroup.procs", "");
        put(t->root, "cgroup.subtree_control", "");
        char d[PATH_MAX], buf[64];
        snprintf(d, sizeof d, "%s/runtime", t->root);
        mkdirs("%s", d);
        put(d, "cgroup.controllers", "cpuset cpu memory pids\n");
        put(d, "cgroup.subtree_control", "");
        put(d, "cpuset.cpus.effective", "0-7\n");
        snprintf(d, sizeof d, "%s/runtime/sbx1", t->root);
        mkdirs("%s", d);
        put(d, "cgroup.controllers", "");
        put(d, "cgroup.procs", "");
        put(d, "cpuset.cpus", "");

        CgroupLayout l;
        assert_int_equal(cgroup_layout_detect(t->root, &l), 0);
        Cgroup *cg;
        assert_int_equal(cgroup_new(&l, "runtime", "sbx1", false, &cg), 0);
        assert_int_equal(cgroup_set_cpus(cg, "2"), 0);
        get(d, "cpuset.cpus", buf, sizeof buf);
        assert_string_equal(buf, "2");
        get(t->root, "cgroup.subtree_control", buf, sizeof buf);
        assert_string_equal(buf, "+cpuset");
        snprintf(d, sizeof d, "%s/runtime", t->root);
        get(d, "cgroup.subtree_control", buf, sizeof buf);
        assert_string_equal(buf, "+cpuset");
        assert_int_equal(cgroup_set_cpus(cg, NULL), 0);
        snprintf(d, sizeof d, "%s/runtime/sbx1", t->root);
        get(d, "cpuset.cpus", buf, sizeof buf);
        assert_string_equal(buf, "0-7");
        cgroup_free(cg);
        cgroup_layout_done(&l);
}

static void test_names(void **state) {
        (void)state;
        assert_true(cgroup_name_valid("sbx_abc-1", false));
        assert_true(cgroup_name_valid("runtime/sub", true));
        assert_false(cgroup_name_valid("runtime/sub", false));
        assert_false(cgroup_name_valid("", false));
        assert_false(cgroup_name_valid(NULL, false));
        assert_false(cgroup_name_valid("..", false));
        assert_false(cgroup_name_valid(".", false));
        assert_false(cgroup_name_valid("a/../b", true));
        assert_false(cgroup_name_valid("/abs", true));
        assert_false(cgroup_name_valid("trail/", true));
        assert_false(cgroup_name_valid("a//b", true));
        assert_false(cgroup_name_valid("sp ace", false));
        assert_false(cgroup_name_valid("nl\n", false));
        char longname[300];
        memset(longname, 'a', sizeof longname - 1);
        longname[sizeof longname - 1] = '\0';
        assert_false(cgroup_name_valid(longname, false));

        CgroupLayout l = {0};
        Cgroup *cg;
        assert_int_equal(cgroup_new(&l, "runtime", "../../etc", true, &cg), -EINVAL);
        assert_int_equal(cgroup_new(&l, "../x", "ok", true, &cg), -EINVAL);
}

static void test_helpers(void **state) {
        (void)state;
        char buf[32];
        assert_int_equal(cgroup_format_cpu_max(0, buf, sizeof buf), 0);
        assert_string_equal(buf, "max 100000");
        assert_int_equal(cgroup_format_cpu_max(4, buf, sizeof buf), 0);
        assert_string_equal(buf, "400000 100000");
        assert_int_equal(cgroup_format_cpu_max(4, buf, 4), -ENOBUFS);

        uint64_t v;
        assert_int_equal(cgroup_parse_keyed("a 1\noom_kill 5\n", "oom_kill", &v), 0);
        assert_int_equal(v, 5);
        assert_int_equal(cgroup_parse_keyed("oom_kill_disable 0\noom_kill 9", "oom_kill", &v), 0);
        assert_int_equal(v, 9);
        assert_int_equal(cgroup_parse_keyed("oom 1\n", "oom_kill", &v), -ENOENT);
        assert_int_equal(cgroup_parse_keyed("oom_kill x\n", "oom_kill", &v), -EINVAL);
        assert_int_equal(cgroup_parse_keyed("", "oom_kill", &v), -ENOENT);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_detect_v1_hybrid, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_detect_v1_plain_and_missing, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_v1_limits_and_stats, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_v2_limits_and_stats, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_children, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_open_missing_and_remove, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_freeze, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_freeze_v2_timeout, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_set_cpus, tree_setup, tree_teardown),
                cmocka_unit_test_setup_teardown(test_set_cpus_v2, tree_setup, tree_teardown),
                cmocka_unit_test(test_names),
                cmocka_unit_test(test_helpers),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
