/* The sudo gateway's wire and policy (src/agent/sudo_wire.c): the front's
 * command line, a request both ways and its bounds, and what the command
 * gets (environment, argv, groups, shell); and the command's start with a
 * terminal of its own (src/agent/sudo_gateway.c). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/ioctl.h>

#include <cmocka.h>

#include "agent/sudo_gateway.h"
#include "agent/sudo_wire.h"

static int parse(SudoOptions *o, char *err, ...) {
        char *argv[32];
        int argc = 0;
        va_list ap;
        va_start(ap, err);
        for (char *a; argc < 31 && (a = va_arg(ap, char *));)
                argv[argc++] = a;
        va_end(ap);
        argv[argc] = NULL;
        static char *keep[32];
        memcpy(keep, argv, sizeof argv);
        return sudo_parse_options(argc, keep, o, err, 256);
}

static void test_options(void **state) {
        (void)state;
        SudoOptions o;
        char err[256];
        assert_int_equal(parse(&o, err, "sudo", "id", "-u", NULL), 0);
        assert_int_equal(o.action, SUDO_ACTION_RUN);
        assert_null(o.user);
        assert_int_equal(o.argc, 2);
        assert_string_equal(o.argv[0], "id");
        assert_string_equal(o.argv[1], "-u");

        assert_int_equal(parse(&o, err, "sudo", "-n", "-u", "sandbox", "-E", "true", NULL), 0);
        assert_string_equal(o.user, "sandbox");
        assert_true(o.flags & SUDO_PRESERVE_ENV);
        assert_int_equal(parse(&o, err, "sudo", "-nuroot", "true", NULL), 0);
        assert_string_equal(o.user, "root");
        assert_int_equal(parse(&o, err, "sudo", "--user=x", "--preserve-env=A,B", "--", "-weird", NULL), 0);
        assert_string_equal(o.user, "x");
        assert_string_equal(o.preserve, "A,B");
        assert_string_equal(o.argv[0], "-weird");

        assert_int_equal(parse(&o, err, "sudo", "A=1", "B=2", "env", "C=3", NULL), 0);
        assert_int_equal(o.setc, 2);
        assert_string_equal(o.set[1], "B=2");
        assert_int_equal(o.argc, 2);
        free(o.set);

        assert_int_equal(parse(&o, err, "sudo", "-i", NULL), 0);
        assert_true(o.flags & SUDO_LOGIN);
        assert_int_equal(o.argc, 0);
        assert_int_equal(parse(&o, err, "sudo", "-k", NULL), 0);
        assert_int_equal(o.action, SUDO_ACTION_VALIDATE);
        assert_int_equal(parse(&o, err, "sudo", "-l", NULL), 0);
        assert_int_equal(o.action, SUDO_ACTION_LIST);

        /* Refused, each with a message that says what. */
        assert_int_equal(parse(&o, err, "sudo", NULL), -EINVAL);
        assert_int_equal(parse(&o, err, "sudo", "-i", "-s", "x", NULL), -EINVAL);
        assert_int_equal(parse(&o, err, "sudo", "-b", "x", NULL), -EINVAL);
        assert_non_null(strstr(err, "not supported"));
        assert_int_equal(parse(&o, err, "sudo", "-g", "root", "x", NULL), -EINVAL);
        assert_int_equal(parse(&o, err, "sudo", "--chroot=/", "x", NULL), -EINVAL);
        assert_int_equal(parse(&o, err, "sudo", "-u", NULL), -EINVAL);
        assert_non_null(strstr(err, "requires an argument"));
        assert_int_equal(parse(&o, err, "sudo", "-Z", "x", NULL), -EINVAL);
}

static void encode(SudoOptions *o, char *const env[], SudoHeader *h, char **payload) {
        assert_int_equal(sudo_request_encode(o, "/work dir", env, h, payload), 0);
}

static void test_request_round_trip(void **state) {
        (void)state;
        SudoOptions o;
        char err[256];
        assert_int_equal(parse(&o, err, "sudo", "-u", "sandbox", "X=1", "sh", "-c", "echo hi", NULL), 0);
        char *env[] = { "HOME=/workspace", "noequals", "=x", "TERM=xterm", NULL };
        SudoHeader h;
        char *payload;
        encode(&o, env, &h, &payload);
        assert_int_equal(h.argc, 3);
        assert_int_equal(h.envc, 2); /* the malformed ones are not sent */
        assert_int_equal(h.setc, 1);
        SudoRequest r;
        assert_int_equal(sudo_request_parse(&h, payload, &r), 0);
        assert_string_equal(r.user, "sandbox");
        assert_string_equal(r.cwd, "/work dir");
        assert_string_equal(r.argv[2], "echo hi");
        assert_null(r.argv[3]);
        assert_string_equal(r.env[1], "TERM=xterm");
        assert_null(r.env[2]);
        assert_string_equal(r.set[0], "X=1");
        assert_null(r.set[1]);
        sudo_request_free(&r);

        /* Every byte cut off, or one added, is malformed. */
        for (uint32_t len = 0; len < h.len; len++) {
                SudoHeader c = h;
                c.len = len;
                assert_true(sudo_request_parse(&c, payload, &r) < 0);
        }
        char *longer = malloc(h.len + 1);
        memcpy(longer, payload, h.len);
        longer[h.len] = 'x';
        SudoHeader c = h;
        c.len++;
        assert_int_equal(sudo_request_parse(&c, longer, &r), -EPROTO);
        free(longer);
        free(payload);
        free(o.set);
}

static void test_request_bounds(void **state) {
        (void)state;
        SudoHeader ok = { SUDO_MAGIC, SUDO_VERSION, 0, 1, 0, 0, 8 };
        assert_int_equal(sudo_header_check(&ok), 0);
        SudoHeader h = ok;
        h.magic ^= 1;
        assert_int_equal(sudo_header_check(&h), -EPROTO);
        h = ok;
        h.version = 2;
        assert_int_equal(sudo_header_check(&h), -EPROTO);
        h = ok;
        h.flags = 0x80;
        assert_int_equal(sudo_header_check(&h), -EPROTO);
        h = ok;
        h.argc = SUDO_ARGC_MAX + 1;
        assert_int_equal(sudo_header_check(&h), -E2BIG);
        h = ok;
        h.envc = UINT32_MAX;
        assert_int_equal(sudo_header_check(&h), -E2BIG);
        h = ok;
        h.len = SUDO_REQUEST_MAX + 1;
        assert_int_equal(sudo_header_check(&h), -E2BIG);
        h = ok;
        h.argc = 0; /* no command and neither -i nor -s */
        assert_int_equal(sudo_header_check(&h), -EPROTO);
        h = ok;
        h.len = 3; /* fewer bytes than strings */
        assert_int_equal(sudo_header_check(&h), -EPROTO);

        /* A relative directory, a variable without '='. */
        SudoRequest r;
        SudoHeader rel = { SUDO_MAGIC, SUDO_VERSION, 0, 1, 0, 0, 8 };
        assert_int_equal(sudo_request_parse(&rel, "\0rel\0\0id", &r), -EPROTO);
        SudoHeader noeq = { SUDO_MAGIC, SUDO_VERSION, 0, 1, 1, 0, 9 };
        assert_int_equal(sudo_request_parse(&noeq, "\0/\0\0id\0ab", &r), -EPROTO);
        SudoHeader badset = { SUDO_MAGIC, SUDO_VERSION, 0, 1, 0, 1, 10 };
        assert_int_equal(sudo_request_parse(&badset, "\0/\0\0id\01=x", &r), -EPROTO);

        /* Random payloads under random counts: refused or parsed, never a
         * read past the payload (ASan in the sanitizer lane). */
        srand(7);
        for (int i = 0; i < 20000; i++) {
                char buf[64];
                uint32_t len = (uint32_t)(rand() % (int)sizeof buf);
                for (uint32_t k = 0; k < len; k++)
                        buf[k] = (char)(rand() % 4 == 0 ? 0 : rand() % 4 == 0 ? '=' : rand() % 4 == 0 ? '/' : 'a');
                char *p = malloc(len ? len : 1);
                memcpy(p, buf, len);
                SudoHeader x = { SUDO_MAGIC, SUDO_VERSION, (uint32_t)(rand() % 8), (uint32_t)(rand() % 6),
                                 (uint32_t)(rand() % 4), (uint32_t)(rand() % 3), len };
                if (sudo_request_parse(&x, p, &r) == 0)
                        sudo_request_free(&r);
                free(p);
        }
}

static const char *get(char **env, const char *name) {
        size_t n = strlen(name);
        for (size_t i = 0; env[i]; i++)
                if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
                        return env[i] + n + 1;
        return NULL;
}

static const SudoTarget root = { .name = "root", .home = "/root", .shell = "/bin/bash", .uid = 0, .gid = 0 };

static void test_environment(void **state) {
        (void)state;
        const char *env[] = { "HOME=/workspace", "FOO=1", "TERM=xterm", "PATH=/evil", "LANG=C.UTF-8",
                              "LC_ALL=../x", "SUDO_USER=root", "HTTPS_PROXY=http://127.0.0.1:3128",
                              "SHELL=/bin/zsh", NULL };
        const char *argv[] = { "apt-get", "update", NULL };
        const char *set[] = { "BAR=2", NULL };
        SudoRequest r = { .user = "", .cwd = "/", .preserve = "", .argv = argv, .argc = 2, .env = env,
                          .envc = 9, .set = set, .setc = 1 };
        char **e = sudo_build_env(&r, &root, "sandbox", 1000, 1000);
        assert_non_null(e);
        assert_string_equal(get(e, "HOME"), "/root");
        assert_string_equal(get(e, "PATH"), SUDO_SECURE_PATH);
        assert_string_equal(get(e, "TERM"), "xterm");
        assert_string_equal(get(e, "LANG"), "C.UTF-8");
        assert_string_equal(get(e, "HTTPS_PROXY"), "http://127.0.0.1:3128");
        assert_string_equal(get(e, "SUDO_USER"), "sandbox");
        assert_string_equal(get(e, "SUDO_UID"), "1000");
        assert_string_equal(get(e, "SUDO_COMMAND"), "apt-get update");
        assert_string_equal(get(e, "USER"), "root");
        assert_string_equal(get(e, "SHELL"), "/bin/bash");
        assert_string_equal(get(e, "BAR"), "2");
        assert_null(get(e, "FOO"));
        assert_null(get(e, "LC_ALL")); /* a path in a locale is not kept */
        sudo_env_free(e);

        r.flags = SUDO_PRESERVE_ENV;
        e = sudo_build_env(&r, &root, "sandbox", 1000, 1000);
        assert_string_equal(get(e, "FOO"), "1");
        assert_string_equal(get(e, "HOME"), "/workspace");
        assert_string_equal(get(e, "PATH"), SUDO_SECURE_PATH);
        assert_string_equal(get(e, "SUDO_USER"), "sandbox");
        sudo_env_free(e);

        r.preserve = "FOO,NOPE";
        e = sudo_build_env(&r, &root, "sandbox", 1000, 1000);
        assert_string_equal(get(e, "FOO"), "1");
        assert_string_equal(get(e, "HOME"), "/root");
        sudo_env_free(e);
}

static void test_argv(void **state) {
        (void)state;
        const char *argv[] = { "echo", "a b", "$HOME", "x;y", NULL };
        SudoRequest r = { .user = "", .cwd = "/", .preserve = "", .argv = argv, .argc = 4 };
        char **a = sudo_build_argv(&r, &root, "/bin/zsh");
        assert_string_equal(a[0], "echo");
        assert_string_equal(a[3], "x;y");
        assert_null(a[4]);
        sudo_env_free(a);
        r.flags = SUDO_LOGIN;
        a = sudo_build_argv(&r, &root, "/bin/zsh");
        assert_string_equal(a[0], "-bash");
        assert_string_equal(a[1], "-c");
        assert_string_equal(a[2], "echo a\\ b $HOME x\\;y");
        assert_null(a[3]);
        sudo_env_free(a);
        r.flags = SUDO_SHELL;
        r.argc = 0;
        a = sudo_build_argv(&r, &root, "/bin/zsh");
        assert_string_equal(a[0], "/bin/zsh");
        assert_null(a[1]);
        sudo_env_free(a);
        a = sudo_build_argv(&r, &root, "zsh"); /* not a path: the target's */
        assert_string_equal(a[0], "/bin/bash");
        sudo_env_free(a);
}

static void test_groups_and_shell(void **state) {
        (void)state;
        const char group[] = "root:x:0:\nsudo:x:27:sandbox\nadm:x:4:syslog,sandbox,x\nbad:x:9x:sandbox\n"
                             "sandbox:x:1000:\nother:x:50:sandboxes\nbig:x:99999:sandbox";
        gid_t g[8];
        size_t n = sudo_parse_groups(group, sizeof group - 1, "sandbox", 1000, g, 8);
        assert_int_equal(n, 3);
        assert_int_equal(g[0], 1000);
        assert_int_equal(g[1], 27);
        assert_int_equal(g[2], 4);
        assert_int_equal(sudo_parse_groups(group, sizeof group - 1, "sandbox", 1000, g, 2), 2);

        const char passwd[] = "root:x:0:0:root:/root:/bin/bash\nsandbox:x:1000:1000::/workspace:\n"
                              "odd:x:1:1::/:relative\nlong:x:2:2::/:/bin/sh";
        char shell[16];
        assert_int_equal(sudo_parse_shell(passwd, sizeof passwd - 1, "root", shell, sizeof shell), 0);
        assert_string_equal(shell, "/bin/bash");
        assert_int_equal(sudo_parse_shell(passwd, sizeof passwd - 1, "sandbox", shell, sizeof shell), 0);
        assert_string_equal(shell, "/bin/sh");
        assert_int_equal(sudo_parse_shell(passwd, sizeof passwd - 1, "odd", shell, sizeof shell), -ERANGE);
        assert_int_equal(sudo_parse_shell(passwd, sizeof passwd - 1, "long", shell, sizeof shell), 0);
        assert_int_equal(sudo_parse_shell(passwd, sizeof passwd - 1, "nobody", shell, sizeof shell), -ENOENT);
        assert_int_equal(sudo_parse_shell(passwd, sizeof passwd - 1, "roo", shell, sizeof shell), -ENOENT);
}

/* The child's status once it ended, or -1 when it is still running after
 * the deadline (then killed and reaped). */
static int wait_status(pid_t pid, int timeout_ms) {
        int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        assert_true(pidfd >= 0);
        struct pollfd p = { .fd = pidfd, .events = POLLIN };
        int ended = poll(&p, 1, timeout_ms);
        close(pidfd);
        int status;
        if (ended <= 0) {
                kill(pid, SIGKILL);
                (void)waitpid(pid, &status, 0);
                return -1;
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        return status;
}

/* A caller's terminal: its master (the caller's side of the test) and the
 * terminal the command's fds are. */
static void caller_terminal(int *ret_master, int *ret_tty) {
        int caller = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        assert_true(caller >= 0);
        assert_int_equal(grantpt(caller), 0);
        assert_int_equal(unlockpt(caller), 0);
        char name[64];
        assert_int_equal(ptsname_r(caller, name, sizeof name), 0);
        int tty = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
        assert_true(tty >= 0);
        *ret_master = caller;
        *ret_tty = tty;
}

/* A ^C that reaches the command's terminal at once after the start, as
 * when the caller typed it while sudo was starting: the command's group
 * must already be that terminal's foreground, or the ^C signals nobody and
 * the command runs on (the gateway once relayed before the child had its
 * session and terminal, and lost such a ^C). */
static void test_ctrl_c_at_once_reaches_the_command(void **state) {
        (void)state;
        if (geteuid() != 0)
                skip(); /* the command's start sets its groups and ids */
        for (int round = 0; round < 20; round++) {
                int caller, tty;
                caller_terminal(&caller, &tty);
                int fds[3] = { tty, tty, tty };
                SudoPty pty;
                assert_int_equal(sudo_pty_open(&pty, fds), 0);
                assert_true(pty.master >= 0);
                SudoTarget t = { .uid = 0, .gid = 0, .name = "root", .home = "/", .shell = "/bin/sh" };
                gid_t gids[1] = { 0 };
                char *argv[] = { "cat", NULL };
                char *env[] = { "PATH=/usr/bin:/bin", NULL };
                pid_t pid;
                assert_int_equal(sudo_command_start(fds, &pty, &t, gids, 1, "/", argv, env, &pid), 0);
                assert_int_equal(pty.slave, -1);
                assert_int_equal(write(pty.master, "\x03", 1), 1);
                int status = wait_status(pid, 10000);
                assert_true(status != -1); /* cat still running: the ^C was lost */
                assert_true(WIFSIGNALED(status));
                assert_int_equal(WTERMSIG(status), SIGINT);
                close(pty.master);
                close(tty);
                close(caller);
        }
}

/* A resize then bytes typed at once: the bytes find the command's terminal
 * at the new size, whether or not the front's SIGWINCH frame came first
 * (stty size typed right after a resize once printed the old size). */
static void test_input_after_a_resize_finds_the_new_size(void **state) {
        (void)state;
        int caller, tty;
        caller_terminal(&caller, &tty);
        struct winsize ws = { .ws_row = 33, .ws_col = 101 };
        assert_int_equal(ioctl(caller, TIOCSWINSZ, &ws), 0);
        int fds[3] = { tty, tty, tty };
        SudoPty pty;
        assert_int_equal(sudo_pty_open(&pty, fds), 0);
        assert_true(pty.master >= 0);
        struct winsize got;
        assert_int_equal(ioctl(pty.master, TIOCGWINSZ, &got), 0);
        assert_int_equal(got.ws_col, 101);
        assert_int_equal(got.ws_row, 33);
        /* The caller's terminal grows, and a line is typed at once. */
        ws = (struct winsize){ .ws_row = 40, .ws_col = 120 };
        assert_int_equal(ioctl(caller, TIOCSWINSZ, &ws), 0);
        assert_int_equal(write(caller, "stty size\n", 10), 10);
        struct pollfd in = { .fd = pty.in, .revents = POLLIN }, master = { .fd = -1 }, out = { .fd = -1 };
        sudo_pty_relay(&pty, &in, &master, &out);
        assert_true(pty.to_cmd_len > 0);
        assert_int_equal(ioctl(pty.master, TIOCGWINSZ, &got), 0);
        assert_int_equal(got.ws_col, 120);
        assert_int_equal(got.ws_row, 40);
        close(pty.master);
        if (pty.slave >= 0)
                close(pty.slave);
        close(tty);
        close(caller);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_options),
                cmocka_unit_test(test_request_round_trip),
                cmocka_unit_test(test_request_bounds),
                cmocka_unit_test(test_environment),
                cmocka_unit_test(test_argv),
                cmocka_unit_test(test_groups_and_shell),
                cmocka_unit_test(test_ctrl_c_at_once_reaches_the_command),
                cmocka_unit_test(test_input_after_a_resize_finds_the_new_size),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
