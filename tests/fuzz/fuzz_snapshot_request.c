/* Arbitrary bytes through the snapshot routes' body checks: :snapshot,
 * :fork, a snapshot's :update and :extend, and POST /v1/sandboxes with a
 * snapshot (its driver, image and shape filled from the snapshot's spec,
 * then the create's own parser). The first byte picks the body. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api/api.h"
#include "daemon/api/api_snapshots.h"
#include "daemon/http/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A snapshot's spec as the daemon records it from its source's create. */
static const char spec_text[] = "{\"driver\":\"namespace\",\"image\":\"default\",\"vcpu\":1,\"memoryMiB\":1024,"
                                "\"diskMiB\":2048,\"timeoutSeconds\":300,\"onLeaseEnd\":\"stop\"}";

static void snapshot_body(json_t *body) {
        SnapshotRequest sr;
        json_t *labels = NULL;
        ApiError e = { 0 };
        if (snapshot_parse_body(body, &sr, &labels, &e) == 0)
                json_decref(labels);
}

static void fork_body(json_t *body) {
        int64_t count;
        const char *name, *mode;
        json_t *labels = NULL;
        ApiError e = { 0 };
        if (fork_parse_body(body, &count, &name, &mode, &labels, &e) == 0) {
                if (strcmp(mode, "disk") != 0 && strcmp(mode, "memory") != 0)
                        abort();
                if (count < 1 || count > 16)
                        abort(); /* the bound the copies are reserved by */
                json_decref(labels);
        }
}

static void update_bodies(json_t *body) {
        const char *name;
        json_t *labels = NULL;
        int64_t days;
        ApiError e = { 0 };
        if (snapshot_update_parse_body(body, &name, &labels, &days, &e) == 0)
                json_decref(labels);
        if (snapshot_extend_parse_body(body, &days, &e) == 0 && days < 1)
                abort();
}

static void create_body(json_t *body, bool memory) {
        static json_t *spec;
        const ReqLimits lim = { 8, 16384, 65536 };
        ApiError e = { 0 };
        if (!spec && !(spec = json_loads(spec_text, 0, NULL)))
                abort();
        if (snapshot_merge_create_defaults(body, spec, memory, &e) < 0)
                return;
        json_object_del(body, "snapshot");
        CreateRequest c;
        if (request_parse_create(body, &lim, &c, &e) == 0)
                create_request_done(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        ApiError e = { 0 };
        json_t *body = NULL;
        if (request_body_parse((const char *)data + 1, size - 1, true, &body, &e) < 0)
                return 0;
        switch (data[0] % 5) {
        case 0:
                snapshot_body(body);
                break;
        case 1:
                fork_body(body);
                break;
        case 2:
                update_bodies(body);
                break;
        case 3:
                create_body(body, (data[0] & 0x80) != 0);
                break;
        default:
                /* Every check on the same body (the create last: it fills it in). */
                snapshot_body(body);
                fork_body(body);
                update_bodies(body);
                create_body(body, (data[0] & 0x80) != 0);
                break;
        }
        json_decref(body);
        return 0;
}
