#pragma once
/*
 * A driver's own exchange with a restored sandbox's agent, before the
 * daemon's channel takes the descriptor: the resume that a copy of a saved
 * machine (a microVM's template or memory snapshot, a gVisor memory
 * snapshot) needs as its first request (docs/protocol.md).
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Reads exactly one frame of the channel (never a byte more: what follows is
 * the daemon's) by the deadline (a monotonic ms time), which must be of type
 * `type` on `stream`. Its JSON payload, when ret is not NULL. */
int driver_agent_read_frame(int fd, uint8_t type, uint32_t stream, int64_t deadline, json_t **ret);

/* The agent's resume on a restored machine's channel (the first request it
 * takes): on a microVM its kernel gets fresh entropy and is reseeded, its
 * clock set, its hostname made `id`; gVisor's agent applies none of it. The
 * agent drops the streams of the channel before its checkpoint. Reads
 * exactly the answer, so that what follows (its HELLO) is the daemon's. why
 * says what failed. */
int driver_agent_resume(int chan, const char *id, int64_t deadline, char *why, size_t why_len);
