#pragma once
/*
 * The warm pool (docs/warm-pool.md): per configured (driver, image, shape),
 * a few sandboxes started ahead, their agents' hello in, handed out to a
 * create that asks for exactly that driver, image and shape. A pool
 * sandbox belongs to no owner and has no row in the store until it is
 * handed out: no owner lists it, counts it or pays for it. The create's
 * row, env, labels, network policy, secrets, user and lease are all the
 * daemon's side of the sandbox (the drivers start a sandbox from its id,
 * image and shape alone), so a pooled create applies them exactly as a
 * cold one does. A sandbox handed out is its owner's for good; the pool
 * never takes one back. Refills run one at a time, only while no client's
 * create is in progress.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "daemon/model/sandbox_spec.h"

/* Classes a daemon keeps, and sandboxes one class keeps ready: each one
 * holds its processes and memory while it waits. */
#define WARM_POOL_MAX_CLASSES 8u
#define WARM_POOL_MAX_SIZE 32u

/* One class as the operator writes it: DRIVER:IMAGE[:VCPUxMEMORY_MIBxDISK_MIB]=N. */
typedef struct WarmPoolSpec {
        SandboxDriver driver;
        char image[65];
        unsigned vcpu, memory_mib, disk_mib; /* left out: a create's defaults (1, 1024, 2048) */
        unsigned size;                       /* 1..WARM_POOL_MAX_SIZE */
} WarmPoolSpec;

/* -EINVAL with why for text that is no class: a driver the pool does not
 * serve, a name that is no image's, a shape outside the create's own
 * bounds' floors (1 vCPU, 64 MiB), a size outside 1..WARM_POOL_MAX_SIZE. */
int warm_pool_spec_parse(const char *text, WarmPoolSpec *ret, char *why, size_t why_len);
/* "VCPUxMEMORYxDISK": the shape as the option and the metrics' label say it. */
void warm_pool_spec_shape(const WarmPoolSpec *s, char *buf, size_t n);

typedef struct Manager Manager;

/* Reads cfg->warm_pools (every class's driver offered and available, its
 * shape within the daemon's bounds, at most WARM_POOL_MAX_CLASSES) and
 * starts the thread that fills them. After manager_start; nothing without
 * classes. -EINVAL with why for a class this daemon cannot keep. */
int manager_start_warm_pool(Manager *m, char *why, size_t why_len);
/* The pool's figures, in Prometheus' text format: per class the sandboxes
 * ready, its size, hand-outs (hits) and creates of its shape that found
 * none ready (misses). Nothing without classes. */
void manager_render_warm_pool(Manager *m, FILE *f);
