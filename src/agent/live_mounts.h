#pragma once
/*
 * Volumes attached to a running gVisor sandbox (docs/volumes.md, "Attaching
 * to a running sandbox"). The host binds the volume under a directory the
 * sandbox was given at its start (AGENT_LIVE_DIR, served by the gofer with
 * shared file access, so a host mount made later shows); a helper process,
 * forked at the agent's start and the only one in the sandbox that keeps
 * CAP_SYS_ADMIN, binds it from there to the path asked for. Before any
 * command runs the agent hides that directory under an empty read-only
 * tmpfs, refuses mount(2) and umount2(2) to itself and all it starts, and
 * drops CAP_SYS_ADMIN: no process of the sandbox reaches a volume that is
 * not bound, or binds anything itself.
 */
#include <stdbool.h>
#include <stddef.h>

#define AGENT_LIVE_DIR "/.runtime/live"
/* A volume's name under AGENT_LIVE_DIR: 16 lowercase hex digits. */
#define AGENT_LIVE_NAME_LEN 16

/* Forks the helper, hides AGENT_LIVE_DIR, then takes mount(2), umount2(2)
 * and CAP_SYS_ADMIN away from the agent. Before the agent starts anything
 * else. 0 or a negative errno (the agent then runs without live mounts:
 * the host's requests are refused); -ENOTRECOVERABLE when the agent could
 * not take mount(2) or CAP_SYS_ADMIN away from itself: it must exit. */
int live_mounts_start(void);

/* Binds AGENT_LIVE_DIR/name at dest (made, owned by root, where missing;
 * no symbolic link followed on the way), nosuid, nodev, read-only if asked.
 * -ENOTDIR when dest is not a directory or a link is on its way, -ENOENT
 * when the host has not bound name, -ENOSYS without the helper. */
int live_mounts_bind(const char *name, const char *dest, bool read_only);
/* Unmounts dest, never lazily: -EBUSY while a file in it is open or a
 * process has its cwd there, -EINVAL when nothing is mounted there. */
int live_mounts_unbind(const char *dest);

/* Whether name is AGENT_LIVE_NAME_LEN lowercase hex digits (pure: the
 * request parser's fuzz target compiles it in). */
static inline bool live_mounts_name_valid(const char *name) {
        size_t n = 0;
        for (; name && name[n]; n++)
                if (!((name[n] >= '0' && name[n] <= '9') || (name[n] >= 'a' && name[n] <= 'f')))
                        return false;
        return name && n == AGENT_LIVE_NAME_LEN;
}
