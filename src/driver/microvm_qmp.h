#pragma once
/*
 * A client of QEMU's monitor protocol (QMP) over a socket the daemon made:
 * one JSON object per line, replies in order, events skipped. QEMU is the
 * sandbox's VMM and so not trusted: lines are bounded and every wait has a
 * deadline.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct MicrovmQmp {
        int fd;
        char buf[65536]; /* one line at most this long */
        size_t len;
} MicrovmQmp;

/* Runs one command (a JSON object and "\n"); pass_fd (or -1) goes along by
 * SCM_RIGHTS. 0 and the "return" value (when ret), -EIO with the error's
 * text in why, -ETIMEDOUT past deadline (a CLOCK_MONOTONIC time in ms),
 * -EPROTO for what is not QMP. */
int microvm_qmp_exec(MicrovmQmp *q, const char *cmd, int pass_fd, int64_t deadline, json_t **ret, char *why,
                     size_t why_len);

/* Brings back in step a monitor that another client used before (an earlier
 * daemon, killed in the middle of a command): its reply, or the rest of a
 * reply it had half read, may still wait in the socket, and would be taken
 * for the answer to the next command. Sends `execute` (a command without
 * arguments) with an id of its own and drops every line up to the reply that
 * carries that id, whatever it says: 0, -ETIMEDOUT, -EPIPE. */
int microvm_qmp_resync(MicrovmQmp *q, const char *execute, int64_t deadline);

/* Saves the guest (QMP migrate) into state_fd, a file, and waits for the
 * save to complete: a running guest is saved live and left stopped, a
 * stopped one in one pass. -EIO with the reason in why. */
int microvm_qmp_save(MicrovmQmp *q, int state_fd, int64_t deadline, char *why, size_t why_len);
