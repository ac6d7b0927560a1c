#include "daemon/model/sandbox_spec.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"

static const char *const lease_end_names[] = {
        [LEASE_END_STOP] = "stop",
        [LEASE_END_PAUSE] = "pause",
        [LEASE_END_DELETE] = "delete",
};

const char *lease_end_name(LeaseEnd e) {
        return (size_t)e < ELEMENTSOF(lease_end_names) ? lease_end_names[e] : "stop";
}

int lease_end_from_name(const char *s, LeaseEnd *ret) {
        for (size_t i = 0; s && i < ELEMENTSOF(lease_end_names); i++)
                if (strcmp(s, lease_end_names[i]) == 0) {
                        *ret = (LeaseEnd)i;
                        return 0;
                }
        return -EINVAL;
}

static const char *const driver_names[] = {
        [SANDBOX_DRIVER_NAMESPACE] = "namespace",
        [SANDBOX_DRIVER_GVISOR] = "gvisor",
        [SANDBOX_DRIVER_MICROVM] = "microvm",
};

const char *sandbox_driver_name(SandboxDriver d) {
        return d > SANDBOX_DRIVER_NONE && (size_t)d < ELEMENTSOF(driver_names) ? driver_names[d] : NULL;
}

int sandbox_driver_from_name(const char *s, SandboxDriver *ret) {
        for (size_t i = SANDBOX_DRIVER_NONE + 1; s && i < ELEMENTSOF(driver_names); i++)
                if (strcmp(s, driver_names[i]) == 0) {
                        *ret = (SandboxDriver)i;
                        return 0;
                }
        return -EINVAL;
}

static const char *const state_names[] = {
        [SANDBOX_STARTING] = "starting", [SANDBOX_RUNNING] = "running",   [SANDBOX_PAUSING] = "pausing",
        [SANDBOX_PAUSED] = "paused",     [SANDBOX_RESUMING] = "resuming", [SANDBOX_STOPPING] = "stopping",
        [SANDBOX_STOPPED] = "stopped",   [SANDBOX_FAILED] = "failed",     [SANDBOX_LOST] = "lost",     [SANDBOX_DELETED] = "deleted",
};

const char *sandbox_state_name(SandboxState s) {
        return (size_t)s < ELEMENTSOF(state_names) ? state_names[s] : "failed";
}

int sandbox_state_from_name(const char *s, SandboxState *ret) {
        for (size_t i = 0; s && i < ELEMENTSOF(state_names); i++)
                if (strcmp(s, state_names[i]) == 0) {
                        *ret = (SandboxState)i;
                        return 0;
                }
        return -EINVAL;
}

void sandbox_spec_init(SandboxSpec *s) {
        *s = (SandboxSpec){
                .timeout_seconds = SANDBOX_DEFAULT_TIMEOUT_SECONDS,
                .on_lease_end = LEASE_END_STOP,
                .max_cost_micros = -1,
                .max_total_cost_micros = -1,
                .auto_wake = true,
                .pausable = true,
        };
}

void sandbox_spec_done(SandboxSpec *s) {
        if (!s)
                return;
        free(s->image);
        json_decref(s->network);
        json_decref(s->env);
        json_decref(s->secrets);
        *s = (SandboxSpec){ 0 };
}

int sandbox_spec_copy(const SandboxSpec *s, SandboxSpec *ret) {
        SandboxSpec c = *s;
        c.image = s->image ? strdup(s->image) : NULL;
        c.network = s->network ? json_deep_copy(s->network) : NULL;
        c.env = s->env ? json_deep_copy(s->env) : NULL;
        c.secrets = s->secrets ? json_deep_copy(s->secrets) : NULL;
        if ((s->image && !c.image) || (s->network && !c.network) ||
            (s->env && !c.env) || (s->secrets && !c.secrets)) {
                sandbox_spec_done(&c);
                return -ENOMEM;
        }
        *ret = c;
        return 0;
}

const char *sandbox_volume_path_check(const char *path) {
        static const char *const reserved[] = { "/proc", "/sys", "/dev", "/.runtime" };
        size_t len = strlen(path);
        if (len == 0 || path[0] != '/')
                return "a volume's path is absolute, such as /data";
        if (len >= SANDBOX_VOLUME_PATH_MAX)
                return "a volume's path is shorter than 256 bytes";
        if (len == 1)
                return "a volume cannot be mounted over the root";
        if (path[len - 1] == '/')
                return "a volume's path has no trailing slash";
        for (const char *c = path; *c; c++)
                if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == ',' || *c == ':' || *c == '\\')
                        return "a volume's path has no control characters, commas, colons or backslashes";
        for (const char *seg = path; seg && *seg;) {
                seg++; /* past '/' */
                size_t n = strcspn(seg, "/");
                if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
                        return "a volume's path has no empty, \".\" or \"..\" parts";
                seg = seg[n] ? seg + n : NULL;
        }
        for (size_t i = 0; i < ELEMENTSOF(reserved); i++) {
                size_t r = strlen(reserved[i]);
                if (strncmp(path, reserved[i], r) == 0 && (path[r] == '\0' || path[r] == '/'))
                        return "a volume cannot be mounted over /proc, /sys, /dev or /.runtime";
        }
        return NULL;
}

static json_t *volumes_json(const SandboxSpec *s) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < s->n_volumes; i++) {
                const SandboxVolume *v = &s->volumes[i];
                if (json_array_append_new(a, json_pack("{s:s,s:s,s:b}", "volumeId", v->volume_id, "path", v->path,
                                                       "readOnly", (int)v->read_only)) < 0) {
                        json_decref(a);
                        return NULL;
                }
        }
        return a;
}

json_t *sandbox_spec_volumes_json(const SandboxSpec *s) {
        return volumes_json(s);
}

static int bad(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int decode_volumes(json_t *j, SandboxSpec *s, char *err, size_t n) {
        json_t *a = json_object_get(j, "volumes"), *v;
        size_t i;
        if (!a || json_is_null(a))
                return 0;
        if (!json_is_array(a) || json_array_size(a) > SANDBOX_MAX_VOLUMES)
                return bad(err, n, "volumes is not an array of up to %d", SANDBOX_MAX_VOLUMES);
        json_array_foreach(a, i, v) {
                const char *id = json_string_value(json_object_get(v, "volumeId"));
                const char *path = json_string_value(json_object_get(v, "path"));
                if (!id || !path || strlen(id) >= SANDBOX_VOLUME_ID_MAX || sandbox_volume_path_check(path))
                        return bad(err, n, "volumes[%zu] is not a volume and a path", i);
                SandboxVolume *sv = &s->volumes[i];
                snprintf(sv->volume_id, sizeof sv->volume_id, "%s", id);
                snprintf(sv->path, sizeof sv->path, "%s", path);
                sv->read_only = json_is_true(json_object_get(v, "readOnly"));
        }
        s->n_volumes = json_array_size(a);
        return 0;
}

static json_t *int_or_null(int64_t v) {
        return v >= 0 ? json_integer(v) : json_null();
}

char *sandbox_spec_encode(const SandboxSpec *s) {
        /* The names and shapes of version 1, which rows written before the
         * version existed have: never rename one, add new keys. */
        _cleanup_json_ json_t *j = json_pack(
                "{s:i,s:i,s:i,s:O,s:O,s:s,s:s,s:I,s:s,s:o,s:o,s:O,s:I,s:b,s:b}", "vcpu", (int)s->vcpu, "memoryMiB",
                (int)s->memory_mib, "diskMiB", (int)s->disk_mib, "network", s->network ? s->network : json_null(),
                "env", s->env ? s->env : json_null(), "image", s->image ? s->image : "", "driver",
                sandbox_driver_name(s->driver) ?: "", "timeoutSeconds", (json_int_t)s->timeout_seconds, "onLeaseEnd",
                lease_end_name(s->on_lease_end), "maxCostMicros", int_or_null(s->max_cost_micros),
                "maxTotalCostMicros", int_or_null(s->max_total_cost_micros), "secrets",
                s->secrets ? s->secrets : json_null(), "idlePauseSeconds", (json_int_t)s->idle_pause_seconds,
                "autoWake", (int)s->auto_wake, "pausable", (int)s->pausable);
        if (!j)
                return NULL;
        if ((s->trial && json_object_set_new(j, "trial", json_true()) < 0) ||
            (s->paused_at > 0 && json_object_set_new(j, "pausedAt", json_integer(s->paused_at)) < 0) ||
            (s->lease_left_seconds > 0 &&
             json_object_set_new(j, "leaseLeftSeconds", json_integer(s->lease_left_seconds)) < 0) ||
            (s->paused_seconds > 0 && json_object_set_new(j, "pausedSeconds", json_integer(s->paused_seconds)) < 0) ||
            (s->supervisor_nonce[0] &&
             json_object_set_new(j, "supervisorNonce", json_string(s->supervisor_nonce)) < 0) ||
            (s->n_volumes > 0 && json_object_set_new(j, "volumes", volumes_json(s)) < 0))
                return NULL;
        return json_dumps(j, JSON_COMPACT);
}

static int bad(char *err, size_t n, const char *fmt, ...) {
        if (err && n) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(err, n, fmt, ap);
                va_end(ap);
        }
        return -EBADMSG;
}

/* An integer member in [min, max], or def when absent or null. */
static int get_int(json_t *j, const char *k, int64_t min, int64_t max, int64_t def, int64_t *ret, char *err,
                   size_t n) {
        json_t *v = json_object_get(j, k);
        if (!v || json_is_null(v)) {
                *ret = def;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
                return bad(err, n, "%s is not an integer in [%lld, %lld]", k, (long long)min, (long long)max);
        *ret = json_integer_value(v);
        return 0;
}

static int get_bool(json_t *j, const char *k, bool def, bool *ret, char *err, size_t n) {
        json_t *v = json_object_get(j, k);
        if (!v || json_is_null(v)) {
                *ret = def;
                return 0;
        }
        if (!json_is_boolean(v))
                return bad(err, n, "%s is not a boolean", k);
        *ret = json_is_true(v);
        return 0;
}

static int get_string(json_t *j, const char *k, char **ret, char *err, size_t n) {
        const char *s = json_string_value(json_object_get(j, k));
        if (!s || !*s)
                return bad(err, n, "%s is missing", k);
        if (!(*ret = strdup(s)))
                return -ENOMEM;
        return 0;
}

/* An object (or array) member kept as JSON; NULL when absent or null. */
static int get_json(json_t *j, const char *k, bool array, json_t **ret, char *err, size_t n) {
        json_t *v = json_object_get(j, k);
        if (!v || json_is_null(v)) {
                *ret = NULL;
                return 0;
        }
        if (array ? !json_is_array(v) : !json_is_object(v))
                return bad(err, n, "%s is not an %s", k, array ? "array" : "object");
        *ret = json_incref(v);
        return 0;
}

static int decode_v1(json_t *j, SandboxSpec *s, char *err, size_t n) {
        int64_t vcpu, mem, disk;
        int r;
        if ((r = get_int(j, "vcpu", 0, UINT32_MAX, 0, &vcpu, err, n)) < 0 ||
            (r = get_int(j, "memoryMiB", 0, UINT32_MAX, 0, &mem, err, n)) < 0 ||
            (r = get_int(j, "diskMiB", 0, UINT32_MAX, 0, &disk, err, n)) < 0 ||
            (r = get_int(j, "timeoutSeconds", 1, INT64_MAX, SANDBOX_DEFAULT_TIMEOUT_SECONDS, &s->timeout_seconds,
                         err, n)) < 0 ||
            (r = get_int(j, "maxCostMicros", 0, INT64_MAX, -1, &s->max_cost_micros, err, n)) < 0 ||
            (r = get_int(j, "maxTotalCostMicros", 0, INT64_MAX, -1, &s->max_total_cost_micros, err, n)) < 0 ||
            (r = get_int(j, "idlePauseSeconds", 0, INT64_MAX, 0, &s->idle_pause_seconds, err, n)) < 0 ||
            (r = get_int(j, "pausedAt", 0, INT64_MAX, 0, &s->paused_at, err, n)) < 0 ||
            (r = get_int(j, "leaseLeftSeconds", 0, INT64_MAX, 0, &s->lease_left_seconds, err, n)) < 0 ||
            (r = get_int(j, "pausedSeconds", 0, INT64_MAX, 0, &s->paused_seconds, err, n)) < 0 ||
            (r = get_bool(j, "autoWake", true, &s->auto_wake, err, n)) < 0 ||
            (r = get_bool(j, "pausable", true, &s->pausable, err, n)) < 0 ||
            (r = get_bool(j, "trial", false, &s->trial, err, n)) < 0 ||
            (r = get_string(j, "image", &s->image, err, n)) < 0 ||

            (r = get_json(j, "network", false, &s->network, err, n)) < 0 ||
            (r = get_json(j, "env", false, &s->env, err, n)) < 0 ||
            (r = get_json(j, "secrets", true, &s->secrets, err, n)) < 0 ||
            (r = decode_volumes(j, s, err, n)) < 0)
                return r;
        json_t *nonce = json_object_get(j, "supervisorNonce");
        if (nonce) {
                const char *t = json_string_value(nonce);
                size_t len = t ? strlen(t) : 0;
                if (len != sizeof(s->supervisor_nonce) - 1 || strspn(t, "0123456789abcdef") != len)
                        return bad(err, n, "supervisorNonce is not 32 hex digits");
                memcpy(s->supervisor_nonce, t, len + 1);
        }
        s->vcpu = (unsigned)vcpu;
        s->memory_mib = (unsigned)mem;
        s->disk_mib = (unsigned)disk;
        const char *driver = json_string_value(json_object_get(j, "driver"));
        if (!driver || !*driver)
                return bad(err, n, "driver is missing");
        if (sandbox_driver_from_name(driver, &s->driver) < 0)
                return bad(err, n, "driver %.32s is none this daemon knows", driver);
        json_t *ole = json_object_get(j, "onLeaseEnd");
        if (ole && !json_is_null(ole) && lease_end_from_name(json_string_value(ole), &s->on_lease_end) < 0)
                return bad(err, n, "onLeaseEnd is none of \"stop\", \"pause\", \"delete\"");
        return 0;
}

int sandbox_spec_decode(const char *text, int64_t version, SandboxSpec *ret, char *err, size_t err_len) {
        if (version > SANDBOX_SPEC_VERSION) {
                if (err && err_len)
                        snprintf(err, err_len, "its spec is of version %lld, written by a newer daemon (this one "
                                 "reads up to %d)", (long long)version, SANDBOX_SPEC_VERSION);
                return -EPROTONOSUPPORT;
        }
        if (version < 1)
                return bad(err, err_len, "its spec has no valid version (%lld)", (long long)version);
        json_error_t jerr;
        _cleanup_json_ json_t *j = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
        if (!j)
                return bad(err, err_len, "its spec is not JSON: %s", text ? jerr.text : "none");
        if (!json_is_object(j))
                return bad(err, err_len, "its spec is not a JSON object");
        SandboxSpec s;
        sandbox_spec_init(&s);
        int r = decode_v1(j, &s, err, err_len);
        if (r < 0) {
                sandbox_spec_done(&s);
                return r;
        }
        *ret = s;
        return 0;
}

void sandbox_row_done(SandboxRow *r) {
        if (!r)
                return;
        free(r->owner);
        free(r->key_id);
        free(r->name);
        free(r->labels);
        sandbox_spec_done(&r->spec);
        free(r->failure_reason);
        *r = (SandboxRow){ 0 };
}
