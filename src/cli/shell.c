#include "cli/shell.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "cli/client.h"
#include "cli/process.h"
#include "common/macro.h"
#include "common/random.h"

/* The handshake's answer is read up to this; an error body too. */
#define HEAD_MAX (16u * 1024u)
/* Keys read at once; well under the daemon's bound on a message (64 KiB). */
#define INPUT_CHUNK (16u * 1024u)
/* A message from the daemon is at most this: the terminal's output, in pieces. */
#define MESSAGE_MAX (4u * 1024u * 1024u)

static const char shell_usage[] = "ID [--cols N --rows N] [-- COMMAND]";
static const char shell_help[] =
        "Opens an interactive terminal in the sandbox: a login shell, or COMMAND, on a\n"
        "terminal of this one's size. This terminal is in raw mode until the shell\n"
        "ends, so Ctrl-C, Ctrl-Z and the arrows go to the sandbox; its size follows\n"
        "this window's. The exit code is the shell's. Input that is not a terminal\n"
        "is sent as typed, then Ctrl-D.\n\n"
        "Example:\n  runtime sandbox shell sbx_9f2c4e1a7b3d5c6e8f01\n";

static volatile sig_atomic_t winch;

static void on_winch(int sig) {
        winch = 1;
}

typedef struct Shell {
        Client *c;
        wslay_event_context_ptr ws;
        bool closed;    /* the daemon's close came, or the connection broke */
        bool have_exit;
        int exit_code;
        bool failed;    /* an error message came instead of a terminal */
        char error[1024];
        uint8_t *pending; /* bytes read with the handshake's answer */
        size_t pending_len, pending_off;
} Shell;

static ssize_t ws_recv(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user_data) {
        Shell *s = user_data;
        if (s->pending_off < s->pending_len) {
                size_t n = s->pending_len - s->pending_off < len ? s->pending_len - s->pending_off : len;
                memcpy(buf, s->pending + s->pending_off, n);
                s->pending_off += n;
                return (ssize_t)n;
        }
        ssize_t n = client_raw_recv(s->c, buf, len);
        if (n == -EAGAIN) {
                wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                return -1;
        }
        if (n < 0) {
                s->closed = true;
                wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
                return -1;
        }
        return n;
}

static ssize_t ws_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user_data) {
        Shell *s = user_data;
        ssize_t n = client_raw_send(s->c, data, len);
        if (n == -EAGAIN) {
                wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                return -1;
        }
        if (n < 0) {
                s->closed = true;
                wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
                return -1;
        }
        return n;
}

static int ws_mask(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user_data) {
        return random_bytes(buf, len) == 0 ? 0 : -1;
}

static void write_all(int fd, const uint8_t *p, size_t n) {
        while (n > 0) {
                ssize_t k = write(fd, p, n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return;
                p += k;
                n -= (size_t)k;
        }
}

static void ws_message(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user_data) {
        Shell *s = user_data;
        if (arg->opcode == WSLAY_BINARY_FRAME) {
                write_all(STDOUT_FILENO, arg->msg, arg->msg_length);
                return;
        }
        if (arg->opcode != WSLAY_TEXT_FRAME)
                return;
        json_error_t jerr;
        _cleanup_json_ json_t *ev = json_loadb((const char *)arg->msg, arg->msg_length, 0, &jerr);
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (!type)
                return;
        if (strcmp(type, "exit") == 0) {
                json_t *code = json_object_get(ev, "exitCode");
                s->have_exit = json_is_integer(code);
                s->exit_code = s->have_exit ? (int)json_integer_value(code) : 1;
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

static void send_resize(Shell *s) {
        unsigned cols, rows;
        window_size(&cols, &rows);
        char msg[96];
        int n = snprintf(msg, sizeof msg, "{\"type\":\"resize\",\"cols\":%u,\"rows\":%u}", cols, rows);
        struct wslay_event_msg m = { .opcode = WSLAY_TEXT_FRAME, .msg = (const uint8_t *)msg, .msg_length = (size_t)n };
        wslay_event_queue_msg(s->ws, &m);
}

/* Sends the handshake and reads the answer: 0 on 101 (bytes after it kept for
 * the WebSocket), else the API's error in err. */
static int handshake(Shell *s, const char *target, CliError *err) {
        uint8_t nonce[16];
        char key[32];
        if (random_bytes(nonce, sizeof nonce) < 0)
                return -EIO;
        static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        size_t k = 0;
        for (size_t i = 0; i < 15; i += 3) {
                uint32_t v = (uint32_t)nonce[i] << 16 | (uint32_t)nonce[i + 1] << 8 | nonce[i + 2];
                key[k++] = b64[v >> 18];
                key[k++] = b64[(v >> 12) & 63];
                key[k++] = b64[(v >> 6) & 63];
                key[k++] = b64[v & 63];
        }
        key[k++] = b64[nonce[15] >> 2];
        key[k++] = b64[(nonce[15] & 3) << 4];
        key[k++] = '=';
        key[k++] = '=';
        key[k] = '\0';
        const char *base = client_base(s->c);
        const char *host = strstr(base, "://");
        host = host ? host + 3 : base;
        size_t host_len = strcspn(host, "/");
        _cleanup_free_ char *req = NULL;
        if (asprintf(&req,
                     "GET %s%s HTTP/1.1\r\nHost: %.*s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nUser-Agent: runtime-cli/" RUNTIME_VERSION
                     "\r\n%s\r\n\r\n",
                     host + host_len, target, (int)host_len, host, key, client_auth_header(s->c) ?: "X-No-Key: 1") < 0)
                return -ENOMEM;
        size_t off = 0, len = strlen(req);
        int fd = client_raw_socket(s->c);
        while (off < len) {
                ssize_t n = client_raw_send(s->c, req + off, len - off);
                if (n == -EAGAIN) {
                        struct pollfd p = { .fd = fd, .events = POLLOUT };
                        poll(&p, 1, 1000);
                        continue;
                }
                if (n < 0) {
                        cli_error_set(err, "the daemon closed the connection");
                        return -EPIPE;
                }
                off += (size_t)n;
        }
        uint8_t *buf = malloc(HEAD_MAX + 1);
        if (!buf)
                return -ENOMEM;
        size_t have = 0;
        char *end = NULL;
        for (int waited = 0; !end && have < HEAD_MAX && waited < 60000;) {
                ssize_t n = client_raw_recv(s->c, buf + have, HEAD_MAX - have);
                if (n == -EAGAIN) {
                        struct pollfd p = { .fd = fd, .events = POLLIN };
                        poll(&p, 1, 1000);
                        waited += 1000;
                        continue;
                }
                if (n < 0)
                        break;
                have += (size_t)n;
                buf[have] = '\0';
                end = strstr((char *)buf, "\r\n\r\n");
        }
        if (!end) {
                free(buf);
                cli_error_set(err, "the daemon did not answer the terminal's handshake");
                return -EPROTO;
        }
        size_t head_len = (size_t)(end - (char *)buf) + 4;
        int status = 0;
        if (sscanf((char *)buf, "HTTP/1.%*d %d", &status) != 1 || status != 101) {
                /* An API error: its JSON body follows the head. */
                cli_error_from_json(err, status, (char *)buf + head_len, have - head_len);
                free(buf);
                return -EPROTO;
        }
        s->pending = buf;
        s->pending_off = head_len;
        s->pending_len = have;
        return 0;
}

int cmd_sandbox_shell(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"cols", required_argument, NULL, 'c'},
                {"rows", required_argument, NULL, 'r'},
                {NULL, 0, NULL, 0},
        };
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
        if (asprintf(&target, "/v1/sandboxes/%s/terminal?cols=%u&rows=%u%s%s", id, cols, rows,
                     command ? "&command=" : "", command ?: "") < 0)
                return cli_fail("out of memory");

        _cleanup_client_ Client *c = NULL;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        CliError e = { 0 };
        Shell s = { .c = c };
        if (client_raw_connect(c, &e) < 0 || handshake(&s, target, &e) < 0)
                return cli_error_print(&e);
        struct wslay_event_callbacks cb = {
                .recv_callback = ws_recv, .send_callback = ws_send, .genmask_callback = ws_mask,
                .on_msg_recv_callback = ws_message,
        };
        if (wslay_event_context_client_init(&s.ws, &cb, &s) != 0) {
                free(s.pending);
                return cli_fail("out of memory");
        }
        wslay_event_config_set_max_recv_msg_length(s.ws, MESSAGE_MAX);

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
        bool stdin_open = true, ready_seen = false;
        int fd = client_raw_socket(c);
        while (!s.closed) {
                if (winch) {
                        winch = 0;
                        send_resize(&s);
                }
                if (cli_interrupted) {
                        /* SIGTERM or SIGHUP here (a Ctrl-C in raw mode is a key for
                         * the sandbox): hang up the terminal, as closing a window does. */
                        wslay_event_queue_close(s.ws, 1001, NULL, 0);
                        cli_interrupted = 0;
                        stdin_open = false;
                }
                /* The pending bytes of the handshake's read come first. */
                if (s.pending_off < s.pending_len && wslay_event_recv(s.ws) != 0)
                        break;
                if (!wslay_event_want_read(s.ws) && !wslay_event_want_write(s.ws))
                        break;
                struct pollfd p[2] = {
                        { .fd = fd, .events = (short)((wslay_event_want_read(s.ws) ? POLLIN : 0) |
                                                      (wslay_event_want_write(s.ws) ? POLLOUT : 0)) },
                        { .fd = stdin_open && !wslay_event_get_close_sent(s.ws) ? STDIN_FILENO : -1, .events = POLLIN },
                };
                int n = poll(p, 2, 1000);
                if (n < 0 && errno != EINTR)
                        break;
                if (n <= 0)
                        continue;
                if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
                        uint8_t buf[INPUT_CHUNK];
                        ssize_t k = read(STDIN_FILENO, buf, sizeof buf);
                        if (k > 0) {
                                struct wslay_event_msg m = { .opcode = WSLAY_BINARY_FRAME, .msg = buf,
                                                             .msg_length = (size_t)k };
                                wslay_event_queue_msg(s.ws, &m);
                        } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
                                /* Input that ends: the terminal's end-of-file key. */
                                stdin_open = false;
                                struct wslay_event_msg m = { .opcode = WSLAY_BINARY_FRAME,
                                                             .msg = (const uint8_t *)"\x04", .msg_length = 1 };
                                wslay_event_queue_msg(s.ws, &m);
                        }
                }
                if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && wslay_event_recv(s.ws) != 0)
                        break;
                if ((p[0].revents & POLLOUT) && wslay_event_send(s.ws) != 0)
                        break;
                ready_seen = true;
        }
        (void)ready_seen;
        if (raw) {
                tcsetattr(STDIN_FILENO, TCSANOW, &saved);
                signal(SIGWINCH, SIG_DFL);
        }
        wslay_event_context_free(s.ws);
        free(s.pending);
        if (s.failed) {
                fprintf(stderr, "runtime: %s\n", s.error);
                return CLI_EXIT_FAILURE;
        }
        if (s.have_exit)
                return s.exit_code & 0xff;
        fprintf(stderr, "runtime: the terminal closed before its shell ended\n");
        return CLI_EXIT_FAILURE;
}
