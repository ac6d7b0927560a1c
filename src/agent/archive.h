#pragma once
/*
 * The archive ops' child (REQ_ARCHIVE, REQ_UNARCHIVE): runs in a process of
 * its own, forked like an exec, so a large tree streams with the exec's flow
 * control and a hostile archive is read in a child of the sandbox's init,
 * not in init itself. stdout carries the tar (gzip or not) or, after an
 * unarchive, one JSON line; stderr one line saying why it failed.
 */
#include "agent/request.h"

/* Exit codes, read by the daemon. */
enum {
        ARCHIVE_EXIT_OK = 0,
        ARCHIVE_EXIT_FAILED = 1,
        ARCHIVE_EXIT_NOT_FOUND = 2,
        ARCHIVE_EXIT_NOT_A_DIRECTORY = 3,
        ARCHIVE_EXIT_MALFORMED = 4,
        ARCHIVE_EXIT_REFUSED = 5,
        ARCHIVE_EXIT_TOO_LARGE = 6,
        ARCHIVE_EXIT_PERMISSION = 7, /* EACCES: the user it runs as may not */
        ARCHIVE_EXIT_NO_SPACE = 8,   /* ENOSPC, EDQUOT: the sandbox's disk is full */
};

/* In the forked child; returns its exit code. */
int archive_child(const AgentRequest *r);
