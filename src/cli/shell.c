#include "cli/shell.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/parse.h"
#include "cli/wsclient.h"
#include "common/io.h"
#include "common/macro.h"

/* Keys read at once; well under the daemon's bound on a message (64 KiB). */
#define INPUT_CHUNK (16u * 1024u)
/* A message from the daemon is at most this: the terminal's output, in pieces. */
#define MESSAGE_MAX (4u * 1024u * 1024u)

static const char shell_usage[] = "[--cols N --rows N] [--user USER] ID [-- COMMAND]";
static const char shell_help[] =
        "Opens an interactive terminal in the sandbox: a login shell, or COMMAND, on a\n"
        "terminal of this one's size. This terminal is in raw mode until the shell\n"
        "ends, so Ctrl-C, Ctrl-Z and the arrows go to the sandbox; its size follows\n"
        "this window's. The exit code is the shell's. Input that is not a terminal\n"
        "is sent as typed, then Ctrl-D.\n\n"
        "Options:\n"
        "  --user USER  sandbox (the default, unprivileged, HOME=/workspace) or root\n\n"
        "Example:\n  runtime sandbox shell sbx_9f2c4e1a7b3d5c6e8f01\n";

static volatile sig_atomic_t winch;

static void on_winch(int sig) {
        winch = 1;
}

typedef struct Shell {
        bool have_exit;
        int exit_code;
        bool failed; /* an error message came instead of a terminal */
        char error[1024];
} Shell;

static void on_message(void *userdata, bool text, const uint8_t *data, size_t len) {
        Shell *s = userdata;
        if (!text) {
                (void)io_write_all(STDOUT_FILENO, data, len);
                return;
        }
        json_error_t jerr;
        _cleanup_json_ json_t *ev = json_loadb((const char *)data, len, 0, &jerr);
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (!type)
                return;
        if (strcmp(type, "exit") == 0) {
                json_t *code = json_object_get(ev, "exitCode");
                s->have_exit = true;
                s->exit_code = json_is_integer(code) ? (int)json_integer_value(code) : 1;
        } else if (strcmp(type, "error") == 0) {
                const char *m = json_string_value(json_object_get(json_object_get(ev, "error"), "message"));
                s->failed = true;
                /* The daemon's text: no control characters reach this terminal. */
                size_t k = 0;
                for (const char *p = m ? m : "the terminal did not start"; *p && k < sizeof s->error - 1; p++)
                        s->error[k++] = (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p;
                s->error[k] = '\0';
        }
}

static void window_size(unsigned *cols, unsigned *rows) {
        struct winsize w;
        *cols = 80;
        *rows = 24;
        if (ioctl(STDIN_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0 && w.ws_row > 0) {
                *cols = w.ws_col < 1000 ? w.ws_col : 1000;
                *rows = w.ws_row < 1000 ? w.ws_row : 1000;
        }
}

static void send_resize(WsClient *w) {
        unsigned cols, rows;
        window_size(&cols, &rows);
        char msg[96];
        int n = snprintf(msg, sizeof msg, "{\"type\":\"resize\",\"cols\":%u,\"rows\":%u}", cols, rows);
        ws_client_send(w, true, msg, (size_t)n);
}
int cmd_sandbox_shell(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"cols", required_argument, NULL, 'c'},
                {"rows", required_argument, NULL, 'r'},
                {"user", required_argument, NULL, 'u'},
                {NULL, 0, NULL, 0},
        };
        const char *user = NULL;
        unsigned cols, rows;
        window_size(&cols, &rows);
        int opt;
        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
                if (opt == 'h')
                        return cli_help("sandbox shell", shell_usage, shell_help);
                if (opt == 'c' || opt == 'r') {
                        char *e = NULL;
                        unsigned long v = strtoul(optarg, &e, 10);
                        if (!*optarg || *e || v < 1 || v > 1000)
                                return cli_usage_error("sandbox shell", shell_usage, "--%s must be 1 to 1000",
                                                       opt == 'c' ? "cols" : "rows");
                        *(opt == 'c' ? &cols : &rows) = (unsigned)v;
                        continue;
                }
                if (opt == 'u') {
                        if (!cli_user_valid(optarg))
                                return cli_usage_error("sandbox shell", shell_usage,
                                                       "--user: '%.32s' is not sandbox or root", optarg);
                        user = optarg;
                        continue;
                }
                return cli_usage_error("sandbox shell", shell_usage, "unknown option '%s'", argv[optind - 1]);
        }
        if (optind >= argc)
                return cli_usage_error("sandbox shell", shell_usage, "missing the sandbox id");
        const char *id = argv[optind++];
        int r = cli_check_id("sandbox shell", shell_usage, id);
        if (r > 0)
                return r;
        if (optind < argc && strcmp(argv[optind], "--") == 0)
                optind++;
        if (argc - optind > 1)
                return cli_usage_error("sandbox shell", shell_usage, "give the command as one argument");
        _cleanup_free_ char *command = optind < argc ? url_escape(argv[optind]) : NULL;
        if (optind < argc && !command)
                return cli_fail("out of memory");
        _cleanup_free_ char *target = NULL;
        if (asprintf(&target, "/v1/sandboxes/%s/terminal?cols=%u&rows=%u%s%s%s%s", id, cols, rows,
                     command ? "&command=" : "", command ?: "", user ? "&user=" : "", user ?: "") < 0)
                return cli_fail("out of memory");

        _cleanup_client_ Client *c = NULL;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        CliError e = { 0 };
        Shell s = { 0 };
        WsClient *w = NULL;
        if (ws_client_open(c, target, MESSAGE_MAX, on_message, &s, &w, &e) < 0)
                return cli_error_print(&e);

        struct termios saved;
        bool raw = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
        if (raw) {
                struct termios t = saved;
                cfmakeraw(&t);
                tcsetattr(STDIN_FILENO, TCSANOW, &t);
                struct sigaction sa = { .sa_handler = on_winch };
                sigemptyset(&sa.sa_mask);
                sigaction(SIGWINCH, &sa, NULL);
        }
        bool stdin_open = true;
        int fd = ws_client_fd(w);
        for (;;) {
                if (winch) {
                        winch = 0;
                        send_resize(w);
                }
                if (cli_interrupted) {
                        /* SIGTERM or SIGHUP here (a Ctrl-C in raw mode is a key for
                         * the sandbox): hang up the terminal, as closing a window does. */
                        ws_client_close(w, 1001);
                        cli_interrupted = 0;
                        stdin_open = false;
                }
                /* The bytes read with the handshake's answer come first. */
                if (ws_client_pending(w) && ws_client_read(w) < 0)
                        break;
                if (!ws_client_want_read(w) && !ws_client_want_write(w))
                        break;
                struct pollfd p[2] = {
                        { .fd = fd, .events = (short)((ws_client_want_read(w) ? POLLIN : 0) |
                                                      (ws_client_want_write(w) ? POLLOUT : 0)) },
                        { .fd = stdin_open && !ws_client_close_sent(w) ? STDIN_FILENO : -1, .events = POLLIN },
                };
                int n = poll(p, 2, 1000);
                if (n < 0 && errno != EINTR)
                        break;
                if (n <= 0)
                        continue;
                if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
                        uint8_t buf[INPUT_CHUNK];
                        ssize_t k = read(STDIN_FILENO, buf, sizeof buf);
                        if (k > 0)
                                ws_client_send(w, false, buf, (size_t)k);
                        else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
                                /* Input that ends: the terminal's end-of-file key. */
                                stdin_open = false;
                                ws_client_send(w, false, "\x04", 1);
                        }
                }
                if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && ws_client_read(w) < 0)
                        break;
                if ((p[0].revents & POLLOUT) && ws_client_write(w) < 0)
                        break;
        }
        if (raw) {
                tcsetattr(STDIN_FILENO, TCSANOW, &saved);
                signal(SIGWINCH, SIG_DFL);
        }
        ws_client_free(w);
        if (s.failed) {
                fprintf(stderr, "runtime: %s\n", s.error);
                return CLI_EXIT_FAILURE;
        }
        if (s.have_exit)
                return s.exit_code & 0xff;
        fprintf(stderr, "runtime: the terminal closed before its shell ended\n");
        return CLI_EXIT_FAILURE;
}
