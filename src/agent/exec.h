#pragma once
/* Starting an exec request's child: its own session and process group, pipes
 * for stdout/stderr (and stdin when the host streams it), the base environment
 * plus the request's. */
#include <sys/types.h>

#include "agent/request.h"

typedef struct ExecChild {
        pid_t pid;    /* also the process group id */
        int stdin_fd; /* write end, non-blocking; -1 without stdin streaming */
        int stdout_fd;
        int stderr_fd; /* read ends, non-blocking */
        /* With a pty, stdin_fd and stdout_fd are two descriptors of its master
         * (closing input must not close output), stderr_fd is -1. */
} ExecChild;

/* The environment every child starts from. */
extern const char *const exec_base_env[];

/* NULL-terminated environment: exec_base_env overridden/extended by
 * user_env (NULL-terminated, may be NULL: the user's HOME, USER, LOGNAME),
 * then by `extra` ("K=V" strings). Free with free() (the strings are borrowed). */
char **exec_build_env(const char *const user_env[], char *const extra[], size_t n_extra);

/* Starts the child (spawn in exec.c: on the agent's memory until its execve).
 * A child that cannot chdir or exec reports it on its stderr and exits 127
 * (126 when not executable), as a shell does. */
int exec_spawn(const AgentRequest *r, ExecChild *ret);

/* Where the agent has a work leaf (namespace driver): starts the process
 * that joins it once and starts every exec's child from there, so that no
 * command waits for a move between cgroups (exec.c). Without it, or when it
 * cannot start, children are started by the agent and move themselves. */
void exec_launcher_start(void);

/* Sets a terminal's window size (the kernel sends SIGWINCH to its
 * foreground group). */
int exec_pty_resize(int master_fd, unsigned cols, unsigned rows);

/* SIGKILL to the child and its whole process group. */
void exec_kill_group(pid_t pid);
