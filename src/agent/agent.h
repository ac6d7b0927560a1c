#pragma once
/*
 * The agent's event loop: one thread, poll(2) over the channel, every child's
 * pipes and a signalfd. Frames out are queued and written without blocking;
 * a stream's DATA stays within the host's credit, and the children's pipes are
 * not read while the channel's queue is full, so a slow host stalls the
 * children, never the agent.
 */
#include <stdbool.h>
#include <stdint.h>

#define AGENT_MAX_STREAMS 256
/* Above this many queued outgoing bytes no more DATA is produced. */
#define AGENT_OUT_SOFT_LIMIT (4u * 1024u * 1024u)
/* A stream with this much DATA waiting in the queue produces no more until
 * the channel took it, so that one busy stream cannot fill the queue and
 * delay everybody else's frames. */
#define AGENT_STREAM_QUEUE_LIMIT (256u * 1024u)
/* Above this, the channel itself is not read any more (a host that floods
 * PINGs without reading the PONGs cannot grow the queue without end). */
#define AGENT_OUT_HARD_LIMIT (64u * 1024u * 1024u)
/* How long the output of an exited leader may still be drained before its
 * process group is killed (a background job holding the pipes open). */
#define AGENT_DRAIN_MS 100
/* A killed process group is killed again this often until none of it is
 * left (gVisor's kill of a group can miss a child being forked). */
#define AGENT_REKILL_MS 10

/* Between a DETACH and the next ATTACH (the host's daemon is away) every
 * exec's output is held in the agent, newest bytes kept: at most this much
 * per exec and in all. The held bytes are the sandbox's memory, charged to
 * it like any process's: the bounds keep a process that prints without end
 * from costing more. */
#define AGENT_HOLD_STREAM_BYTES (4u * 1024u * 1024u)
#define AGENT_HOLD_TOTAL_BYTES (16u * 1024u * 1024u)

/* Inside every sandbox, programs reach the network only through this relay
 * (HTTP_PROXY points at it); each connection is carried over the channel to
 * the daemon's egress proxy. */
#define AGENT_RELAY_PORT 3128

/* The memory watch looks this often, and waits this long after a kill for
 * the memory to be freed before it looks again; at most RELEASE for a count
 * that is not going up (gVisor gives a killed process's memory back from a
 * goroutine: within ~200 ms here, later under load with one vCPU). */
#define AGENT_MEMORY_POLL_MS 50
#define AGENT_MEMORY_SETTLE_MS 250
#define AGENT_MEMORY_RELEASE_MS 1500
/* Far from the limit, the watch looks less often: never later than the
 * sandbox's processes could fill what is free at FILL_BYTES_PER_S, and at
 * least once every IDLE_POLL_MS. Each look wakes gVisor's Sentry, and twenty
 * a second kept an idle gVisor sandbox at about 1.3% of a core (a hundred of
 * them, more than one core of two). 4 GiB/s is five times the fastest fill
 * measured in a gVisor sandbox here (bytearray and mmap writes, 0.8 GiB/s);
 * between two looks the host's headroom above memoryMiB stays what it was. */
#define AGENT_MEMORY_FILL_BYTES_PER_S (4ull << 30)
#define AGENT_MEMORY_IDLE_POLL_MS 1000

/* When the memory watch looks next, in ms from now, with free_bytes left
 * under the limit: from AGENT_MEMORY_POLL_MS to AGENT_MEMORY_IDLE_POLL_MS. */
uint64_t agent_memory_look_ms(uint64_t free_bytes);

typedef struct Agent Agent;

/* in_fd/out_fd may be the same descriptor; both are switched to non-blocking.
 * sig_fd is a signalfd for SIGCHLD, SIGTERM, SIGINT (blocked by the caller).
 * The agent owns none of them. */
Agent *agent_new(int in_fd, int out_fd, int sig_fd);
void agent_free(Agent *a);
/* Listens on 127.0.0.1:port for the egress relay. A negative errno when the
 * sandbox has no loopback to listen on; the agent then runs without it. */
int agent_relay_listen(Agent *a, uint16_t port);
/* A microVM restored from a snapshot is told so by the host's first request,
 * `resume` (docs/protocol.md): fn applies it (entropy, clock, hostname) and
 * the agent then answers RESULT and sends a new HELLO. Without this call, or
 * after any other first request, `resume` is refused. */
struct AgentRequest;
void agent_set_resume(Agent *a, int (*fn)(const struct AgentRequest *r));
/* An agent whose machine the host may save and copy while it runs (gVisor's
 * runsc checkpoint): `checkpoint` is accepted, and only after it does a
 * first `resume` (a copy's) apply fn. A fresh start refuses `resume`. */
void agent_set_checkpoint(Agent *a, int (*fn)(const struct AgentRequest *r));
/* How `mount` and `unmount` (a volume attached to the running sandbox)
 * are carried out: by default the helper of agent/live_mounts.h (gVisor);
 * a microVM's agent mounts a disk of its own kernel (vm_live_mount). */
void agent_set_mounts(Agent *a, int (*mount)(const char *name, const char *dest, bool read_only),
                      int (*unmount)(const char *dest));
/* Makes the agent end the largest process whenever the sandbox's memory in
 * use (limits_memory_used) reaches `bytes`, for a driver whose kernel does
 * not do it inside the sandbox (gVisor). */
void agent_set_memory_limit(Agent *a, uint64_t bytes);
/* Sends HELLO and runs until the channel ends (1), a malformed frame (1) or
 * SIGTERM/SIGINT (0). Every child's process group is killed on the way out.
 * Returns the exit status for main. */
int agent_run(Agent *a);
