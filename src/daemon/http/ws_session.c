#include "daemon/http/ws_session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/timeutil.h"
#include "common/log.h"

WsSession *ws_session_new(size_t size, const WsSessionOps *ops, WsSessionList *list, const char *owner,
                          const char *rid) {
        WsSession *s = calloc(1, size);
        if (!s)
                return NULL;
        s->ops = ops;
        s->list = list;
        s->sock = -1;
        s->wake[0] = s->wake[1] = -1;
        snprintf(s->rid, sizeof s->rid, "%s", rid);
        snprintf(s->owner, sizeof s->owner, "%s", owner);
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->drained, NULL);
        if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
                ops->free(s);
                return NULL;
        }
        return s;
}

void ws_session_destroy(WsSession *s) {
        ws_conn_free(s->ws);
        free(s->extra);
        for (int i = 0; i < 2; i++)
                if (s->wake[i] >= 0)
                        close(s->wake[i]);
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->drained);
}

WsAdmit ws_session_admit(WsSession *s) {
        WsSessionList *l = s->list;
        pthread_mutex_lock(&l->lock);
        unsigned mine = 0;
        for (WsSession *x = l->head; x; x = x->next)
                if (x->admitted && strcmp(x->owner, s->owner) == 0)
                        mine++;
        WsAdmit a = mine >= l->max_owner ? WS_REFUSED_OWNER
                    : l->admitted >= l->max || atomic_load(&l->closing) ? WS_REFUSED_HOST
                                                                        : WS_ADMITTED;
        s->admitted = a == WS_ADMITTED;
        if (s->admitted)
                l->admitted++;
        l->count++;
        s->next = l->head;
        l->head = s;
        pthread_mutex_unlock(&l->lock);
        return a;
}

static void unlist(WsSession *s) {
        WsSessionList *l = s->list;
        pthread_mutex_lock(&l->lock);
        for (WsSession **pp = &l->head; *pp; pp = &(*pp)->next)
                if (*pp == s) {
                        *pp = s->next;
                        break;
                }
        if (s->admitted)
                l->admitted--;
        l->count--;
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
}

/* A session that will never run: what the route started is undone. */
static void drop(WsSession *s) {
        if (s->ops->abandon)
                s->ops->abandon(s);
        unlist(s);
        s->ops->free(s);
}

static void *session_main(void *arg) {
        WsSession *s = arg;
        s->ops->run(s);
        MHD_upgrade_action(s->urh, MHD_UPGRADE_ACTION_CLOSE);
        unlist(s);
        s->ops->free(s);
        return NULL;
}

static void upgraded(void *cls, struct MHD_Connection *connection, void *req_cls, const char *extra_in,
                     size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
        WsSession *s = cls;
        s->sock = sock;
        s->urh = urh;
        if (extra_in_size && (s->extra = malloc(extra_in_size))) {
                memcpy(s->extra, extra_in, extra_in_size);
                s->extra_len = extra_in_size;
        }
        s->ws = ws_conn_new(sock, s->ops->max_message, s->ops->on_message, s);
        pthread_attr_t attr;
        pthread_t th;
        bool started = false;
        if (s->ws && pthread_attr_init(&attr) == 0) {
                pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                started = pthread_create(&th, &attr, session_main, s) == 0;
                pthread_attr_destroy(&attr);
        }
        if (started)
                return;
        log_warn(s->rid, "%s: cannot start its thread", s->ops->what);
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        drop(s);
}

enum MHD_Result ws_session_upgrade(Req *r, WsSession *s, const char *accept) {
        struct MHD_Response *resp = MHD_create_response_for_upgrade(upgraded, s);
        if (resp && (MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "websocket") != MHD_YES ||
                     MHD_add_response_header(resp, "Sec-WebSocket-Accept", accept) != MHD_YES)) {
                MHD_destroy_response(resp);
                resp = NULL;
        }
        /* reply_response takes the response, also when it fails. */
        if (resp && reply_response(r, MHD_HTTP_SWITCHING_PROTOCOLS, resp, NULL) == MHD_YES)
                return MHD_YES;
        drop(s);
        return reply_internal(r);
}

void ws_session_wake(WsSession *s) {
        (void)!write(s->wake[1], "x", 1);
}

void ws_session_start_locked(WsSession *s) {
        if (s->extra_len)
                (void)ws_conn_feed(s->ws, s->extra, s->extra_len);
}

bool ws_session_pump_locked(WsSession *s, int timeout_ms) {
        bool rd = ws_conn_want_read(s->ws), wr = ws_conn_want_write(s->ws);
        if (ws_conn_close_sent(s->ws) && !s->close_deadline)
                s->close_deadline = time_now_mono_ms() + WS_SESSION_CLOSE_WAIT_MS;
        if ((!rd && !wr) || s->gone || atomic_load(&s->list->closing) ||
            (s->close_deadline && time_now_mono_ms() >= s->close_deadline))
                return false;
        pthread_mutex_unlock(&s->lock);
        struct pollfd fds[2] = {
                { .fd = s->sock, .events = (short)((rd ? POLLIN : 0) | (wr ? POLLOUT : 0)) },
                { .fd = s->wake[0], .events = POLLIN },
        };
        (void)poll(fds, 2, timeout_ms);
        if (fds[1].revents & POLLIN) {
                char buf[64];
                while (read(s->wake[0], buf, sizeof buf) > 0)
                        ;
        }
        pthread_mutex_lock(&s->lock);
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR))
                s->gone = ws_conn_read(s->ws) < 0;
        if (!s->gone && ws_conn_want_write(s->ws))
                s->gone = ws_conn_write(s->ws) < 0;
        if (ws_conn_queued(s->ws) <= WS_SESSION_OUT_HIGH / 2)
                pthread_cond_broadcast(&s->drained);
        return true;
}

void ws_session_end_locked(WsSession *s) {
        if (!s->gone)
                ws_conn_linger(s->ws, 1000);
        s->stop = true;
        pthread_cond_broadcast(&s->drained);
}

void ws_session_send_json_locked(WsSession *s, json_t *j) {
        _cleanup_free_ char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (text)
                (void)ws_conn_send(s->ws, true, text, strlen(text));
}

void ws_session_send_error_locked(WsSession *s, const ApiError *e) {
        json_t *body = api_error_json(e, s->rid);
        ws_session_send_json_locked(
                s, body ? json_pack("{s:s,s:O}", "type", "error", "error", json_object_get(body, "error")) : NULL);
        json_decref(body);
}

void ws_session_close_all(WsSessionList *l) {
        pthread_mutex_lock(&l->lock);
        atomic_store(&l->closing, true);
        for (WsSession *s = l->head; s; s = s->next)
                ws_session_wake(s);
        while (l->count > 0)
                pthread_cond_wait(&l->cond, &l->lock);
        pthread_mutex_unlock(&l->lock);
}
