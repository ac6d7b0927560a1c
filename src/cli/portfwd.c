#include "cli/portfwd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/wsclient.h"
#include "common/macro.h"

#define MAX_CONNS 64
/* What may be sent past the daemon's last credit (its window for a client). */
#define WINDOW (1024u * 1024u)
#define CHUNK (64u * 1024u)
/* The sandbox's bytes waiting for slow local readers: past this the tunnel
 * is not read until they drain. */
#define OUT_MAX (8u * 1024u * 1024u)
#define MESSAGE_MAX (5u + 1024u * 1024u)

static const char pf_usage[] = "ID [LOCAL:]REMOTE [--address ADDR]";
static const char pf_help[] =
        "Listens on ADDR:LOCAL (127.0.0.1 and REMOTE by default; LOCAL 0 takes any free\n"
        "port) and carries each connection to port REMOTE on the sandbox's loopback, over\n"
        "one authenticated WebSocket to the daemon, until Ctrl-C. Nothing listens beyond\n"
        "loopback unless --address says so. A connection to a port nothing listens on\n"
        "inside is closed at once.\n\n"
        "Example:\n  runtime sandbox port-forward sbx_9f2c4e1a7b3d5c6e8f01 8080:8000\n";

typedef struct Conn {
        int fd;
        uint32_t id;
        bool open;       /* the daemon said the sandbox side is connected */
        bool in_eof;     /* the local side sent everything ("e" sent) */
        bool remote_eof; /* "e" came: shut down writing once out is written */
        bool remote_closed;
        uint8_t *out;
        size_t out_len, out_off;
} Conn;

typedef struct Forward {
        WsClient *w;
        Conn *conns[MAX_CONNS];
        size_t n;
        uint32_t next_id;
        uint64_t sent, credited;
        size_t out_total;
        bool ready, failed;
        char error[512];
} Forward;

int cli_parse_port_spec(const char *s, unsigned *ret_local, unsigned *ret_remote) {
        const char *colon = strchr(s, ':');
        unsigned v[2] = { 0, 0 };
        const char *parts[2] = { s, colon ? colon + 1 : NULL };
        size_t lens[2] = { colon ? (size_t)(colon - s) : strlen(s), colon ? strlen(colon + 1) : 0 };
        for (int i = 0; i < (colon ? 2 : 1); i++) {
                if (lens[i] == 0 || lens[i] > 5)
                        return -EINVAL;
                for (size_t k = 0; k < lens[i]; k++) {
                        if (parts[i][k] < '0' || parts[i][k] > '9')
                                return -EINVAL;
                        v[i] = v[i] * 10 + (unsigned)(parts[i][k] - '0');
                }
                if (v[i] > 65535)
                        return -EINVAL;
        }
        unsigned remote = colon ? v[1] : v[0], local = colon ? v[0] : v[0];
        if (remote < 1)
                return -EINVAL;
        *ret_local = local;
        *ret_remote = remote;
        return 0;
}

static void frame(Forward *f, char kind, uint32_t id, const void *data, size_t len) {
        uint8_t head[5] = { (uint8_t)kind, (uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id };
        uint8_t *m = malloc(5 + len);
        if (!m)
                return;
        memcpy(m, head, 5);
        if (len)
                memcpy(m + 5, data, len);
        ws_client_send(f->w, false, m, 5 + len);
        free(m);
}

static Conn *find(Forward *f, uint32_t id) {
        for (size_t i = 0; i < f->n; i++)
                if (f->conns[i]->id == id)
                        return f->conns[i];
        return NULL;
}

static void conn_drop(Forward *f, Conn *c) {
        for (size_t i = 0; i < f->n; i++)
                if (f->conns[i] == c) {
                        f->conns[i] = f->conns[--f->n];
                        break;
                }
        f->out_total -= c->out_len - c->out_off;
        close(c->fd);
        free(c->out);
        free(c);
}

static void on_message(void *userdata, bool text, const uint8_t *data, size_t len) {
        Forward *f = userdata;
        if (text) {
                json_error_t jerr;
                _cleanup_json_ json_t *ev = json_loadb((const char *)data, len, 0, &jerr);
                const char *type = json_string_value(json_object_get(ev, "type"));
                if (type && strcmp(type, "ready") == 0)
                        f->ready = true;
                else if (type && strcmp(type, "error") == 0) {
                        const char *m = json_string_value(json_object_get(json_object_get(ev, "error"), "message"));
                        f->failed = true;
                        size_t k = 0;
                        for (const char *p = m ? m : "the tunnel failed"; *p && k < sizeof f->error - 1; p++)
                                f->error[k++] = (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p;
                        f->error[k] = '\0';
                }
                return;
        }
        if (len < 5)
                return;
        char kind = (char)data[0];
        uint32_t id = (uint32_t)data[1] << 24 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 8 | data[4];
        if (kind == 'a' && len == 13) {
                uint64_t v = 0;
                for (int i = 0; i < 8; i++)
                        v = v << 8 | data[5 + i];
                if (v > f->credited)
                        f->credited = v;
                return;
        }
        Conn *c = find(f, id);
        if (!c)
                return;
        if (!c->open) {
                if (kind == 'o')
                        c->open = true;
                else
                        c->remote_closed = true; /* refused: the local connection closes */
                return;
        }
        if (kind == 'd') {
                size_t n = len - 5;
                if (c->out_off > 0 && c->out_off == c->out_len)
                        c->out_off = c->out_len = 0;
                uint8_t *b = realloc(c->out, c->out_len + n);
                if (!b) {
                        c->remote_closed = true;
                        return;
                }
                c->out = b;
                memcpy(c->out + c->out_len, data + 5, n);
                c->out_len += n;
                f->out_total += n;
        } else if (kind == 'e')
                c->remote_eof = true;
        else if (kind == 'c')
                c->remote_closed = true;
}

static int listen_on(const char *address, unsigned port, unsigned *ret_port) {
        struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
        struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        bool v6 = strchr(address, ':') != NULL;
        if (v6 ? inet_pton(AF_INET6, address, &a6.sin6_addr) != 1 : inet_pton(AF_INET, address, &a4.sin_addr) != 1)
                return -EINVAL;
        int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if ((v6 ? bind(fd, (struct sockaddr *)&a6, sizeof a6) : bind(fd, (struct sockaddr *)&a4, sizeof a4)) < 0 ||
            listen(fd, 64) < 0) {
                int k = -errno;
                close(fd);
                return k;
        }
        struct sockaddr_storage got;
        socklen_t len = sizeof got;
        getsockname(fd, (struct sockaddr *)&got, &len);
        *ret_port = ntohs(v6 ? ((struct sockaddr_in6 *)&got)->sin6_port : ((struct sockaddr_in *)&got)->sin_port);
        return fd;
}

/* One turn of a local connection: its pending bytes out, the sandbox's
 * next bytes in while the window has room, and its half-close. */
static void conn_io(Forward *f, Conn *k, short re) {
        if (re & POLLOUT) {
                ssize_t w = send(k->fd, k->out + k->out_off, k->out_len - k->out_off, MSG_NOSIGNAL);
                if (w > 0) {
                        k->out_off += (size_t)w;
                        f->out_total -= (size_t)w;
                } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                        frame(f, 'c', k->id, NULL, 0);
                        k->remote_closed = true;
                        f->out_total -= k->out_len - k->out_off;
                        k->out_off = k->out_len;
                }
        }
        /* The window may have filled with an earlier connection's
         * bytes in this same turn: a read of 0 would look like EOF. */
        if ((re & (POLLIN | POLLHUP | POLLERR)) && f->sent - f->credited < WINDOW) {
                uint8_t buf[CHUNK];
                size_t want = WINDOW - (size_t)(f->sent - f->credited);
                ssize_t got = recv(k->fd, buf, want < sizeof buf ? want : sizeof buf, 0);
                if (got > 0) {
                        frame(f, 'd', k->id, buf, (size_t)got);
                        f->sent += (uint64_t)got;
                } else if (got == 0) {
                        frame(f, 'e', k->id, NULL, 0);
                        k->in_eof = true;
                } else if (errno != EAGAIN && errno != EINTR) {
                        frame(f, 'c', k->id, NULL, 0);
                        k->remote_closed = true;
                }
        }
        if (k->remote_eof && k->out_off == k->out_len) {
                shutdown(k->fd, SHUT_WR);
                k->remote_eof = false;
        }
}

/* A new local connection: opened towards `remote` in the sandbox. */
static void conn_accept(Forward *f, int lfd, unsigned remote) {
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        Conn *k = cfd >= 0 ? calloc(1, sizeof(*k)) : NULL;
        if (k) {
                int one = 1;
                setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                k->fd = cfd;
                k->id = f->next_id++;
                f->conns[f->n++] = k;
                char spec[16];
                int len = snprintf(spec, sizeof spec, "tcp %u", remote);
                frame(f, 'o', k->id, spec, (size_t)len);
        } else if (cfd >= 0)
                close(cfd);
}

/* Serves the listening socket and the tunnel until either ends or the user
 * interrupts: the command's exit code. */
static int forward_loop(Forward *f, int lfd, unsigned remote) {
        int wfd = ws_client_fd(f->w);
        int rc = CLI_EXIT_OK;
        for (;;) {
                if (cli_interrupted)
                        break;
                if (f->failed) {
                        fprintf(stderr, "runtime: %s\n", f->error);
                        rc = CLI_EXIT_FAILURE;
                        break;
                }
                /* Finished connections: their bytes written, or the daemon closed them. */
                for (size_t i = 0; i < f->n;) {
                        Conn *k = f->conns[i];
                        if (k->remote_closed && (k->out_off == k->out_len || !k->open)) {
                                conn_drop(f, k);
                                continue;
                        }
                        i++;
                }
                struct pollfd p[2 + MAX_CONNS];
                size_t np = 0;
                p[np++] = (struct pollfd){ .fd = wfd, .events = (short)((f->out_total < OUT_MAX ? POLLIN : 0) |
                                                                         (ws_client_want_write(f->w) ? POLLOUT : 0)) };
                p[np++] = (struct pollfd){ .fd = f->n < MAX_CONNS ? lfd : -1, .events = POLLIN };
                bool room = f->sent - f->credited < WINDOW;
                for (size_t i = 0; i < f->n; i++) {
                        Conn *k = f->conns[i];
                        short ev = (short)((k->open && !k->in_eof && !k->remote_closed && room ? POLLIN : 0) |
                                           (k->out_off < k->out_len ? POLLOUT : 0));
                        p[np++] = (struct pollfd){ .fd = ev ? k->fd : -1, .events = ev };
                }
                size_t n_conns = f->n;
                if (!ws_client_want_read(f->w) && !ws_client_want_write(f->w)) {
                        fprintf(stderr, "runtime: the daemon closed the tunnel\n");
                        rc = CLI_EXIT_FAILURE;
                        break;
                }
                int n = ws_client_pending(f->w) ? 0 : poll(p, np, 1000);
                if (n < 0 && errno != EINTR)
                        break;
                if (ws_client_pending(f->w) || (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
                        if (ws_client_read(f->w) < 0) {
                                fprintf(stderr, "runtime: the connection to the daemon closed\n");
                                rc = CLI_EXIT_FAILURE;
                                break;
                        }
                }
                for (size_t i = 0; i < n_conns && i < f->n; i++) {
                        Conn *k = f->conns[i];
                        short re = p[2 + i].fd == k->fd ? p[2 + i].revents : 0;
                        conn_io(f, k, re);
                }
                if (p[1].revents & POLLIN)
                        conn_accept(f, lfd, remote);
                if (ws_client_want_write(f->w) && ws_client_write(f->w) < 0) {
                        fprintf(stderr, "runtime: the connection to the daemon closed\n");
                        rc = CLI_EXIT_FAILURE;
                        break;
                }
        }
        return rc;
}

int cmd_sandbox_port_forward(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"address", required_argument, NULL, 'a'},
                {NULL, 0, NULL, 0},
        };
        const char *address = "127.0.0.1";
        int opt;
        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
                if (opt == 'h')
                        return cli_help("sandbox port-forward", pf_usage, pf_help);
                if (opt == 'a') {
                        address = optarg;
                        continue;
                }
                return cli_usage_error("sandbox port-forward", pf_usage, "unknown option '%s'", argv[optind - 1]);
        }
        if (argc - optind != 2)
                return cli_usage_error("sandbox port-forward", pf_usage, "expected the sandbox id and a port");
        const char *id = argv[optind];
        int r = cli_check_id("sandbox port-forward", pf_usage, id);
        if (r > 0)
                return r;
        unsigned local, remote;
        if (cli_parse_port_spec(argv[optind + 1], &local, &remote) < 0)
                return cli_usage_error("sandbox port-forward", pf_usage,
                                       "'%s' is not [LOCAL:]REMOTE (REMOTE 1-65535, LOCAL 0-65535)", argv[optind + 1]);
        _cleanup_client_ Client *c = NULL;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        char target[96];
        snprintf(target, sizeof target, "/v1/sandboxes/%s/tunnel", id);
        Forward f = { .next_id = 1 };
        CliError e = { 0 };
        if (ws_client_open(c, target, MESSAGE_MAX, on_message, &f, &f.w, &e) < 0)
                return cli_error_print(&e);
        int wfd = ws_client_fd(f.w);
        /* The daemon's first message: ready, or why not. */
        while (!f.ready && !f.failed) {
                if (!ws_client_pending(f.w)) {
                        struct pollfd p = { .fd = wfd, .events = POLLIN };
                        if (poll(&p, 1, 30000) <= 0)
                                break;
                }
                if (ws_client_read(f.w) < 0)
                        break;
        }
        if (!f.ready) {
                fprintf(stderr, "runtime: %s\n", f.failed ? f.error : "the tunnel did not open");
                ws_client_free(f.w);
                return CLI_EXIT_FAILURE;
        }
        unsigned bound_port = 0;
        int lfd = listen_on(address, local, &bound_port);
        if (lfd < 0) {
                ws_client_free(f.w);
                return lfd == -EINVAL ? cli_usage_error("sandbox port-forward", pf_usage, "'%s' is not an IP address", address)
                                      : cli_fail("cannot listen on %s:%u: %s", address, local ? local : remote,
                                                 strerror(-lfd));
        }
        printf("Forwarding %s:%u -> port %u in %s\n", address, bound_port, remote, id);
        fflush(stdout);

        int rc = forward_loop(&f, lfd, remote);
        while (f.n > 0)
                conn_drop(&f, f.conns[0]);
        close(lfd);
        ws_client_close(f.w, 1000);
        (void)ws_client_write(f.w);
        ws_client_free(f.w);
        return rc;
}
