/* Where an exec's time goes inside a sandbox: run in one (built static by
 * bench/quiet_exec.py --breakdown, copied in and run as root), it starts
 * children the ways the agent does and times each from the clone to the
 * reap, after a pause of 20-50 ms (quiet) or back to back, the ways taking
 * turns. Prints one line a way: name, p50 and p90 in ms. Run on the host
 * too, its python3 line is the limit that gVisor's own start of python3 is
 * compared with, without the daemon, the channel or the agent.
 *
 *   exec_probe RUNS QUIET      (QUIET 1 or 0)
 *   exec_probe --exit          (what the "static binary" way execs: itself)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RUNS 400
#define STACK_BYTES (256u * 1024u)

enum { WAY_DYNAMIC, WAY_PATH, WAY_STATIC, WAY_TASK, WAY_TASK_CGROUP, WAY_PYTHON, N_WAYS };
static const char *const way_names[N_WAYS] = {
        "execve /usr/bin/true", "execvpe true (a search of PATH)", "execve a static binary", "vfork, _exit", "vfork, cgroup join, _exit",
        "execve /usr/bin/python3 -c 'print(6*7)'",
};

/* The commands' cgroup the agent moves each child into: gVisor's, one per
 * controller; the namespace driver's leaf is not visible from inside. */
static int cgroup_fds[3] = {-1, -1, -1};
static int way;
static char self[4096];

static double now_ms(void) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int child(void *unused) {
        (void)unused;
        static char *const env[] = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        if (way == WAY_TASK_CGROUP)
                for (int i = 0; i < 3; i++)
                        if (cgroup_fds[i] >= 0 && write(cgroup_fds[i], "0", 1) != 1)
                                _exit(125);
        if (way == WAY_DYNAMIC) {
                char *const argv[] = { "true", NULL };
                execve("/usr/bin/true", argv, env);
                _exit(127);
        }
        if (way == WAY_PATH) {
                char *const argv[] = { "true", NULL };
                execvpe("true", argv, env);
                _exit(127);
        }
        if (way == WAY_PYTHON) {
                char *const argv[] = { "python3", "-c", "print(6*7)", NULL };
                int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
                if (null < 0 || dup2(null, 1) != 1)
                        _exit(126);
                execve("/usr/bin/python3", argv, env);
                _exit(127);
        }
        if (way == WAY_STATIC) {
                char *const argv[] = { self, "--exit", NULL };
                execve(self, argv, env);
                _exit(127);
        }
        _exit(0);
}

static int cmp(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return (x > y) - (x < y);
}

int main(int argc, char **argv) {
        if (argc == 2 && strcmp(argv[1], "--exit") == 0)
                return 0;
        int runs = argc > 1 ? atoi(argv[1]) : 40;
        int quiet = argc > 2 ? atoi(argv[2]) : 1;
        if (runs < 1 || runs > MAX_RUNS)
                return 2;
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
                return 2;
        self[n] = '\0';
        static const char *const controllers[] = { "memory", "cpu", "pids" };
        for (int i = 0; i < 3; i++) {
                char p[128];
                snprintf(p, sizeof p, "/sys/fs/cgroup/%s/sandbox/cgroup.procs", controllers[i]);
                cgroup_fds[i] = open(p, O_WRONLY | O_CLOEXEC);
        }
        char *stack = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (stack == MAP_FAILED)
                return 2;
        static double ms[N_WAYS][MAX_RUNS];
        srand(1);
        for (int i = -3; i < runs; i++)
                for (int w = 0; w < N_WAYS; w++) {
                        way = (w + (i & 1)) % N_WAYS;
                        if (quiet) {
                                struct timespec pause = { 0, (20 + rand() % 31) * 1000000L };
                                nanosleep(&pause, NULL);
                        }
                        double t = now_ms();
                        pid_t pid = clone(child, stack + STACK_BYTES, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
                        int status;
                        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
                                return 1;
                        if (i >= 0)
                                ms[way][i] = now_ms() - t;
                }
        for (int w = 0; w < N_WAYS; w++) {
                qsort(ms[w], (size_t)runs, sizeof ms[w][0], cmp);
                printf("%s\t%.3f\t%.3f\n", way_names[w], ms[w][runs / 2], ms[w][runs * 9 / 10]);
        }
        return 0;
}
