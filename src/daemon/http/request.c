#include "daemon/http/request.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/base64.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "daemon/manager/images.h"
#include "daemon/manager/keys.h"
#include "egress/policy.h"
#include "egress/secret.h"

#define INVALID(e, ...) api_error(e, 400, "invalid_request", NULL, __VA_ARGS__)

/* The name of the object member whose number value ends near `pos` (where
 * the parser gave up on an integer too big for it), so that the error names
 * the field. Lexical and best effort: false when it is not plainly there. */
static bool number_field(const char *buf, size_t len, size_t pos, char *out, size_t outlen) {
        size_t i = pos < len ? pos : len;
        while (i > 0 && (strchr("0123456789+-.eE", buf[i - 1]) || buf[i - 1] == ' ' || buf[i - 1] == '\t' ||
                         buf[i - 1] == '\n' || buf[i - 1] == '\r'))
                i--;
        if (i == 0 || buf[i - 1] != ':')
                return false;
        i--;
        while (i > 0 && (buf[i - 1] == ' ' || buf[i - 1] == '\t' || buf[i - 1] == '\n' || buf[i - 1] == '\r'))
                i--;
        if (i == 0 || buf[i - 1] != '"')
                return false;
        size_t end = --i;
        while (i > 0 && buf[i - 1] != '"' && end - i < outlen - 1) {
                unsigned char c = (unsigned char)buf[i - 1];
                if (c < 0x20 || c >= 0x7f || c == '\\')
                        return false;
                i--;
        }
        if (i == 0 || buf[i - 1] != '"' || end == i)
                return false;
        memcpy(out, buf + i, end - i);
        out[end - i] = '\0';
        return true;
}

int request_body_parse(const char *buf, size_t len, bool empty_ok, json_t **ret, ApiError *e) {
        /* The HTTP layer holds each route to its own limit (exec's is larger);
         * this is the bound on what any parse may be given. */
        if (len > REQ_MAX_EXEC_BODY)
                return api_error(e, 413, "payload_too_large", "send at most 1 MiB of JSON",
                                 "the request body is over 24 MiB");
        bool blank = true;
        for (size_t i = 0; i < len && blank; i++)
                blank = buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n';
        if (blank) {
                if (!empty_ok)
                        return INVALID(e, "a JSON object body is required");
                *ret = json_object();
                return *ret ? 0 : -ENOMEM;
        }
        if (!json_depth_ok(buf, len, REQ_MAX_DEPTH))
                return INVALID(e, "the JSON body is nested more than %u levels deep", REQ_MAX_DEPTH);
        json_error_t jerr;
        json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!j) {
                char field[65];
                if (strstr(jerr.text, "too big") && number_field(buf, len, (size_t)jerr.position, field, sizeof(field)))
                        return INVALID(e, "%s is out of range: the number is too big", field);
                return INVALID(e, "malformed JSON at line %d column %d: %.200s", jerr.line, jerr.column,
                               jerr.text);
        }
        if (!json_is_object(j)) {
                json_decref(j);
                return INVALID(e, "the JSON body must be an object");
        }
        *ret = j;
        return 0;
}

static const char *type_name(const json_t *v) {
        switch (json_typeof(v)) {
        case JSON_OBJECT:
                return "an object";
        case JSON_ARRAY:
                return "an array";
        case JSON_STRING:
                return "a string";
        case JSON_INTEGER:
                return "an integer";
        case JSON_REAL:
                return "a number with a fraction";
        case JSON_TRUE:
        case JSON_FALSE:
                return "a boolean";
        default:
                return "null";
        }
}

static int wrong_type(ApiError *e, const char *field, const char *want, const json_t *v) {
        return INVALID(e, "%s must be %s, not %s", field, want, type_name(v));
}

/* Unknown fields are refused, naming the first one. */
static int check_fields(json_t *obj, const char *prefix, const char *const *allowed, ApiError *e) {
        const char *key;
        json_t *v;
        json_object_foreach(obj, key, v) {
                bool ok = false;
                for (size_t i = 0; allowed[i]; i++)
                        if (strcmp(key, allowed[i]) == 0)
                                ok = true;
                if (!ok) {
                        /* The name is client text: keep it short in the message. */
                        return INVALID(e, "unknown field %s%s%.64s%s", prefix ? prefix : "", prefix ? "." : "",
                                       key, strlen(key) > 64 ? "..." : "");
                }
        }
        return 0;
}

/* Whether one path is the other or lies under it. */
static bool path_overlaps(const char *a, const char *b) {
        size_t la = strlen(a), lb = strlen(b), n = la < lb ? la : lb;
        return strncmp(a, b, n) == 0 && (a[n] == '\0' || a[n] == '/' || b[n] == '\0' || b[n] == '/');
}

/* volumes: up to four {volumeId (or volume), path, readOnly, mode}, each
 * volume once, no path over another's. Whether a volume exists and may be
 * attached is the manager's to say. */
static int parse_volumes(json_t *v, SandboxSpec *spec, ApiError *e) {
        static const char *const fields[] = { "volumeId", "volume", "path", "readOnly", "mode", NULL };
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_array(v))
                return wrong_type(e, "volumes", "an array", v);
        if (json_array_size(v) > SANDBOX_MAX_VOLUMES)
                return INVALID(e, "volumes has at most %d entries", SANDBOX_MAX_VOLUMES);
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
                char field[32];
                snprintf(field, sizeof field, "volumes[%zu]", i);
                if (!json_is_object(item))
                        return wrong_type(e, field, "an object", item);
                int r = check_fields(item, field, fields, e);
                if (r < 0)
                        return r;
                json_t *id = json_object_get(item, "volumeId") ?: json_object_get(item, "volume");
                json_t *path = json_object_get(item, "path"), *ro = json_object_get(item, "readOnly");
                json_t *mode = json_object_get(item, "mode");
                if (!json_is_string(id) || !json_is_string(path))
                        return INVALID(e, "%s needs volumeId and path, strings", field);
                const char *ids = json_string_value(id), *paths = json_string_value(path);
                if (strlen(ids) >= SANDBOX_VOLUME_ID_MAX)
                        return INVALID(e, "%s.volumeId is not a volume's id", field);
                const char *why = sandbox_volume_path_check(paths);
                if (why)
                        return INVALID(e, "%s.path: %s", field, why);
                if (ro && !json_is_null(ro) && !json_is_boolean(ro))
                        return wrong_type(e, "readOnly", "a boolean", ro);
                bool read_only = json_is_true(ro);
                if (mode && !json_is_null(mode)) {
                        const char *m = json_string_value(mode);
                        if (m && strcmp(m, "snapshot") == 0)
                                return api_error(e, 501, "not_implemented",
                                                 "give readOnly: true for a read-only view of the volume",
                                                 "%s.mode: this daemon makes no snapshot copies of volumes", field);
                        if (!m || (strcmp(m, "rw") && strcmp(m, "ro")))
                                return INVALID(e, "%s.mode is \"rw\" or \"ro\"", field);
                        read_only = read_only || strcmp(m, "ro") == 0;
                }
                for (size_t k = 0; k < spec->n_volumes; k++) {
                        if (strcmp(spec->volumes[k].volume_id, ids) == 0)
                                return INVALID(e, "%s: volume %.32s is given twice", field, ids);
                        if (path_overlaps(spec->volumes[k].path, paths))
                                return INVALID(e, "%s.path is at or under another volume's path, or over it", field);
                }
                SandboxVolume *sv = &spec->volumes[spec->n_volumes++];
                snprintf(sv->volume_id, sizeof sv->volume_id, "%s", ids);
                snprintf(sv->path, sizeof sv->path, "%s", paths);
                sv->read_only = read_only;
        }
        return 0;
}

static int get_int(json_t *body, const char *field, int64_t lo, int64_t hi, int64_t def, int64_t *ret,
                   ApiError *e) {
        json_t *v = json_object_get(body, field);
        if (!v) {
                *ret = def;
                return 0;
        }
        if (!json_is_integer(v))
                return wrong_type(e, field, "an integer", v);
        json_int_t n = json_integer_value(v);
        if (n < lo || n > hi)
                return INVALID(e, "%s must be between %lld and %lld", field, (long long)lo, (long long)hi);
        *ret = n;
        return 0;
}

static int get_bool(json_t *body, const char *field, bool def, bool *ret, ApiError *e) {
        json_t *v = json_object_get(body, field);
        if (!v) {
                *ret = def;
                return 0;
        }
        if (!json_is_boolean(v))
                return wrong_type(e, field, "a boolean", v);
        *ret = json_is_true(v);
        return 0;
}

/* A string without NUL bytes (JSON allows \u0000; C strings and paths do not). */
static int get_string(json_t *v, const char *field, size_t max, const char **ret, size_t *ret_len, ApiError *e) {
        if (!json_is_string(v))
                return wrong_type(e, field, "a string", v);
        size_t len = json_string_length(v);
        const char *s = json_string_value(v);
        if (memchr(s, '\0', len))
                return INVALID(e, "%s must not contain NUL bytes", field);
        if (len > max)
                return INVALID(e, "%s is longer than %zu bytes", field, max);
        *ret = s;
        if (ret_len)
                *ret_len = len;
        return 0;
}

bool request_env_name_ok(const char *s, size_t len) {
        if (len == 0 || len > REQ_MAX_ENV_NAME)
                return false;
        if (!(isalpha((unsigned char)s[0]) || s[0] == '_') || !isascii((unsigned char)s[0]))
                return false;
        for (size_t i = 1; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                if (!isascii(c) || !(isalnum(c) || c == '_'))
                        return false;
        }
        return true;
}

static int parse_env(json_t *v, const char *field, json_t **ret, ApiError *e) {
        if (!v) {
                *ret = json_object();
                return *ret ? 0 : -ENOMEM;
        }
        if (!json_is_object(v))
                return wrong_type(e, field, "an object of strings", v);
        if (json_object_size(v) > REQ_MAX_ENV)
                return INVALID(e, "%s has more than %u variables", field, REQ_MAX_ENV);
        size_t total = 0;
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) {
                size_t klen = strlen(key);
                if (!request_env_name_ok(key, klen))
                        return INVALID(e, "%s: variable names must match [A-Za-z_][A-Za-z0-9_]* and be at most %u bytes",
                                       field, REQ_MAX_ENV_NAME);
                if (!json_is_string(val))
                        return INVALID(e, "%s.%s must be a string, not %s", field, key, type_name(val));
                size_t vlen = json_string_length(val);
                if (memchr(json_string_value(val), '\0', vlen))
                        return INVALID(e, "%s.%s must not contain NUL bytes", field, key);
                if (vlen > REQ_MAX_ENV_VALUE)
                        return INVALID(e, "%s.%s is longer than %u bytes", field, key, REQ_MAX_ENV_VALUE);
                total += klen + vlen;
        }
        if (total > REQ_MAX_ENV_TOTAL)
                return INVALID(e, "%s is larger than %u bytes in total", field, REQ_MAX_ENV_TOTAL);
        *ret = json_incref(v);
        return 0;
}

static bool printable(const char *s, size_t len) {
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                if (c < 0x20 || c == 0x7f)
                        return false;
        }
        return true;
}

static int parse_labels(json_t *v, json_t **ret, ApiError *e) {
        if (!v) {
                *ret = json_object();
                return *ret ? 0 : -ENOMEM;
        }
        if (!json_is_object(v))
                return wrong_type(e, "labels", "an object of strings", v);
        if (json_object_size(v) > REQ_MAX_LABELS)
                return INVALID(e, "labels has more than %u entries", REQ_MAX_LABELS);
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) {
                size_t klen = strlen(key);
                if (klen == 0 || klen > REQ_MAX_LABEL_KEY || !printable(key, klen))
                        return INVALID(e, "labels: keys must be 1..%u printable bytes", REQ_MAX_LABEL_KEY);
                if (!json_is_string(val))
                        return INVALID(e, "labels.%s must be a string, not %s", key, type_name(val));
                size_t vlen = json_string_length(val);
                if (vlen > REQ_MAX_LABEL_VALUE || !printable(json_string_value(val), vlen))
                        return INVALID(e, "labels.%s must be at most %u printable bytes", key,
                                       REQ_MAX_LABEL_VALUE);
        }
        *ret = json_incref(v);
        return 0;
}

/* Host patterns: exact names or "*.suffix", DNS characters only, lowercased. */
static int parse_host_list(json_t *v, const char *field, json_t **ret, ApiError *e) {
        _cleanup_json_ json_t *out = json_array();
        if (!out)
                return -ENOMEM;
        if (!v) {
                *ret = TAKE_PTR(out);
                return 0;
        }
        if (!json_is_array(v))
                return wrong_type(e, field, "an array of host patterns", v);
        if (json_array_size(v) > REQ_MAX_HOST_PATTERNS)
                return INVALID(e, "%s has more than %u entries", field, REQ_MAX_HOST_PATTERNS);
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
                if (!json_is_string(item))
                        return INVALID(e, "%s[%zu] must be a string, not %s", field, i, type_name(item));
                size_t len = json_string_length(item);
                if (len == 0 || len > REQ_MAX_HOST_PATTERN)
                        return INVALID(e, "%s[%zu] must be 1..%u bytes", field, i, REQ_MAX_HOST_PATTERN);
                /* The syntax is the egress policy's to judge (ports, IPv6
                 * literals, wildcards): see request_parse_network. */
                if (json_array_append(out, item) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(out);
        return 0;
}

int request_parse_secret_scope(json_t *v, const char *field, json_t **ret, ApiError *e) {
        *ret = NULL;
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_array(v) || json_array_size(v) > REQ_MAX_SECRET_SCOPE)
                return INVALID(e, "%s must be an array of at most %u secret names ([] is none)", field,
                               REQ_MAX_SECRET_SCOPE);
        _cleanup_json_ json_t *out = json_array();
        if (!out)
                return -ENOMEM;
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
                const char *name = json_string_value(item);
                if (!name || strlen(name) != json_string_length(item) || !egress_secret_name_ok(name))
                        return INVALID(e, "%s[%zu] must be a secret's name ([A-Za-z_][A-Za-z0-9_]{0,63})", field, i);
                size_t k;
                json_t *seen;
                json_array_foreach(out, k, seen) {
                        if (strcmp(json_string_value(seen), name) == 0)
                                return INVALID(e, "%s names %s twice", field, name);
                }
                if (json_array_append(out, item) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(out);
        return 0;
}

int request_parse_network(json_t *v, const char *field, json_t **ret, ApiError *e) {
        static const char *const fields[] = { "internet", "allow", "deny", NULL };
        if (v && !json_is_object(v))
                return wrong_type(e, field, "an object", v);
        json_t *empty = NULL;
        if (!v)
                v = empty = json_object();
        _cleanup_json_ json_t *owned = empty;
        if (!v)
                return -ENOMEM;
        /* The published client's "connect" (host:port pairs past 80 and 443)
         * is what allow's host:port patterns already say here. */
        if (json_object_get(v, "connect"))
                return api_error(e, 501, "not_implemented", "put host:port patterns in allow, e.g. db.example.com:5432",
                                 "%s.connect: this daemon takes ports in allow instead", field);
        int r = check_fields(v, field, fields, e);
        if (r < 0)
                return r;
        bool internet = false;
        r = get_bool(v, "internet", false, &internet, e);
        if (r < 0)
                return INVALID(e, "%s.internet must be a boolean", field);
        _cleanup_json_ json_t *allow = NULL, *deny = NULL;
        char sub[32];
        snprintf(sub, sizeof(sub), "%s.allow", field);
        r = parse_host_list(json_object_get(v, "allow"), sub, &allow, e);
        if (r < 0)
                return r;
        /* The published client's allow-list-only form: internet off with an
         * allow list means those hosts alone, stored as internet on with it. */
        if (!internet && json_array_size(allow) > 0)
                internet = true;
        snprintf(sub, sizeof(sub), "%s.deny", field);
        r = parse_host_list(json_object_get(v, "deny"), sub, &deny, e);
        if (r < 0)
                return r;
        _cleanup_json_ json_t *n = json_pack("{s:b,s:O,s:O}", "internet", internet, "allow", allow, "deny", deny);
        if (!n)
                return -ENOMEM;
        /* The proxy's own parser is the judge of a pattern; what it accepts
         * is stored in its normal form (lower case, no trailing dot). */
        EgressPolicy *p = NULL;
        char err[256] = "";
        if (egress_policy_parse(n, &p, err, sizeof(err)) < 0) {
                /* Its messages say "network.allow[i]": under another field
                 * (a build's), the field as the client named it. */
                const char *msg = err[0] ? err : "invalid network policy";
                bool named = strncmp(msg, "network", 7) == 0;
                return api_error(e, 400, "invalid_request",
                                 "patterns are example.org, *.example.org, example.org:8443 or an IP address", "%s%s",
                                 named ? field : "", named ? msg + 7 : msg);
        }
        json_t *norm = egress_policy_to_json(p);
        egress_policy_free(p);
        if (!norm)
                return -ENOMEM;
        *ret = norm;
        return 0;
}

/* What a self-hosted daemon has no counterpart for, named with what to use
 * instead rather than refused as an unknown field. `persistent: false` is
 * what every sandbox here is, so it is taken. */
static int refuse_unsupported(json_t *body, bool create, ApiError *e) {
        static const struct {
                const char *field, *why, *hint;
        } fields[] = {
                { "persistent", "this daemon gives every sandbox a lease, so that its cost is held against the key's "
                                "daily limit before it runs",
                  "set timeoutSeconds (up to 86400) and renew it with :extend (the published client's keep_alive())" },
                { "funding", "this daemon has no credit or funding sources: sandboxes are billed to the key's daily "
                             "limit", "leave it out" },
                { "region", "this daemon runs every sandbox on its own host", "leave it out" },
                { "spreadFrom", "this daemon runs every sandbox on its own host", "leave it out" },
                { "cpu", "this daemon has one kind of CPU", "leave it out; vcpu sets the number of CPUs" },
                { "cpuFloorMillis", "this daemon guarantees no CPU floor",
                  "leave it out; vcpu sets the CPU limit" },
                { "tailscale", "this daemon joins no tailnet", "leave it out; network.allow opens egress to hosts" },
        };
        for (size_t i = 0; i < ELEMENTSOF(fields); i++) {
                json_t *v = json_object_get(body, fields[i].field);
                if (!v || json_is_null(v))
                        continue;
                if (!create && strcmp(fields[i].field, "persistent") != 0)
                        continue;
                if (strcmp(fields[i].field, "persistent") == 0) {
                        if (!json_is_boolean(v))
                                return wrong_type(e, "persistent", "a boolean", v);
                        if (json_is_false(v))
                                continue;
                }
                return api_error(e, 501, "not_implemented", fields[i].hint, "%s: %s", fields[i].field, fields[i].why);
        }
        return 0;
}

int request_parse_create(json_t *body, const ReqLimits *lim, CreateRequest *ret, ApiError *e) {
        static const char *const fields[] = { "timeoutSeconds", "onLeaseEnd", "vcpu",   "memoryMiB",
                                              "diskMiB",        "network",    "env",    "image",
                                              "driver",         "name",       "labels", "maxCostMicros",
                                              "maxTotalCostMicros", "secrets", "idlePauseSeconds", "autoWake",
                                              "pausable", "getOrCreate", "user", "persistent", "volumes", NULL };
        CreateRequest c = { 0 };
        sandbox_spec_init(&c.spec);
        int64_t n;
        int r = refuse_unsupported(body, true, e);
        if (r < 0 || (r = check_fields(body, NULL, fields, e)) < 0)
                return r;
        ReqUser who;
        if ((r = request_parse_user(json_object_get(body, "user"), &who, e)) < 0)
                return r;
        c.run_as_root = who == REQ_AS_ROOT;
        if ((r = get_int(body, "timeoutSeconds", 1, REQ_MAX_TIMEOUT_SECONDS, SANDBOX_DEFAULT_TIMEOUT_SECONDS, &c.spec.timeout_seconds, e)) < 0)
                return r;
        json_t *v = json_object_get(body, "onLeaseEnd");
        if (v) {
                if (!json_is_string(v))
                        return wrong_type(e, "onLeaseEnd", "\"stop\", \"pause\" or \"delete\"", v);
                if (lease_end_from_name(json_string_value(v), &c.spec.on_lease_end) < 0)
                        return INVALID(e, "onLeaseEnd must be \"stop\", \"pause\" or \"delete\"");
        }
        if ((r = get_int(body, "idlePauseSeconds", 0, REQ_MAX_TIMEOUT_SECONDS, 0, &c.spec.idle_pause_seconds, e)) < 0)
                return r;
        if ((r = get_bool(body, "autoWake", true, &c.spec.auto_wake, e)) < 0)
                return r;
        if ((r = get_bool(body, "pausable", true, &c.spec.pausable, e)) < 0)
                return r;
        if (!c.spec.pausable && (c.spec.on_lease_end == LEASE_END_PAUSE || c.spec.idle_pause_seconds > 0))
                return INVALID(e, "a sandbox created with pausable: false cannot pause at its lease end or when idle");
        if ((r = get_int(body, "vcpu", 1, lim->max_vcpu, 1, &n, e)) < 0)
                return r;
        c.spec.vcpu = (unsigned)n;
        if ((r = get_int(body, "memoryMiB", 64, lim->max_memory_mib, 1024, &n, e)) < 0)
                return r;
        c.spec.memory_mib = (unsigned)n;
        if ((r = get_int(body, "diskMiB", 64, lim->max_disk_mib, 2048, &n, e)) < 0)
                return r;
        c.spec.disk_mib = (unsigned)n;
        if ((r = get_int(body, "maxCostMicros", 0, INT64_MAX, -1, &c.spec.max_cost_micros, e)) < 0)
                return r;
        if ((r = get_int(body, "maxTotalCostMicros", 0, INT64_MAX, -1, &c.spec.max_total_cost_micros, e)) < 0)
                return r;

        v = json_object_get(body, "image");
        const char *s;
        if (v) {
                if ((r = get_string(v, "image", 64, &s, NULL, e)) < 0)
                        return r;
                if (!image_name_ok(s))
                        return INVALID(e, "image must be an image name ([a-z0-9][a-z0-9_-]*, at most 64 bytes)");
        } else
                s = "default";
        c.spec.image = strdup(s);
        v = json_object_get(body, "driver");
        if (v && !json_is_null(v)) {
                if ((r = get_string(v, "driver", 32, &s, NULL, e)) < 0)
                        goto fail;
                if (!image_name_ok(s)) {
                        r = INVALID(e, "driver must be one of namespace, gvisor, microvm");
                        goto fail;
                }
                if (sandbox_driver_from_name(s, &c.spec.driver) < 0) {
                        r = api_error(e, 400, "invalid_request", "GET /v1/info lists the drivers",
                                      "driver must be one of the daemon's drivers; %s is not", s);
                        goto fail;
                }
        }
        v = json_object_get(body, "name");
        if (v && !json_is_null(v)) {
                size_t len;
                if ((r = get_string(v, "name", REQ_MAX_NAME, &s, &len, e)) < 0)
                        goto fail;
                if (!printable(s, len)) {
                        r = INVALID(e, "name must be printable");
                        goto fail;
                }
                c.name = strdup(s);
        }
        if ((r = request_parse_network(json_object_get(body, "network"), "network", &c.spec.network, e)) < 0)
                goto fail;
        if ((r = parse_env(json_object_get(body, "env"), "env", &c.spec.env, e)) < 0)
                goto fail;
        if ((r = parse_labels(json_object_get(body, "labels"), &c.labels, e)) < 0)
                goto fail;
        if ((r = request_parse_secret_scope(json_object_get(body, "secrets"), "secrets", &c.spec.secrets, e)) < 0)
                goto fail;
        if ((r = parse_volumes(json_object_get(body, "volumes"), &c.spec, e)) < 0)
                goto fail;
        if (!c.spec.image) {
                r = -ENOMEM;
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        create_request_done(&c);
        return r;
}

void exec_request_done(ExecRequest *r) {
        free(r->command);
        json_decref(r->argv);
        free(r->cwd);
        json_decref(r->env);
        free(r->stdin_data);
        *r = (ExecRequest){ 0 };
}

int request_resolve_path(const char *in, size_t len, const char *field, char **ret, ApiError *e) {
        if (!in || len == 0)
                return INVALID(e, "%s must not be empty", field);
        if (memchr(in, '\0', len))
                return INVALID(e, "%s must not contain NUL bytes", field);
        if (len > REQ_MAX_PATH)
                return INVALID(e, "%s is longer than %u bytes", field, REQ_MAX_PATH);
        char *out;
        if (in[0] == '/')
                out = strndup(in, len);
        else {
                static const char prefix[] = "/workspace/";
                if (len + sizeof(prefix) - 1 > REQ_MAX_PATH)
                        return INVALID(e, "%s is longer than %u bytes under /workspace", field, REQ_MAX_PATH);
                out = malloc(sizeof(prefix) + len);
                if (out) {
                        memcpy(out, prefix, sizeof(prefix) - 1);
                        memcpy(out + sizeof(prefix) - 1, in, len);
                        out[sizeof(prefix) - 1 + len] = '\0';
                }
        }
        if (!out)
                return -ENOMEM;
        *ret = out;
        return 0;
}

int request_path_field(json_t *body, const char *field, bool required, char **ret, ApiError *e) {
        json_t *v = json_object_get(body, field);
        if (!v) {
                if (required)
                        return INVALID(e, "%s is required", field);
                *ret = NULL;
                return 0;
        }
        if (!json_is_string(v))
                return wrong_type(e, field, "a string", v);
        return request_resolve_path(json_string_value(v), json_string_length(v), field, ret, e);
}

static int parse_command(json_t *body, bool spawn, ExecRequest *ret, ApiError *e);

int request_parse_user_text(const char *s, ReqUser *ret, ApiError *e) {
        if (!s) {
                *ret = REQ_AS_DEFAULT;
                return 0;
        }
        if (strcmp(s, REQ_USER_SANDBOX) == 0) {
                *ret = REQ_AS_SANDBOX;
                return 0;
        }
        if (strcmp(s, REQ_USER_ROOT) == 0) {
                *ret = REQ_AS_ROOT;
                return 0;
        }
        /* The value is not echoed: it is the client's, of any length. */
        return INVALID(e, "user must be \"sandbox\" or \"root\" (the users every sandbox has)");
}

int request_parse_user(json_t *v, ReqUser *ret, ApiError *e) {
        if (!v || json_is_null(v))
                return request_parse_user_text(NULL, ret, e);
        if (!json_is_string(v))
                return wrong_type(e, "user", "a string, \"sandbox\" or \"root\"", v);
        /* jansson keeps a NUL inside a string: "root\0x" is not "root". */
        if (json_string_length(v) != strlen(json_string_value(v)))
                return INVALID(e, "user must not contain NUL bytes");
        return request_parse_user_text(json_string_value(v), ret, e);
}

int request_parse_exec(json_t *body, ExecRequest *ret, ApiError *e) {
        return parse_command(body, false, ret, e);
}

int request_parse_pty(json_t *pty, unsigned *ret_cols, unsigned *ret_rows, ApiError *e) {
        static const char *const fields[] = { "cols", "rows", NULL };
        if (!json_is_object(pty))
                return wrong_type(e, "pty", "an object {cols, rows}", pty);
        int r = check_fields(pty, "pty", fields, e);
        if (r < 0)
                return r;
        int64_t cols, rows;
        if ((r = get_int(pty, "cols", 1, REQ_MAX_PTY_SIDE, 80, &cols, e)) < 0 ||
            (r = get_int(pty, "rows", 1, REQ_MAX_PTY_SIDE, 24, &rows, e)) < 0)
                return r;
        *ret_cols = (unsigned)cols;
        *ret_rows = (unsigned)rows;
        return 0;
}

int request_parse_resize(json_t *body, unsigned *ret_cols, unsigned *ret_rows, ApiError *e) {
        static const char *const fields[] = { "cols", "rows", NULL };
        if (!json_is_object(body))
                return wrong_type(e, "the body", "an object {cols, rows}", body);
        int r = check_fields(body, NULL, fields, e);
        if (r < 0)
                return r;
        /* A resize that leaves a side out has no size to keep: both are asked for. */
        for (size_t i = 0; fields[i]; i++)
                if (!json_object_get(body, fields[i]))
                        return INVALID(e, "%s is required (1..%d)", fields[i], REQ_MAX_PTY_SIDE);
        int64_t cols, rows;
        if ((r = get_int(body, "cols", 1, REQ_MAX_PTY_SIDE, 0, &cols, e)) < 0 ||
            (r = get_int(body, "rows", 1, REQ_MAX_PTY_SIDE, 0, &rows, e)) < 0)
                return r;
        *ret_cols = (unsigned)cols;
        *ret_rows = (unsigned)rows;
        return 0;
}

int request_parse_spawn(json_t *body, ExecRequest *ret, ApiError *e) {
        return parse_command(body, true, ret, e);
}

static int parse_command(json_t *body, bool spawn, ExecRequest *ret, ApiError *e) {
        static const char *const exec_fields[] = { "command", "argv", "cwd", "env", "stdin", "stdinBase64",
                                                   "timeoutMs", "stream", "maxOutputBytes", "user",
                                                   "outputEncoding", "traceFiles", NULL };
        static const char *const spawn_fields[] = { "command", "argv", "cwd", "env", "stdin", "stdinBase64",
                                                    "timeoutMs", "user", "outputEncoding", "stdinMode",
                                                    "traceFiles", "pty", NULL };
        ExecRequest x = { 0 };
        int r = check_fields(body, NULL, spawn ? spawn_fields : exec_fields, e);
        if (r < 0)
                return r;
        json_t *cmd = json_object_get(body, "command"), *argv = json_object_get(body, "argv");
        if ((cmd != NULL) == (argv != NULL))
                return INVALID(e, "exactly one of command and argv is required");
        const char *s;
        size_t len;
        int64_t n;
        if (cmd) {
                if ((r = get_string(cmd, "command", REQ_MAX_BODY, &s, &len, e)) < 0)
                        return r;
                if (len == 0)
                        return INVALID(e, "command must not be empty");
                if (!(x.command = strdup(s)))
                        return -ENOMEM;
        } else {
                if (!json_is_array(argv))
                        return wrong_type(e, "argv", "an array of strings", argv);
                if (json_array_size(argv) == 0)
                        return INVALID(e, "argv must not be empty");
                if (json_array_size(argv) > REQ_MAX_ARGV)
                        return INVALID(e, "argv has more than %u entries", REQ_MAX_ARGV);
                size_t i;
                json_t *item;
                json_array_foreach(argv, i, item) {
                        if (!json_is_string(item))
                                return INVALID(e, "argv[%zu] must be a string, not %s", i, type_name(item));
                        if (memchr(json_string_value(item), '\0', json_string_length(item)))
                                return INVALID(e, "argv[%zu] must not contain NUL bytes", i);
                }
                if (json_string_length(json_array_get(argv, 0)) == 0)
                        return INVALID(e, "argv[0] must not be empty");
                x.argv = json_incref(argv);
        }
        if ((r = request_path_field(body, "cwd", false, &x.cwd, e)) < 0)
                goto fail;
        if (!x.cwd && !(x.cwd = strdup("/workspace"))) {
                r = -ENOMEM;
                goto fail;
        }
        if ((r = parse_env(json_object_get(body, "env"), "env", &x.env, e)) < 0)
                goto fail;
        json_t *in = json_object_get(body, "stdin"), *in64 = json_object_get(body, "stdinBase64");
        if (in && in64) {
                r = INVALID(e, "at most one of stdin and stdinBase64");
                goto fail;
        }
        if (in) {
                if (!json_is_string(in)) {
                        r = wrong_type(e, "stdin", "a string", in);
                        goto fail;
                }
                len = json_string_length(in);
                if (len > REQ_MAX_STDIN) {
                        r = INVALID(e, "stdin is larger than 16 MiB");
                        goto fail;
                }
                x.stdin_data = malloc(len ? len : 1);
                if (!x.stdin_data) {
                        r = -ENOMEM;
                        goto fail;
                }
                memcpy(x.stdin_data, json_string_value(in), len);
                x.stdin_len = len;
                x.has_stdin = true;
        } else if (in64) {
                if (!json_is_string(in64)) {
                        r = wrong_type(e, "stdinBase64", "a base64 string", in64);
                        goto fail;
                }
                r = base64_decode(json_string_value(in64), json_string_length(in64), REQ_MAX_STDIN,
                                  &x.stdin_data, &x.stdin_len);
                if (r == -E2BIG) {
                        r = INVALID(e, "stdinBase64 decodes to more than 16 MiB");
                        goto fail;
                }
                if (r < 0) {
                        r = r == -ENOMEM ? r : INVALID(e, "stdinBase64 is not valid base64");
                        goto fail;
                }
                x.has_stdin = true;
        }
        if ((r = get_int(body, "timeoutMs", 1, REQ_MAX_EXEC_TIMEOUT_MS, spawn ? REQ_MAX_EXEC_TIMEOUT_MS : 60000,
                         &x.timeout_ms, e)) < 0)
                goto fail;
        if ((r = get_bool(body, "stream", false, &x.stream, e)) < 0)
                goto fail;
        if ((r = request_parse_user(json_object_get(body, "user"), &x.user, e)) < 0)
                goto fail;
        json_t *enc = json_object_get(body, "outputEncoding");
        if (enc && !json_is_null(enc)) {
                const char *v = json_string_value(enc);
                if (!v || (strcmp(v, "utf8") != 0 && strcmp(v, "base64") != 0)) {
                        r = INVALID(e, "outputEncoding must be \"utf8\" or \"base64\"");
                        goto fail;
                }
                x.base64 = strcmp(v, "base64") == 0;
        }
        bool trace = false;
        if ((r = get_bool(body, "traceFiles", false, &trace, e)) < 0)
                goto fail;
        if (trace) {
                r = INVALID(e, "traceFiles is not supported by this server");
                goto fail;
        }
        if (spawn) {
                json_t *mode = json_object_get(body, "stdinMode");
                if (mode && !json_is_null(mode)) {
                        const char *v = json_string_value(mode);
                        if (!v || strcmp(v, "pipe") != 0) {
                                r = INVALID(e, "stdinMode must be \"pipe\"");
                                goto fail;
                        }
                        if (x.has_stdin) {
                                r = INVALID(e, "stdinMode \"pipe\" and stdin exclude each other");
                                goto fail;
                        }
                        x.stdin_pipe = true;
                }
                json_t *pty = json_object_get(body, "pty");
                if (pty && !json_is_null(pty)) {
                        if ((r = request_parse_pty(pty, &x.pty_cols, &x.pty_rows, e)) < 0)
                                goto fail;
                        if (x.has_stdin) {
                                r = INVALID(e, "pty and stdin exclude each other: write to the terminal instead");
                                goto fail;
                        }
                        /* A terminal takes keys for as long as it runs. */
                        x.pty = true;
                        x.stdin_pipe = true;
                }
        }
        if ((r = get_int(body, "maxOutputBytes", 0, REQ_MAX_OUTPUT, 65536, &n, e)) < 0)
                goto fail;
        x.max_output_bytes = (size_t)n;
        *ret = x;
        return 0;
fail:
        exec_request_done(&x);
        return r;
}

int request_parse_cursor(const char *s, uint64_t *ret, ApiError *e) {
        if (!s || !*s) {
                *ret = 0;
                return 0;
        }
        uint64_t v = 0;
        size_t n = 0;
        for (const char *p = s; *p; p++, n++) {
                if (*p < '0' || *p > '9' || n >= 16)
                        return INVALID(e, "cursor must be a byte offset: a non-negative integer");
                v = v * 10 + (uint64_t)(*p - '0');
        }
        if (v > (1ull << 53))
                return INVALID(e, "cursor must be a byte offset: a non-negative integer");
        *ret = v;
        return 0;
}

static const struct {
        const char *name;
        int signo;
} signals[] = {
        { "HUP", 1 },   { "INT", 2 },   { "QUIT", 3 },  { "KILL", 9 },  { "USR1", 10 },
        { "USR2", 12 }, { "TERM", 15 }, { "CONT", 18 }, { "STOP", 19 }, { "TSTP", 20 },
};

int request_parse_signal(json_t *body, int *ret, ApiError *e) {
        static const char *const fields[] = { "signal", NULL };
        int r = check_fields(body, NULL, fields, e);
        if (r < 0)
                return r;
        json_t *v = json_object_get(body, "signal");
        if (!v) {
                *ret = 15;
                return 0;
        }
        if (json_is_integer(v)) {
                for (size_t i = 0; i < ELEMENTSOF(signals); i++)
                        if (signals[i].signo == json_integer_value(v)) {
                                *ret = signals[i].signo;
                                return 0;
                        }
        } else if (json_is_string(v)) {
                const char *name = json_string_value(v);
                if (strncmp(name, "SIG", 3) == 0)
                        name += 3;
                for (size_t i = 0; i < ELEMENTSOF(signals); i++)
                        if (strcmp(signals[i].name, name) == 0) {
                                *ret = signals[i].signo;
                                return 0;
                        }
        }
        return INVALID(e, "signal must be one of SIGHUP SIGINT SIGQUIT SIGKILL SIGUSR1 SIGUSR2 SIGTERM SIGCONT "
                          "SIGSTOP SIGTSTP");
}

#define REQ_MAX_PROC_WRITE (1024u * 1024u)

int request_parse_proc_write(json_t *body, uint8_t **ret_data, size_t *ret_len, int64_t *ret_offset, bool *ret_eof,
                             ApiError *e) {
        static const char *const fields[] = { "base64", "data", "offset", "eof", NULL };
        int r = check_fields(body, NULL, fields, e);
        if (r < 0)
                return r;
        json_t *b64 = json_object_get(body, "base64"), *text = json_object_get(body, "data");
        if (b64 && text)
                return INVALID(e, "at most one of base64 and data");
        uint8_t *data = NULL;
        size_t len = 0;
        if (b64) {
                if (!json_is_string(b64))
                        return wrong_type(e, "base64", "a base64 string", b64);
                r = base64_decode(json_string_value(b64), json_string_length(b64), REQ_MAX_PROC_WRITE, &data, &len);
                if (r == -E2BIG)
                        return INVALID(e, "base64 decodes to more than 1 MiB");
                if (r < 0)
                        return r == -ENOMEM ? r : INVALID(e, "base64 is not valid base64");
        } else if (text) {
                if (!json_is_string(text))
                        return wrong_type(e, "data", "a string", text);
                len = json_string_length(text);
                if (len > REQ_MAX_PROC_WRITE)
                        return INVALID(e, "data is larger than 1 MiB");
                if (!(data = malloc(len ? len : 1)))
                        return -ENOMEM;
                memcpy(data, json_string_value(text), len);
        }
        int64_t offset = -1;
        bool eof = false;
        if ((r = get_int(body, "offset", -1, INT64_MAX / 2, -1, &offset, e)) < 0 ||
            (r = get_bool(body, "eof", false, &eof, e)) < 0) {
                free(data);
                return r;
        }
        *ret_data = data;
        *ret_len = len;
        *ret_offset = offset;
        *ret_eof = eof;
        return 0;
}

bool request_idempotency_key_ok(const char *s) {
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || n > 128)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '.' || c == ':' || c == '-'))
                        return false;
        }
        return true;
}

void file_link_request_done(FileLinkRequest *q) {
        free(q->path);
        free(q->filename);
        *q = (FileLinkRequest){ 0 };
}

static int link_method(json_t *body, FileLinkOp *ret, ApiError *e) {
        json_t *v = json_object_get(body, "method");
        const char *m = NULL;
        int r;
        *ret = FILE_LINK_DOWNLOAD;
        if (!v)
                return 0;
        if ((r = get_string(v, "method", 16, &m, NULL, e)) < 0)
                return r;
        if (strcasecmp(m, "GET") == 0 || strcmp(m, "download") == 0)
                return 0;
        if (strcasecmp(m, "PUT") == 0 || strcmp(m, "upload") == 0) {
                *ret = FILE_LINK_UPLOAD;
                return 0;
        }
        return INVALID(e, "method must be GET (a download) or PUT (an upload)");
}

int request_parse_file_link(json_t *body, uint64_t max_bytes, FileLinkRequest *ret, ApiError *e) {
        static const char *const fields[] = { "path", "method", "expiresInSeconds", "oneTime", "wake", "filename",
                                              "archive", "maxBytes", NULL };
        FileLinkRequest q = { .wake = true };
        bool archive = false;
        int64_t bound = 0;
        int r = check_fields(body, NULL, fields, e);
        if (r < 0 || (r = link_method(body, &q.op, e)) < 0 ||
            (r = get_int(body, "expiresInSeconds", FILE_LINK_TTL_MIN, FILE_LINK_TTL_MAX, FILE_LINK_TTL_DEFAULT,
                         &q.ttl_seconds, e)) < 0 ||
            (r = get_bool(body, "oneTime", false, &q.once, e)) < 0 || (r = get_bool(body, "wake", true, &q.wake, e)) < 0 ||
            (r = get_bool(body, "archive", false, &archive, e)) < 0 ||
            (r = get_int(body, "maxBytes", 1, (int64_t)max_bytes, 0, &bound, e)) < 0)
                return r;
        json_t *name = json_object_get(body, "filename");
        if (q.op == FILE_LINK_UPLOAD && (archive || name))
                return INVALID(e, "%s is for a download link (method GET)", archive ? "archive" : "filename");
        if (q.op == FILE_LINK_DOWNLOAD && bound)
                return INVALID(e, "maxBytes is for an upload link (method PUT)");
        if (archive)
                q.op = FILE_LINK_ARCHIVE;
        q.max_bytes = (uint64_t)bound;
        const char *fn = NULL;
        if (name && ((r = get_string(name, "filename", FILE_LINK_FILENAME_MAX, &fn, NULL, e)) < 0))
                return r;
        if (fn && !file_link_filename_ok(fn))
                return INVALID(e, "filename must be 1 to %d printable ASCII characters without quotes, "
                               "backslashes or slashes", FILE_LINK_FILENAME_MAX);
        if (fn && !(q.filename = strdup(fn)))
                return -ENOMEM;
        if ((r = request_path_field(body, "path", true, &q.path, e)) < 0) {
                free(q.filename);
                return r;
        }
        *ret = q;
        return 0;
}

int request_parse_mkdir(json_t *body, char **ret_path, bool *ret_parents, ApiError *e) {
        static const char *const fields[] = { "path", "parents", NULL };
        bool parents = true;
        int r = check_fields(body, NULL, fields, e);
        if (r < 0 || (r = get_bool(body, "parents", true, &parents, e)) < 0)
                return r;
        if ((r = request_path_field(body, "path", true, ret_path, e)) < 0)
                return r;
        *ret_parents = parents;
        return 0;
}

int request_parse_remove(json_t *body, char **ret_path, bool *ret_recursive, ApiError *e) {
        static const char *const fields[] = { "path", "recursive", NULL };
        bool recursive = false;
        int r = check_fields(body, NULL, fields, e);
        if (r < 0 || (r = get_bool(body, "recursive", false, &recursive, e)) < 0)
                return r;
        if ((r = request_path_field(body, "path", true, ret_path, e)) < 0)
                return r;
        *ret_recursive = recursive;
        return 0;
}

int request_parse_rename(json_t *body, char **ret_from, char **ret_to, bool *ret_overwrite, ApiError *e) {
        static const char *const fields[] = { "from", "to", "overwrite", NULL };
        int r = check_fields(body, NULL, fields, e);
        if (r < 0 || (r = get_bool(body, "overwrite", true, ret_overwrite, e)) < 0)
                return r;
        _cleanup_free_ char *from = NULL;
        if ((r = request_path_field(body, "from", true, &from, e)) < 0)
                return r;
        if ((r = request_path_field(body, "to", true, ret_to, e)) < 0)
                return r;
        *ret_from = TAKE_PTR(from);
        return 0;
}

void update_request_done(UpdateRequest *u) {
        free(u->name);
        json_decref(u->labels);
        json_decref(u->network);
        json_decref(u->env);
        *u = (UpdateRequest){ 0 };
}

/* The change an :update makes to the env: names as a create's, a string
 * value (bounded as a create's) sets a variable, null removes it. Whether
 * the whole env stays within its bounds depends on the sandbox's: the
 * manager checks that. */
static int parse_env_changes(json_t *v, json_t **ret, ApiError *e) {
        if (!json_is_object(v))
                return wrong_type(e, "env", "an object of strings (null removes a variable)", v);
        if (json_object_size(v) > REQ_MAX_ENV)
                return INVALID(e, "env has more than %u variables", REQ_MAX_ENV);
        _cleanup_json_ json_t *set = json_object();
        if (!set)
                return -ENOMEM;
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val)
                if (!json_is_null(val) && json_object_set(set, key, val) < 0)
                        return -ENOMEM;
        json_object_foreach(v, key, val) {
                if (json_is_null(val) && !request_env_name_ok(key, strlen(key)))
                        return INVALID(e, "env: variable names must match [A-Za-z_][A-Za-z0-9_]* and be at most %u bytes",
                                       REQ_MAX_ENV_NAME);
        }
        _cleanup_json_ json_t *checked = NULL;
        int r = parse_env(set, "env", &checked, e);
        if (r < 0)
                return r;
        *ret = json_incref(v);
        return 0;
}

int request_parse_update(json_t *body, UpdateRequest *ret, ApiError *e) {
        static const char *const fields[] = { "name", "labels", "network", "timeoutSeconds", "onTimeout", "onLeaseEnd",
                                              "env", "autoWake", "user", "idlePauseSeconds", "persistent",
                                              "maxTotalCostMicros", NULL };
        UpdateRequest u = { .auto_wake = -1, .idle_pause_seconds = -1 };
        int r = check_fields(body, NULL, fields, e);
        if (r < 0 || (r = refuse_unsupported(body, false, e)) < 0)
                return r;
        json_t *v = json_object_get(body, "name");
        if (v) {
                u.set_name = true;
                if (!json_is_null(v)) {
                        const char *s;
                        size_t len;
                        if ((r = get_string(v, "name", REQ_MAX_NAME, &s, &len, e)) < 0)
                                return r;
                        if (len == 0 || !printable(s, len))
                                return INVALID(e, "name must be 1 to 64 printable bytes, or null for none");
                        if (!(u.name = strdup(s)))
                                return -ENOMEM;
                }
        }
        v = json_object_get(body, "labels");
        if (v && json_is_null(v) && !(u.labels = json_object())) { /* null: none */
                r = -ENOMEM;
                goto fail;
        }
        if (v && !json_is_null(v) && (r = parse_labels(v, &u.labels, e)) < 0)
                goto fail;
        v = json_object_get(body, "network");
        if (v && !json_is_null(v) && (r = request_parse_network(v, "network", &u.network, e)) < 0)
                goto fail;
        v = json_object_get(body, "timeoutSeconds");
        if (json_is_integer(v) && json_integer_value(v) == 0) {
                r = api_error(e, 400, "invalid_request",
                              "give a lease of 1 to 86400 seconds, and renew it with :extend (the published client's "
                              "keep_alive())",
                              "timeoutSeconds: 0 (no time limit) is not taken: this daemon gives every sandbox a lease");
                goto fail;
        }
        if (v && (r = get_int(body, "timeoutSeconds", 1, REQ_MAX_TIMEOUT_SECONDS, 0, &u.timeout_seconds, e)) < 0)
                goto fail;
        const char *ends[] = { "onTimeout", "onLeaseEnd" };
        for (int i = 0; i < 2; i++) {
                v = json_object_get(body, ends[i]);
                if (!v || json_is_null(v))
                        continue;
                const char *s = json_string_value(v);
                if (!s || (strcmp(s, "stop") != 0 && strcmp(s, "pause") != 0 && strcmp(s, "delete") != 0)) {
                        r = INVALID(e, "%s must be \"stop\", \"pause\" or \"delete\"", ends[i]);
                        goto fail;
                }
                const char *end = strcmp(s, "stop") == 0 ? "stop" : strcmp(s, "pause") == 0 ? "pause" : "delete";
                if (u.on_lease_end && strcmp(u.on_lease_end, end) != 0) {
                        r = INVALID(e, "onTimeout and onLeaseEnd say different things; send one");
                        goto fail;
                }
                u.on_lease_end = end;
        }
        v = json_object_get(body, "env");
        if (v && (r = parse_env_changes(v, &u.env, e)) < 0)
                goto fail;
        if (json_object_get(body, "autoWake")) {
                bool b = true;
                if ((r = get_bool(body, "autoWake", true, &b, e)) < 0)
                        goto fail;
                u.auto_wake = b;
        }
        if (json_object_get(body, "idlePauseSeconds") &&
            (r = get_int(body, "idlePauseSeconds", 0, REQ_MAX_TIMEOUT_SECONDS, 0, &u.idle_pause_seconds, e)) < 0)
                goto fail;
        v = json_object_get(body, "maxTotalCostMicros");
        if (v) {
                u.set_max_total = true;
                u.max_total_cost_micros = -1; /* null: no cap */
                if (!json_is_null(v) &&
                    (r = get_int(body, "maxTotalCostMicros", 0, INT64_MAX, -1, &u.max_total_cost_micros, e)) < 0)
                        goto fail;
        }
        v = json_object_get(body, "user");
        if (v) {
                ReqUser who;
                if ((r = request_parse_user(v, &who, e)) < 0)
                        goto fail;
                u.set_user = true;
                u.run_as_root = who == REQ_AS_ROOT; /* null: back to the sandbox user */
        }
        *ret = u;
        return 0;
fail:
        update_request_done(&u);
        return r;
}

int request_parse_extend(json_t *body, int64_t *ret_seconds, ApiError *e) {
        static const char *const fields[] = { "seconds", NULL };
        int r = check_fields(body, NULL, fields, e);
        if (r < 0)
                return r;
        if (!json_object_get(body, "seconds"))
                return INVALID(e, "seconds is required");
        return get_int(body, "seconds", 1, REQ_MAX_TIMEOUT_SECONDS, 0, ret_seconds, e);
}

int request_parse_wake(json_t *body, int64_t *ret_timeout_seconds, ApiError *e) {
        static const char *const fields[] = { "timeoutSeconds", NULL };
        int r = check_fields(body, NULL, fields, e);
        if (r < 0)
                return r;
        return get_int(body, "timeoutSeconds", 1, REQ_MAX_TIMEOUT_SECONDS, 0, ret_timeout_seconds, e);
}

int request_parse_wait_for(const char *state, const char *timeout, SandboxState *ret_state, int64_t *ret_timeout_ms,
                           ApiError *e) {
        SandboxState found;
        if (sandbox_state_from_name(state, &found) < 0 || found == SANDBOX_DELETED)
                return INVALID(e, "waitFor must be a state: starting, running, pausing, paused, resuming, stopping, "
                                  "stopped or failed");
        int64_t secs = 60;
        if (timeout) {
                size_t n = strlen(timeout);
                if (n == 0 || n > 3 || strspn(timeout, "0123456789") != n ||
                    (secs = strtoll(timeout, NULL, 10)) > REQ_MAX_WAIT_FOR_SECONDS)
                        return INVALID(e, "timeoutSeconds must be 0 .. %d", REQ_MAX_WAIT_FOR_SECONDS);
        }
        *ret_state = found;
        *ret_timeout_ms = secs * 1000;
        return 0;
}

int request_parse_no_fields(json_t *body, ApiError *e) {
        static const char *const fields[] = { NULL };
        return check_fields(body, NULL, fields, e);
}

int request_parse_mode(const char *s, unsigned *ret, ApiError *e) {
        if (!s || !*s || strlen(s) > 4)
                return INVALID(e, "mode must be octal permission bits (e.g. 644)");
        unsigned v = 0;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '7')
                        return INVALID(e, "mode must be octal permission bits (e.g. 644)");
                v = v * 8 + (unsigned)(*p - '0');
        }
        if (v > 0777)
                return INVALID(e, "mode must be at most 777");
        *ret = v;
        return 0;
}

int request_parse_depth(const char *s, unsigned *ret, ApiError *e) {
        if (!s || !*s || strlen(s) > 2)
                return INVALID(e, "depth must be an integer from 1 to 10");
        unsigned v = 0;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9')
                        return INVALID(e, "depth must be an integer from 1 to 10");
                v = v * 10 + (unsigned)(*p - '0');
        }
        if (v < 1 || v > 10)
                return INVALID(e, "depth must be an integer from 1 to 10");
        *ret = v;
        return 0;
}

int request_apply_trial_shape(bool trial, json_t *body, CreateRequest *req, ApiError *e) {
        if (!trial)
                return 0;
        const char *hint = "a trial sandbox is small; ask the daemon's administrator for a full key for more";
        if (!json_object_get(body, "memoryMiB"))
                req->spec.memory_mib = KEYS_TRIAL_MEMORY_DEFAULT_MIB;
        if (req->spec.vcpu > KEYS_TRIAL_VCPU_MAX)
                return api_error(e, 400, "invalid_request", hint, "vcpu must be at most %u with a trial key",
                                 KEYS_TRIAL_VCPU_MAX);
        if (req->spec.memory_mib > KEYS_TRIAL_MEMORY_MAX_MIB)
                return api_error(e, 400, "invalid_request", hint, "memoryMiB must be at most %u with a trial key",
                                 KEYS_TRIAL_MEMORY_MAX_MIB);
        return 0;
}

int request_parse_name_labels(json_t *body, const char **ret_name, json_t **ret_labels, ApiError *e) {
        const char *name = NULL;
        json_t *v = json_object_get(body, "name");
        int r;
        if (v && !json_is_null(v)) {
                size_t len;
                if ((r = get_string(v, "name", REQ_MAX_NAME, &name, &len, e)) < 0)
                        return r;
                if (!printable(name, len))
                        return INVALID(e, "name must be printable");
        }
        json_t *labels = NULL;
        v = json_object_get(body, "labels");
        if (v && !json_is_null(v) && (r = parse_labels(v, &labels, e)) < 0)
                return r;
        *ret_name = name;
        *ret_labels = labels;
        return 0;
}

/* The create body a copy of the snapshot gets: the snapshot's own fields
 * under what the caller gave. */
static const char *const inherited[] = { "driver", "image", "vcpu", "memoryMiB", "diskMiB", NULL };

int snapshot_merge_create_defaults(json_t *body, json_t *spec, bool memory, ApiError *e) {
        int rc = 0;
        for (size_t i = 0; inherited[i] && rc == 0; i++) {
                json_t *mine = json_object_get(body, inherited[i]);
                json_t *theirs = json_object_get(spec, inherited[i]);
                if (!theirs)
                        continue;
                if (!mine || json_is_null(mine))
                        rc = json_object_set(body, inherited[i], theirs) < 0
                                     ? api_error(e, 500, "internal", NULL, "out of memory")
                                     : 0;
                else if ((strcmp(inherited[i], "driver") == 0 || strcmp(inherited[i], "image") == 0) &&
                         !json_equal(mine, theirs))
                        rc = api_error(e, 400, "invalid_request", "leave it out to take the snapshot's",
                                       "%s must be the snapshot's (%.64s)", inherited[i], json_string_value(theirs));
                else if ((strcmp(inherited[i], "diskMiB") == 0 ||
                          /* A saved machine resumes only with the CPUs and
                           * memory it was saved with. */
                          (memory && (strcmp(inherited[i], "vcpu") == 0 || strcmp(inherited[i], "memoryMiB") == 0))) &&
                         !json_equal(mine, theirs))
                        rc = api_error(e, 400, "invalid_request", "leave it out to take the snapshot's",
                                       "%s must be the snapshot's (%lld)%s", inherited[i],
                                       (long long)json_integer_value(theirs),
                                       memory && strcmp(inherited[i], "diskMiB") != 0 ? " for a memory snapshot" : "");
        }
        return rc;
}
