#pragma once
/*
 * Processes: every exec runs as one, with an id, on one channel stream of
 * its sandbox. A reader thread per process drains that stream into a bounded
 * ring of output (stdout and stderr in one byte sequence, addressed by a
 * cursor), so the process outlives the request that started it and any number
 * of readers attach at any cursor (docs/protocol.md says why the ring lives
 * here and not in the agent). Finished processes stay readable for
 * PROC_RETAIN_MS. No HTTP here: the routes and the events' JSON are in
 * api_processes.c.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/manager/sandbox.h"
#include "daemon/manager/sandbox_error.h"

#define PROC_RING_BYTES (8u * 1024u * 1024u)     /* output kept per process */
#define PROC_SANDBOX_BYTES (32u * 1024u * 1024u) /* output kept per sandbox, all its processes */
#define PROC_TABLE_BYTES (256u * 1024u * 1024u)  /* output kept by the daemon */
#define PROC_MAX_RUNNING 32                      /* running processes per sandbox */
/* Running processes of one owner across its sandboxes on this host
 * (--max-processes-per-owner), so that one owner's many sandboxes cannot
 * take the threads and memory every owner's processes share: the default,
 * eight sandboxes' worth, and the largest that may be set. */
#define PROC_OWNER_RUNNING_DEFAULT (8 * PROC_MAX_RUNNING)
#define PROC_OWNER_RUNNING_MAX 65536
#define PROC_MAX_KEPT 64                         /* processes per sandbox, running or kept */
#define PROC_RETAIN_MS (10u * 60u * 1000u)       /* a finished process stays readable this long */
#define PROC_ID_LEN 21                           /* "proc_" + 16 hex */
#define PROC_SANDBOX_ID_MAX 32

typedef struct ProcTable ProcTable;
typedef struct Proc Proc;

typedef enum ProcState {
        PROC_RUNNING,
        PROC_EXITED,    /* exit_code set */
        PROC_KILLED,    /* a signal ended it; exit_code is 128 + the signal */
        PROC_TIMED_OUT, /* its timeout killed its group */
        PROC_LOST,      /* its sandbox stopped; reason says so */
        PROC_FAILED,    /* the agent could not run it; reason says why */
} ProcState;

/* "running", "exited", "killed", "timed_out", "lost", "failed". */
const char *proc_state_name(ProcState s);

/* How a process ended (state PROC_RUNNING while it runs). */
typedef struct ProcExit {
        ProcState state;
        bool has_exit_code;
        int exit_code;
        bool timed_out;
        int64_t duration_ms;
        int64_t oom_killed;  /* processes of the command the kernel or the agent killed for memory */
        unsigned memory_mib; /* the sandbox's memory, for the report of an OOM kill */
        bool detached;       /* PROC_LOST because the daemon let its sandbox go: it runs on */
        char reason[256];
} ProcExit;

/* What a process is, copied out. */
typedef struct ProcInfo {
        char id[PROC_ID_LEN + 1];
        char command[1025];
        char user[16]; /* who it runs as: asked for, or as the agent says it ran it */
        ProcExit exit;
        int pid; /* 0 until the agent said */
        int64_t started_unix, ended_unix;
        uint64_t output_bytes, stdin_offset;
        bool stdin_open;
        bool base64;
        bool pty; /* runs on a terminal: its output is the terminal's, input its keys */
        unsigned pty_cols, pty_rows;
} ProcInfo;

ProcTable *proc_table_new(void);
/* Cancels every running process and waits for its reader thread. */
void proc_table_free(ProcTable *t);
/* The owner's bound on running processes, PROC_OWNER_RUNNING_DEFAULT until
 * set: -ERANGE (the bound unchanged) outside 1 .. PROC_OWNER_RUNNING_MAX. */
int proc_table_set_owner_max(ProcTable *t, unsigned max);
unsigned proc_table_owner_max(ProcTable *t);

typedef struct ProcSpec {
        const char *owner;
        const char *command; /* as listed: the command line or argv joined */
        const char *user;    /* "sandbox" or "root", as asked for */
        bool base64;         /* every output event carries its bytes as base64 */
        bool stdin_pipe;     /* keep stdin open for proc_write */
        bool pty;            /* the request asks the agent for a terminal of pty_cols x pty_rows */
        unsigned pty_cols, pty_rows;
        const uint8_t *stdin_data;
        size_t stdin_len;
} ProcSpec;

/* Starts a process on sb (the caller's reference is taken over, also on
 * failure) with `request` (borrowed) as the agent's exec request. A 429
 * when the owner runs its bound of processes across its sandboxes (checked
 * first), or the sandbox PROC_MAX_RUNNING; the check and the process's
 * entry into the table are one under the table's lock, so starts at once
 * never pass a bound together. *ret holds a reference (proc_unref). A retry with
 * an Idempotency-Key finds its first process through the daemon's one store
 * of keys (http.c) and proc_find. */
int proc_start(ProcTable *t, Sandbox *sb, json_t *request, const ProcSpec *spec, Proc **ret, SandboxError *e);
/* A process the agent kept while no daemon was attached (docs/lifecycle.md,
 * "Live restore"), made again from `kept` (one member of the agent's
 * attached.processes, borrowed) on its old stream of sb's channel (sb's
 * reference is taken over, also on failure). Its output from before the gap
 * was in the old daemon's ring: its ring starts at the first byte the agent
 * held. -EBADMSG for a listing no tag of this daemon's makes, -EEXIST. */
int proc_adopt(ProcTable *t, Sandbox *sb, json_t *kept);
/* A reference to the process, or NULL (unknown to this owner and sandbox). */
Proc *proc_find(ProcTable *t, const char *owner, const char *sandbox_id, const char *id);
void proc_unref(Proc *p);
const char *proc_id(Proc *p);
void proc_info(Proc *p, ProcInfo *ret);
/* fn for each of the sandbox's processes, oldest first; stops at and
 * returns fn's first negative value. */
typedef int (*ProcInfoFn)(void *userdata, const ProcInfo *info);
int proc_list(ProcTable *t, const char *owner, const char *sandbox_id, ProcInfoFn fn, void *userdata);

/* Writes input at `offset` (the writer's count of bytes already accepted; -1
 * for "wherever it is"): bytes below the process's own count were accepted
 * before and are skipped, an offset past it is a 409. *ret_offset is the new
 * count. `eof` closes stdin once every byte is in. */
int proc_write(Proc *p, const uint8_t *data, size_t len, int64_t offset, bool eof, uint64_t *ret_offset,
               SandboxError *e);
/* A terminal process's new window size; a conflict when it has ended or
 * has no terminal. */
int proc_resize(Proc *p, unsigned cols, unsigned rows, SandboxError *e);
/* Sends a signal to the process group; a conflict when it has ended. */
int proc_signal(Proc *p, int signo, SandboxError *e);
/* Blocks until the agent said the process runs (its pid is known) or it
 * ended, or timeout_ms passes. */
bool proc_wait_started(Proc *p, int timeout_ms);
/* Blocks until the process ends or timeout_ms passes; true when it ended. */
bool proc_wait(Proc *p, int timeout_ms);

/* Reading the output: events from a cursor (a byte offset into stdout and
 * stderr together). */
typedef enum ProcEventKind {
        PROC_EV_OUTPUT,    /* fd, offset, data/len (malloc'ed, the caller frees), base64 */
        PROC_EV_TRUNCATED, /* dropped bytes, resume_at: output lost to the ring */
        PROC_EV_EXIT,      /* exit: the last event */
} ProcEventKind;

typedef struct ProcEvent {
        ProcEventKind kind;
        int fd;
        uint64_t offset;
        uint8_t *data;
        size_t len;
        bool base64; /* the process asked for its bytes in every event */
        uint64_t dropped, resume_at;
        ProcExit exit;
} ProcEvent;

typedef struct ProcCursor {
        uint64_t at;
        bool ended;       /* exit or error given */
        size_t max_bytes; /* output bytes per event at most, for a reader with
                           * that much room; 0 for the default (256 KiB) */
} ProcCursor;

/* The next event from the cursor: 0 and *ret, -EAGAIN when there is none
 * within timeout_ms (the process runs on), -ENODATA once the exit was given.
 * Output is never split inside a character while more may come. */
int proc_next_event(Proc *p, ProcCursor *c, int timeout_ms, ProcEvent *ret);
/* The reader is gone: the drain no longer waits for it. */
void proc_cursor_done(Proc *p, ProcCursor *c);
/* Whether the process has ended (its exit event is ready). */
bool proc_ended(Proc *p);
