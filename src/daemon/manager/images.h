#pragma once
/* The images on this host (cfg->image_dir/<name>/rootfs, made by the image
 * builder). */
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/timeutil.h"

#define IMAGE_MAX_NAME 64

struct DaemonConfig;

typedef struct ImageInfo {
        char name[IMAGE_MAX_NAME + 1];
        bool built;                 /* present and up to date with its recipe */
        char built_at[RFC3339_LEN]; /* "" when unknown */
        uint64_t size_bytes;
} ImageInfo;

/* Names of this shape travel into host paths: [a-z0-9][a-z0-9_-]{0,63}. */
bool image_name_ok(const char *s);
/* One image; a missing one is not built. */
int image_info(const struct DaemonConfig *cfg, const char *name, ImageInfo *ret);
/* fn for each image (and for "default" even when absent); a negative return
 * from fn stops the walk and is returned. */
typedef int (*ImageFn)(void *userdata, const ImageInfo *info);
int images_list(const struct DaemonConfig *cfg, ImageFn fn, void *userdata);

/* Starts building an image: the builder (cfg->image_builder), then `then`
 * (NULL: none; the microVM's builder) on success, in a process group of its
 * own (its pgid is the returned pid) with a clean signal mask, writing their
 * log to out_fd. The caller reaps it, or stops it with image_build_stop. */
int image_build_start(const struct DaemonConfig *cfg, const char *name, bool force, const char *then, int out_fd,
                      pid_t *ret);
/* Stops a build: SIGTERM to its group, grace_ms for the builder to clean up,
 * then SIGKILL; reaps it. Its wait status, or a negative errno. */
int image_build_stop(pid_t pid, int grace_ms);
