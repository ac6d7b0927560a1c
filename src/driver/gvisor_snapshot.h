#pragma once
/*
 * Memory snapshots of a gVisor sandbox: runsc checkpoint saves the Sentry's
 * kernel (every process, its memory, open files, pipes and sockets inside)
 * while the sandbox's disk is copied at the same stop, and runsc restore
 * starts a new sandbox that runs on from there. A snapshot's directory holds
 * what a disk snapshot's does (layer.img, bases/), checkpoint.img (runsc's
 * image) and machine (what the saved kernel depends on); a new sandbox made
 * from it holds them, until the start that restores them, as resume/ and
 * resume.machine in its sandbox_dir.
 */
#include <stdbool.h>
#include <stddef.h>

#include "driver/driver.h"

/* The runsc a sandbox runs under: the binary, its version and platform. */
typedef struct GvisorRunsc {
        const char *path;
        const char *version;
        const char *platform;
} GvisorRunsc;

/* Saves inst, stopped by the daemon (gvisor_runsc_pause) with its agent's
 * channel empty, into dest_dir (new, empty): its disk is copied and its
 * kernel saved (runsc checkpoint --leave-running) at that stop, and it is
 * left stopped. why says what failed, for the daemon's log. -ESTALE when a
 * process holds a deleted file open, which the Sentry could not save
 * before runsc 2025; the sandbox carries on. */
int gvisor_snapshot_save(DriverInstance *inst, const DriverSpec *spec, const GvisorRunsc *rs, const char *dest_dir,
                         char *why, size_t why_len);
/* Stops every task of inst inside its Sentry (runsc pause), or lets them run
 * on (runsc resume): a gVisor sandbox's pause. Not the host's cgroup
 * freezer: systrap's stubs wait for the Sentry in a seccomp user
 * notification, which a freeze interrupts, and the runsc pinned here then
 * takes the stub for dead and kills it (the next process of that address
 * space dies of SIGSEGV or SIGKILL; docs/drivers.md). */
int gvisor_runsc_pause(DriverInstance *inst, const GvisorRunsc *rs, bool pause);
/* Whether a snapshot's directory holds a saved kernel. */
bool gvisor_snapshot_has_memory(const char *snap_dir);
/* A new sandbox from a memory snapshot: the saved kernel linked into its
 * sandbox_dir so that its first start restores it (the disk is
 * launch_restore_disk's). */
int gvisor_snapshot_link(const char *snap_dir, const char *sandbox_dir);
/* Whether the next start restores a saved kernel; ret_dir gets the image
 * directory to pass to runsc restore. */
bool gvisor_snapshot_pending(const char *sandbox_dir, char *ret_dir, size_t len);
/* -ESTALE when the saved kernel was made with another runsc, platform,
 * agent, image or shape than spec and rs have now. */
int gvisor_snapshot_check(const DriverSpec *spec, const GvisorRunsc *rs, char *why, size_t why_len);
/* Removes a saved kernel the sandbox has not restored: a start tries it
 * once, and a later start boots from the disk. */
void gvisor_snapshot_forget(const char *sandbox_dir);
