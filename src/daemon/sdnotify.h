#pragma once
/* runtimed under systemd (Type=notify): readiness, stopping and the
 * watchdog, through libsystemd's sd_notify. Without NOTIFY_SOCKET in the
 * environment (not started by systemd) every call here does nothing, so the
 * daemon behaves as it always has. */

/* Tells the service manager the daemon is ready (READY=1, with a status
 * line naming where it listens) and, when the unit has WatchdogSec, starts
 * the watchdog thread. listening is "http://ADDR:PORT" or "unix:PATH", the
 * address the HTTP server answers on: the thread sends WATCHDOG=1 only after
 * a GET /healthz on it answered 200 within half the watchdog's interval, so
 * a daemon whose HTTP server hangs stops pinging and systemd restarts it.
 * Returns 0, or a negative errno when the thread could not start (the
 * daemon goes on; systemd will see no pings). */
int sdnotify_ready(const char *listening);

/* STOPPING=1, and the watchdog thread ended and joined. */
void sdnotify_stopping(void);
