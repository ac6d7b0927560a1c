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
#include <stdbool.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <termios.h>

#include "agent/sudo_wire.h"

/* Starts the gateway in a process of its own when this sandbox needs one
 * (no_new_privs set, the image has /usr/bin/sudo and a sandbox user, no
 * SUDO_OFF_PATH) and places the front. 0 and *ret_pid (0: not needed), or a
 * negative errno. */
int sudo_gateway_start(pid_t *ret_pid);

/* A terminal of the command's own, as Debian's sudoers asks (use_pty) when
 * the caller's stdin, stdout or stderr is one: the command gets a
 * controlling terminal (job control, /dev/tty) in its session, the caller's
 * terminal is put in raw mode and relayed to it byte for byte, so Ctrl-C
 * is the command's terminal's own interrupt. Declared here for the unit
 * tests of the command's start. */
typedef struct SudoPty {
        int master; /* -1: no terminal of the command's own */
        int slave;  /* the command's side, opened before the fork */
        int in;     /* the caller's terminal as stdin, or -1 */
        int out;    /* where the command's terminal output goes */
        int size_of; /* a caller's terminal to take the window size from */
        bool slave_for[3];
        bool have_termios, raw, master_gone;
        bool have_ws;       /* ws is the size last set on master */
        struct winsize ws;
        struct termios termios;
        char to_cmd[4096], to_user[4096];
        size_t to_cmd_len, to_cmd_off, to_user_len, to_user_off;
} SudoPty;

struct pollfd;
/* One step of the relay between the caller's terminal and the command's,
 * after poll said which of in (the caller's input), master and out are
 * ready. Input read from the caller carries the caller's window size onto
 * the command's terminal first. */
void sudo_pty_relay(SudoPty *p, const struct pollfd *in, const struct pollfd *master, const struct pollfd *out);

/* A terminal for the command when one of the caller's fds is one (else
 * master -1), with the caller's modes and window size. 0 or a negative
 * errno. */
int sudo_pty_open(SudoPty *pty, const int fds[3]);

/* Forks argv as t in a session of its own, on the caller's fds (or pty's
 * side where the caller's was a terminal), and returns only once that
 * child has its session and pty as its controlling terminal, its group in
 * the foreground: from then on a ^C written to pty->master signals it.
 * Closes pty->slave. 0 and *ret_pid, or a negative errno. */
int sudo_command_start(const int fds[3], SudoPty *pty, const SudoTarget *t, const gid_t *gids, size_t n_gids,
                       const char *cwd, char **argv, char **env, pid_t *ret_pid);
