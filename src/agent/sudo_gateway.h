#pragma once
/*
 * The sudo gateway (docs/drivers.md, "sudo"): where the sandbox runs under
 * no_new_privs (bubblewrap always sets it; gVisor's Sentry grants no
 * set-uid on exec), the image's set-uid sudo cannot become root. The agent,
 * root inside the sandbox's user namespace, then serves a unix socket on
 * which the `sudo` front (the agent binary under that name, placed ahead of
 * /usr/bin on PATH) hands over a command with its descriptors; the gateway
 * runs it as root or another user, relays the front's signals to it and
 * returns its wait status. Only root and the image's sandbox user may use
 * it, as the image's sudoers says.
 */
#include <sys/types.h>

/* Starts the gateway in a process of its own when this sandbox needs one
 * (no_new_privs set, the image has /usr/bin/sudo and a sandbox user, no
 * SUDO_OFF_PATH) and places the front. 0 and *ret_pid (0: not needed), or a
 * negative errno. */
int sudo_gateway_start(pid_t *ret_pid);
