/* A volume attached to a running sandbox and detached again (volumes.md,
 * "Attaching to a running sandbox"): the writer's claim in the store, the
 * host's mount, the driver's bind into the running sandbox, and the
 * sandbox's spec, in that order, each undone when a later one fails. The
 * spec is what a later start binds, so an attachment outlives a stop and a
 * daemon's restart as one made at the create does. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/db.h"
#include "daemon/manager/manager-internal.h"
#include "daemon/manager/sandbox.h"
#include "daemon/manager/volumes.h"

/* Whether one path is the other or lies under it. */
static bool nested(const char *a, const char *b) {
        size_t na = strlen(a), nb = strlen(b), n = na < nb ? na : nb;
        return strncmp(a, b, n) == 0 && (na == nb || (na < nb ? b[na] : a[nb]) == '/');
}

/* Whether a sandbox in this state has its driver's processes, and so holds
 * its volumes: through the host's mount, or a guest's lock on the image. */
static bool holds_volumes(SandboxState s) {
        return s == SANDBOX_STARTING || s == SANDBOX_RUNNING || s == SANDBOX_PAUSING || s == SANDBOX_PAUSED ||
               s == SANDBOX_RESUMING || s == SANDBOX_STOPPING;
}

static bool guest_kernel(SandboxDriver driver) {
        const Driver *d = driver_by_name(sandbox_driver_name(driver));
        return d && d->volume_images;
}

/* The refusal when sandbox `holder` (on a driver with a guest kernel or
 * not) holds volume v, which a sandbox on driver d asks for; 0 when the
 * two may have it at once. */
static int kernel_conflict(SandboxError *e, const SandboxVolume *v, const Driver *d, const SandboxRow *holder,
                           bool holder_read_only) {
        bool guest = d->volume_images, holder_guest = guest_kernel(holder->spec.driver);
        const char *why = NULL, *hint = "delete or stop that sandbox first";
        if (!guest && holder_guest)
                why = "while a microVM's kernel has a volume, no namespace or gVisor sandbox attaches it, even "
                      "readOnly";
        else if (guest && !holder_guest)
                why = "a microVM takes a volume only while no namespace or gVisor sandbox has it, even readOnly";
        else if (guest && (!v->read_only || !holder_read_only)) {
                why = "microVMs share a volume only when none of them writes it: two kernels never write one "
                      "filesystem";
                hint = "attach it readOnly in every microVM, or delete or stop that sandbox first";
        }
        if (!why)
                return 0;
        return sandbox_error(e, SANDBOX_ERR_CONFLICT, hint, "volume %s is held by %s sandbox %s (%s): %s",
                             v->volume_id, sandbox_driver_name(holder->spec.driver), holder->id,
                             sandbox_state_name(holder->state), why);
}

int sandbox_volumes_check_kernels(Manager *m, const char *sandbox_id, const SandboxSpec *spec, const Driver *d,
                                  SandboxError *e) {
        int r = 0;
        for (size_t i = 0; r == 0 && m->volumes && i < spec->n_volumes; i++) {
                StoreVolumeAttachment *atts = NULL;
                size_t n = 0;
                /* Unreadable attachments leave the start to refuse. */
                if (volumes_attachments(m->volumes, spec->volumes[i].volume_id, &atts, &n) < 0)
                        continue;
                for (size_t j = 0; r == 0 && j < n; j++) {
                        SandboxRow holder = { 0 };
                        if (strcmp(atts[j].sandbox_id, sandbox_id) == 0 ||
                            db_sandbox_get(m->db, atts[j].sandbox_id, &holder) < 0)
                                continue;
                        if (holds_volumes(holder.state))
                                r = kernel_conflict(e, &spec->volumes[i], d, &holder, atts[j].read_only);
                        sandbox_row_done(&holder);
                }
                free(atts);
        }
        return r;
}

/* How long the agent has to bind or unbind a live volume. */
#define LIVE_AGENT_TIMEOUT_MS 20000

/* A driver that only brings the volume to the sandbox (gVisor, the
 * microVM): the agent puts the one it has under name at dest (mount) or
 * takes it away (name NULL). 0, or the agent's errno (-EBUSY: in use,
 * -EINVAL: nothing mounted there), -ESRCH when the sandbox does not answer. */
static int agent_live(Manager *m, const char *id, const char *name, const char *dest, bool read_only) {
        Sandbox *sb = live_get(m, id);
        if (!sb)
                return -ESRCH;
        bool mount = name != NULL;
        _cleanup_json_ json_t *req = mount ? agent_req_mount(dest, name, read_only) : agent_req_unmount(dest);
        _cleanup_json_ json_t *res = NULL;
        ChanStream *s = NULL;
        SandboxError e;
        int r = !req ? -ENOMEM : sandbox_open_stream(sb, req, &s, &e) < 0 ? -ESRCH : 0;
        if (r == 0) {
                r = agent_wait_result(s, LIVE_AGENT_TIMEOUT_MS, NULL, NULL, &res);
                chan_stream_free(s);
        }
        const char *msg = NULL;
        if (r == 0 && agent_result_error(res, &msg)) {
                json_int_t err = json_integer_value(json_object_get(res, "errno"));
                r = err > 0 && err < 4096 ? -(int)err : -EIO;
        } else if (r < 0 && r != -ENOMEM)
                r = -ESRCH;
        sandbox_unref(sb);
        return r;
}

/* The driver that runs the sandbox, able to change its mounts, and its
 * spec as a start had it. */
typedef struct LiveMounts {
        const Driver *d;
        SpecPaths paths;
        DriverSpec ds;
} LiveMounts;

typedef enum LiveCall { LIVE_MOUNT, LIVE_UNMOUNT, LIVE_HELD } LiveCall;

/* The driver's call on the running sandbox's instance, under its lock:
 * mount_live of dm (name gets the agent's name for it), unmount_live or
 * live_held of dest. -ESRCH when the sandbox runs no more. */
static int driver_live(Manager *m, const char *id, const LiveMounts *lm, LiveCall call, const DriverMount *dm,
                       const char *dest, char name[DRIVER_LIVE_NAME_LEN + 1]) {
        Sandbox *sb = live_get(m, id);
        if (!sb)
                return -ESRCH;
        int r = -ESRCH;
        pthread_mutex_lock(&sb->lock);
        if (sb->running && !sb->died && sb->inst)
                r = call == LIVE_MOUNT     ? lm->d->mount_live(sb->inst, &lm->ds, dm, name)
                    : call == LIVE_UNMOUNT ? lm->d->unmount_live(sb->inst, &lm->ds, dest)
                                           : lm->d->live_held(sb->inst, &lm->ds, dest);
        pthread_mutex_unlock(&sb->lock);
        sandbox_unref(sb);
        return r;
}

static int live_mounts(Manager *m, const SandboxRow *row, LiveMounts *ret, SandboxError *e) {
        const char *name = sandbox_driver_name(row->spec.driver);
        if (row->state != SANDBOX_RUNNING && row->state != SANDBOX_PAUSED)
                return conflict_state(e, row, "running", "attach it at the sandbox's create, or start the sandbox");
        ret->d = driver_by_name(name);
        if (ret->d && !ret->d->mount_live)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, "use the namespace driver",
                                     "the %s driver does not attach volumes to a running sandbox", name);
        if (ret->d && ret->d->live_bind_by_agent && row->state == SANDBOX_PAUSED)
                return conflict_state(e, row, "running", "resume the sandbox first: its agent binds the volume");
        if (!ret->d || spec_paths(m, row->id, row->spec.image, &ret->paths) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not find the sandbox's driver");
        driver_spec_from(m, row->id, &row->spec, &ret->paths, &ret->ds);
        return 0;
}

static int op_attach(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        const SandboxVolume *v = arg;
        SandboxSpec *spec = &row->spec;
        if (spec->n_volumes >= SANDBOX_MAX_VOLUMES)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "detach one first",
                                     "a sandbox attaches at most %d volumes", SANDBOX_MAX_VOLUMES);
        for (size_t i = 0; i < spec->n_volumes; i++) {
                if (strcmp(spec->volumes[i].volume_id, v->volume_id) == 0)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "detach it first",
                                             "volume %s is attached to sandbox %s already", v->volume_id, row->id);
                if (nested(spec->volumes[i].path, v->path))
                        return sandbox_error(e, SANDBOX_ERR_INVALID, "pick a path apart from the others",
                                             "path %s is at or under volume %s's %s", v->path,
                                             spec->volumes[i].volume_id, spec->volumes[i].path);
        }
        LiveMounts lm = { 0 };
        int r = live_mounts(m, row, &lm, e);
        if (r < 0) {
                spec_paths_done(&lm.paths);
                return r;
        }
        r = volumes_attach(m->volumes, row->owner, row->id, v);
        if (r < 0) {
                spec_paths_done(&lm.paths);
                if (r == -ENOENT)
                        return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "GET /v1/volumes lists your volumes",
                                             "volume %s not found", v->volume_id);
                if (r == -EBUSY)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT,
                                             "attach it with readOnly, or detach it from the sandbox that writes it",
                                             "volume %s is written by another sandbox", v->volume_id);
                if (r == -EAGAIN)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "try again once it is ready",
                                             "volume %s is being resized", v->volume_id);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the attachment");
        }
        SandboxSpec one = { .n_volumes = 1 };
        one.volumes[0] = *v;
        if ((r = sandbox_volumes_check_kernels(m, row->id, &one, lm.d, e)) < 0) {
                (void)volumes_detach(m->volumes, v->volume_id, row->id);
                spec_paths_done(&lm.paths);
                return r;
        }
        VolumeMountPaths vmp;
        size_t failed = 0;
        /* The host's mount bound into the sandbox, or the volume's image
         * (held, locked) given to its guest as a disk. */
        r = volumes_mounts(m->volumes, &one, lm.d->volume_images, &vmp, &failed);
        if (r == 0) {
                char name[DRIVER_LIVE_NAME_LEN + 1] = "";
                r = driver_live(m, row->id, &lm, LIVE_MOUNT, &vmp.mounts[0], NULL, name);
                volumes_mounts_close(&vmp);
                if (r == 0 && lm.d->live_bind_by_agent && (r = agent_live(m, row->id, name, v->path, v->read_only)) < 0)
                        (void)driver_live(m, row->id, &lm, LIVE_UNMOUNT, NULL, v->path, NULL);
        }
        if (r == 0) {
                spec->volumes[spec->n_volumes++] = *v;
                if ((r = db_sandbox_update(m->db, row)) < 0) {
                        spec->n_volumes--;
                        if (lm.d->live_bind_by_agent)
                                (void)agent_live(m, row->id, NULL, v->path, false);
                        (void)driver_live(m, row->id, &lm, LIVE_UNMOUNT, NULL, v->path, NULL);
                }
        }
        spec_paths_done(&lm.paths);
        if (r == 0) {
                log_info(rid, "volume %s attached to running sandbox %s at %s%s", v->volume_id, row->id, v->path,
                         v->read_only ? " (read-only)" : "");
                return 0;
        }
        (void)volumes_detach(m->volumes, v->volume_id, row->id);
        log_error(rid, "attaching volume %s to sandbox %s at %s: %s", v->volume_id, row->id, v->path, strerror(-r));
        if (r == -ENOTDIR)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "name a directory, or a path that does not exist yet",
                                     "path %s is not a directory in the sandbox, or a symbolic link is on its way",
                                     v->path);
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "volume %s is not on this host", v->volume_id);
        if (r == -EBUSY)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL,
                                     "volume %s is still held by a sandbox that has not ended", v->volume_id);
        if (r == -ENOSPC)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "detach one first",
                                     "sandbox %s has no free disk slot for another %s volume", row->id,
                                     v->read_only ? "read-only" : "writable");
        /* A sandbox started before live attaches existed has no live
         * directory (ESRCH), an agent without the helper or a guest
         * without the disk slots (ENOSYS). */
        if (r == -ESRCH || r == -ENOSYS)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "stop and start the sandbox, then attach again",
                                     "sandbox %s cannot take a volume while it runs: it was started without the "
                                     "means to", row->id);
        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not attach the volume");
}

int sandbox_volume_attach(Manager *m, const KeyInfo *key, const char *id, const SandboxVolume *v, const char *rid,
                          SandboxError *e) {
        if (!m->volumes)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, NULL, "this daemon keeps no volumes");
        return with_row(m, key, id, op_attach, (void *)v, rid, NULL, e);
}

/* The volume v taken away from the running sandbox: its bind inside (the
 * agent's, where the driver has it make one), then the host's part. */
static int unmount_live(Manager *m, const SandboxRow *row, const LiveMounts *lm, const SandboxVolume *v,
                        const char *rid, SandboxError *e) {
        int r = 0;
        if (lm->d->live_bind_by_agent) {
                if (driver_live(m, row->id, lm, LIVE_HELD, NULL, v->path, NULL) == 0)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "stop the sandbox, then detach it",
                                             "volume %s was given at sandbox %s's create: the %s driver detaches it "
                                             "only while the sandbox is stopped",
                                             v->volume_id, row->id, lm->d->name);
                r = agent_live(m, row->id, NULL, v->path, false);
                /* EINVAL: the bind is gone already; the host's part goes
                 * all the same. */
                if (r == -EINVAL || r == -ENOENT)
                        r = 0;
        }
        if (r == 0) {
                r = driver_live(m, row->id, lm, LIVE_UNMOUNT, NULL, v->path, NULL);
                /* EINVAL: nothing is mounted there (root inside
                 * unmounted it itself). */
                if (r == -EINVAL || r == -ENOENT)
                        r = 0;
        }
        if (r == -EBUSY)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT,
                                     "close the files open in it (end the processes that use it) and detach again",
                                     "volume %s is in use in sandbox %s", v->volume_id, row->id);
        if (r < 0) {
                log_error(rid, "detaching volume %s from sandbox %s: %s", v->volume_id, row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not detach the volume");
        }
        return 0;
}

static int op_detach(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        const char *volume_id = arg;
        SandboxSpec *spec = &row->spec;
        size_t i = 0;
        while (i < spec->n_volumes && strcmp(spec->volumes[i].volume_id, volume_id) != 0)
                i++;
        if (i == spec->n_volumes)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "GET /v1/volumes/{id} lists its attachments",
                                     "volume %s is not attached to sandbox %s", volume_id, row->id);
        /* A sandbox that is not running holds no bind: the next start
         * leaves the volume out. */
        if (row->state == SANDBOX_RUNNING || row->state == SANDBOX_PAUSED) {
                LiveMounts lm = { 0 };
                int r = live_mounts(m, row, &lm, e);
                if (r == 0)
                        r = unmount_live(m, row, &lm, &spec->volumes[i], rid, e);
                spec_paths_done(&lm.paths);
                if (r < 0)
                        return r;
        }
        SandboxVolume gone = spec->volumes[i];
        for (; i + 1 < spec->n_volumes; i++)
                spec->volumes[i] = spec->volumes[i + 1];
        spec->n_volumes--;
        int r = db_sandbox_update(m->db, row);
        if (r == 0)
                r = volumes_detach(m->volumes, gone.volume_id, row->id);
        if (r < 0 && r != -ENOENT) {
                log_error(rid, "recording the detach of volume %s from sandbox %s: %s", volume_id, row->id,
                          strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the detach");
        }
        log_info(rid, "volume %s detached from sandbox %s", volume_id, row->id);
        return 0;
}

int sandbox_volume_detach(Manager *m, const KeyInfo *key, const char *id, const char *volume_id, const char *rid,
                          SandboxError *e) {
        if (!m->volumes)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, NULL, "this daemon keeps no volumes");
        return with_row(m, key, id, op_detach, (void *)volume_id, rid, NULL, e);
}
