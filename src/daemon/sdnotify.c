/* runtimed's side of systemd's notify protocol (sd_notify(3),
 * sd_watchdog_enabled(3)). The health probe is a real request to the
 * daemon's own HTTP server rather than a counter some thread bumps: what
 * the watchdog is for is a daemon that still runs but no longer answers. */
#include "daemon/sdnotify.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"

typedef struct Watchdog {
        pthread_t thread;
        bool running;
        pthread_mutex_t lock;
        pthread_cond_t wake;
        bool stop;
        uint64_t interval_usec; /* WATCHDOG_USEC */
        char target[512];       /* the listening address, as sdnotify_ready got it */
} Watchdog;

static Watchdog watchdog = { .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER };

static bool under_systemd(void) {
        const char *s = getenv("NOTIFY_SOCKET");
        return s && *s;
}

/* A socket connected to the daemon's own listening address; for a TCP
 * address on every interface, its loopback. */
static int connect_self(const char *target, int timeout_ms) {
        struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
        if (strncmp(target, "unix:", 5) == 0) {
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                if (strlen(target + 5) >= sizeof sa.sun_path)
                        return -ENAMETOOLONG;
                strcpy(sa.sun_path, target + 5);
                int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        return -errno;
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
                if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
                        int r = -errno;
                        close(fd);
                        return r;
                }
                return fd;
        }
        if (strncmp(target, "http://", 7) != 0)
                return -EINVAL;
        char host[256];
        snprintf(host, sizeof host, "%s", target + 7);
        char *port = strrchr(host, ':');
        if (!port)
                return -EINVAL;
        *port++ = '\0';
        char *h = host;
        if (h[0] == '[') {
                h++;
                char *end = strchr(h, ']');
                if (end)
                        *end = '\0';
        }
        if (strcmp(h, "0.0.0.0") == 0 || h[0] == '\0')
                h = "127.0.0.1";
        else if (strcmp(h, "::") == 0)
                h = "::1";
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                                  .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
        struct addrinfo *ai = NULL;
        if (getaddrinfo(h, port, &hints, &ai) != 0 || !ai)
                return -EINVAL;
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                freeaddrinfo(ai);
                return -errno;
        }
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 ? -errno : 0;
        freeaddrinfo(ai);
        if (r < 0) {
                close(fd);
                return r;
        }
        return fd;
}

/* Whether GET /healthz answers 200 within timeout_ms (each of the connect,
 * the write and the read bounded by it). */
static bool healthy(const char *target, int timeout_ms) {
        _cleanup_close_ int fd = connect_self(target, timeout_ms);
        if (fd < 0)
                return false;
        static const char req[] = "GET /healthz HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1))
                return false;
        char buf[64];
        size_t got = 0;
        while (got < 12) {
                ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
                if (n <= 0)
                        return false;
                got += (size_t)n;
        }
        buf[got] = '\0';
        return strncmp(buf, "HTTP/1.", 7) == 0 && strncmp(buf + 8, " 200", 4) == 0;
}

/* Pings at half the interval, as sd_watchdog_enabled(3) advises; a probe
 * that fails skips its ping and is logged, and systemd acts once a whole
 * interval passes without one. */
static void *watchdog_main(void *arg) {
        Watchdog *w = arg;
        uint64_t period_usec = w->interval_usec / 2;
        int timeout_ms = (int)(period_usec / 1000 > 0 ? period_usec / 1000 : 1);
        pthread_mutex_lock(&w->lock);
        while (!w->stop) {
                pthread_mutex_unlock(&w->lock);
                if (healthy(w->target, timeout_ms))
                        sd_notify(0, "WATCHDOG=1");
                else
                        log_warn(NULL, "watchdog: GET /healthz on %s did not answer 200; no ping", w->target);
                pthread_mutex_lock(&w->lock);
                struct timespec until;
                clock_gettime(CLOCK_MONOTONIC, &until);
                until.tv_sec += (time_t)(period_usec / 1000000);
                until.tv_nsec += (long)(period_usec % 1000000) * 1000;
                if (until.tv_nsec >= 1000000000L) {
                        until.tv_sec++;
                        until.tv_nsec -= 1000000000L;
                }
                while (!w->stop && pthread_cond_timedwait(&w->wake, &w->lock, &until) != ETIMEDOUT)
                        ;
        }
        pthread_mutex_unlock(&w->lock);
        return NULL;
}

int sdnotify_ready(const char *listening) {
        if (!under_systemd())
                return 0;
        char status[600];
        snprintf(status, sizeof status, "READY=1\nSTATUS=listening on %s", listening);
        int r = sd_notify(0, status);
        if (r < 0)
                log_warn(NULL, "sd_notify READY=1: %s", strerror(-r));
        uint64_t usec = 0;
        if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
                return 0;
        snprintf(watchdog.target, sizeof watchdog.target, "%s", listening);
        watchdog.interval_usec = usec;
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_destroy(&watchdog.wake);
        pthread_cond_init(&watchdog.wake, &ca);
        pthread_condattr_destroy(&ca);
        if ((r = pthread_create(&watchdog.thread, NULL, watchdog_main, &watchdog)) != 0) {
                log_error(NULL, "cannot start the watchdog thread: %s", strerror(r));
                return -r;
        }
        watchdog.running = true;
        log_info(NULL, "watchdog: pinging every %llu ms while GET /healthz answers",
                 (unsigned long long)(usec / 2000));
        return 0;
}

void sdnotify_stopping(void) {
        if (!under_systemd())
                return;
        sd_notify(0, "STOPPING=1");
        if (!watchdog.running)
                return;
        pthread_mutex_lock(&watchdog.lock);
        watchdog.stop = true;
        pthread_cond_signal(&watchdog.wake);
        pthread_mutex_unlock(&watchdog.lock);
        pthread_join(watchdog.thread, NULL);
        watchdog.running = false;
}
