#include "daemon/http/session_conns.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/timeutil.h"

/* How often the expiry thread looks. */
#define SWEEP_MS 1000

typedef struct SessionConn {
        struct SessionConn *next;
        int fd;
        int64_t expires_at;
        bool ended; /* shut down already */
        char id[SESSION_CONNS_ID_MAX];
} SessionConn;

struct SessionConns {
        pthread_mutex_t lock;
        pthread_cond_t wake;
        SessionConn *head;
        bool stop;
        pthread_t thread;
};

static void *sweep(void *userdata) {
        SessionConns *l = userdata;
        pthread_mutex_lock(&l->lock);
        while (!l->stop) {
                int64_t now = time_now_unix();
                for (SessionConn *c = l->head; c; c = c->next)
                        if (!c->ended && now >= c->expires_at) {
                                c->ended = true;
                                (void)shutdown(c->fd, SHUT_RDWR);
                        }
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += SWEEP_MS / 1000;
                pthread_cond_timedwait(&l->wake, &l->lock, &ts);
        }
        pthread_mutex_unlock(&l->lock);
        return NULL;
}

SessionConns *session_conns_new(void) {
        SessionConns *l = calloc(1, sizeof(*l));
        if (!l)
                return NULL;
        pthread_mutex_init(&l->lock, NULL);
        pthread_cond_init(&l->wake, NULL);
        if (pthread_create(&l->thread, NULL, sweep, l) != 0) {
                pthread_mutex_destroy(&l->lock);
                pthread_cond_destroy(&l->wake);
                free(l);
                return NULL;
        }
        return l;
}

void session_conns_free(SessionConns *l) {
        if (!l)
                return;
        pthread_mutex_lock(&l->lock);
        l->stop = true;
        pthread_cond_broadcast(&l->wake);
        pthread_mutex_unlock(&l->lock);
        pthread_join(l->thread, NULL);
        while (l->head) {
                SessionConn *c = l->head;
                l->head = c->next;
                free(c);
        }
        pthread_mutex_destroy(&l->lock);
        pthread_cond_destroy(&l->wake);
        free(l);
}

int session_conns_add(SessionConns *l, int fd, const char *session_id, int64_t expires_at) {
        pthread_mutex_lock(&l->lock);
        for (SessionConn *c = l->head; c; c = c->next)
                if (c->fd == fd) {
                        c->expires_at = expires_at;
                        c->ended = false;
                        snprintf(c->id, sizeof c->id, "%s", session_id);
                        pthread_mutex_unlock(&l->lock);
                        return 0;
                }
        SessionConn *c = calloc(1, sizeof(*c));
        if (!c) {
                pthread_mutex_unlock(&l->lock);
                return -ENOMEM;
        }
        c->fd = fd;
        c->expires_at = expires_at;
        snprintf(c->id, sizeof c->id, "%s", session_id);
        c->next = l->head;
        l->head = c;
        pthread_mutex_unlock(&l->lock);
        return 0;
}

void session_conns_remove(SessionConns *l, int fd) {
        if (!l)
                return;
        pthread_mutex_lock(&l->lock);
        for (SessionConn **p = &l->head; *p; p = &(*p)->next)
                if ((*p)->fd == fd) {
                        SessionConn *c = *p;
                        *p = c->next;
                        free(c);
                        break;
                }
        pthread_mutex_unlock(&l->lock);
}

unsigned session_conns_end(SessionConns *l, const char *session_id) {
        unsigned n = 0;
        pthread_mutex_lock(&l->lock);
        for (SessionConn *c = l->head; c; c = c->next)
                if (strcmp(c->id, session_id) == 0) {
                        c->ended = true;
                        (void)shutdown(c->fd, SHUT_RDWR);
                        n++;
                }
        pthread_mutex_unlock(&l->lock);
        return n;
}
