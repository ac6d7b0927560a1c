#pragma once
/*
 * The archive ops' child (REQ_ARCHIVE, REQ_UNARCHIVE): runs in a process of
 * its own, forked like an exec, so a large tree streams with the exec's flow
 * control and a hostile archive is read in a child of the sandbox's init,
 * not in init itself. stdout carries the tar (gzip or not) or, after an
 * unarchive, one JSON line; stderr one line saying why it failed.
 */
#include "agent/request.h"
#include "proto/proto.h"


/* In the forked child; returns its exit code. */
int archive_child(const AgentRequest *r);
