/* The owners' egress secrets: what a client may store (validated here),
 * rotating, listing and deleting them, and the copy a connection's proxy
 * gets. The records are the store's (store_egress.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/egress/egress_seal.h"
#include "daemon/egress/egress_internal.h"
#include "egress/policy.h"
#include "egress/secret.h"

#define MAX_SECRET_HOSTS 64

bool egress_secret_in_scope(const json_t *scope, const char *name) {
        if (!scope)
                return true;
        size_t i;
        json_t *v;
        json_array_foreach(scope, i, v) {
                if (json_is_string(v) && strcmp(json_string_value(v), name) == 0)
                        return true;
        }
        return false;
}

/* What a value is sealed with besides the key: its row, so that a sealed
 * value copied into another owner's or name's row does not open there. */
static void seal_aad(const char *owner, const char *name, char *buf, size_t n) {
        snprintf(buf, n, "egress-secret/%s/%s", owner, name);
}

/* The value the store is to keep (malloc'ed): sealed when the service has a
 * key. */
static int seal_value(EgressService *svc, const char *owner, const char *name, const char *value, char **ret) {
        if (!svc->sealed)
                return (*ret = strdup(value)) ? 0 : -ENOMEM;
        char aad[256];
        seal_aad(owner, name, aad, sizeof(aad));
        return seal_encrypt(svc->seal_key, aad, value, ret);
}

int egress_secrets_for_proxy(EgressService *svc, const char *owner, const json_t *scope, json_t **ret) {
        StoreEgressSecret *list = NULL;
        size_t n = 0;
        bool more = false;
        int r = svc->store->secret_list(svc->records, owner, NULL, MAX_SECRETS_PER_OWNER, true, &list, &n, &more);
        if (r < 0)
                return r;
        json_t *out = json_array();
        for (size_t i = 0; out && i < n; i++) {
                const StoreEgressSecret *s = &list[i];
                if (!egress_secret_in_scope(scope, s->name))
                        continue;
                /* Sealed values open with the service's key and their row;
                 * one written before values were sealed is read as it is
                 * (and sealed at its next write). One that does not open (a
                 * key other than the one that sealed it, a row tampered
                 * with) is left out: the sandbox sees its placeholder only. */
                char *plain = NULL;
                if (seal_is_sealed(s->value)) {
                        char aad[256];
                        seal_aad(owner, s->name, aad, sizeof(aad));
                        if (!svc->sealed || seal_decrypt(svc->seal_key, aad, s->value, &plain) < 0) {
                                log_error(NULL, "egress secret %s of %s does not open with this host's secrets key; "
                                                "it is left out (are the hosts' --secrets-key-file the same?)",
                                          s->name, owner);
                                continue;
                        }
                }
                json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s?,s:s?}", "name", s->name, "value",
                                      plain ? plain : s->value, "hosts", s->hosts, "placeholder", s->placeholder,
                                      "header", s->header, "format", s->format, "rules", s->rules);
                if (plain) {
                        explicit_bzero(plain, strlen(plain));
                        free(plain);
                }
                if (!o || json_array_append_new(out, o) < 0) {
                        json_decref(out);
                        out = NULL;
                }
        }
        store_egress_secrets_free(list, n);
        if (!out)
                return -ENOMEM;
        *ret = out;
        return 0;
}

void egress_secret_info_done(EgressSecretInfo *s) {
        if (!s)
                return;
        free(s->name);
        free(s->hosts);
        free(s->placeholder);
        free(s->header);
        free(s->format);
        free(s->rules);
        *s = (EgressSecretInfo){ 0 };
}

void egress_secret_infos_free(EgressSecretInfo *s, size_t n) {
        for (size_t i = 0; s && i < n; i++)
                egress_secret_info_done(&s[i]);
        free(s);
}

/* What its owner may see of a stored secret: all but its value (and the
 * store's version). Takes the strings of s. */
static void secret_info_take(StoreEgressSecret *s, EgressSecretInfo *ret) {
        *ret = (EgressSecretInfo){
                .name = TAKE_PTR(s->name),
                .hosts = TAKE_PTR(s->hosts),
                .placeholder = TAKE_PTR(s->placeholder),
                .created_at = s->created_at,
                .updated_at = s->updated_at,
                .header = TAKE_PTR(s->header),
                .format = TAKE_PTR(s->format),
                .rules = TAKE_PTR(s->rules),
        };
        store_egress_secret_done(s);
}

static int name_error(SandboxError *e) {
        return sandbox_error(e, SANDBOX_ERR_INVALID, "use an environment variable name such as OPENAI_API_KEY",
                         "a secret's name must be [A-Za-z_][A-Za-z0-9_]{0,63} and not one the daemon sets "
                         "itself (HTTP_PROXY, PATH, ...)");
}

static int value_error(SandboxError *e) {
        return sandbox_error(e, SANDBOX_ERR_INVALID, "values go into HTTP headers, so they cannot hold line breaks",
                             "value must be a string of 1 to %d bytes of visible ASCII and spaces (no CR, LF, "
                             "tab or NUL)",
                             EGRESS_SECRET_MAX_VALUE);
}

/* Fields of the published client's secrets that a self-hosted daemon does
 * not serve: refused by name, never ignored, so no caller believes a secret
 * is narrower than it is. */
static const struct {
        const char *field, *what;
} not_served[] = {
        { "only", "per-secret sandbox selectors; name the secrets a sandbox may use in its create's "
                  "\"secrets\" instead" },
        { "githubApp", "GitHub App secrets" },
        { "git", "git push rules" },
        { "api", "per-secret API call budgets" },
        { "env", "another variable name than the secret's own; store it under that name" },
};

/* The client's body, validated and normalised into what is stored: the
 * value, the hosts, the header and format, the rules. */
typedef struct SecretInput {
        const char *value, *header, *format;
        char *hosts, *rules;
} SecretInput;

static void secret_input_done(SecretInput *in) {
        free(in->hosts);
        free(in->rules);
}

static int secret_body_fields(const json_t *body, SandboxError *e) {
        if (!json_is_object(body))
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL,
                                     "the body must be an object {value, hosts, header, format, rules}");
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)body, key, v) {
                if (!strcmp(key, "value") || !strcmp(key, "hosts") || !strcmp(key, "header") ||
                    !strcmp(key, "format") || !strcmp(key, "rules"))
                        continue;
                for (size_t i = 0; i < ELEMENTSOF(not_served); i++)
                        if (strcmp(key, not_served[i].field) == 0)
                                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED,
                                                     "leave it out: this daemon serves value, hosts, header, "
                                                     "format and rules",
                                                     "%s: this self-hosted daemon has no %s", key, not_served[i].what);
                return sandbox_error(e, SANDBOX_ERR_INVALID, "the fields are value, hosts, header, format and rules",
                                     "unknown field %.64s", key);
        }
        return 0;
}

/* value, hosts, header, format and rules: each checked, the hosts and rules
 * normalised as the proxy reads them. */
static int secret_input_parse(const json_t *body, SecretInput *ret, SandboxError *e) {
        int r = secret_body_fields(body, e);
        if (r < 0)
                return r;
        json_t *value = json_object_get(body, "value"), *hosts = json_object_get(body, "hosts");
        if (!json_is_string(value) ||
            !egress_secret_value_valid(json_string_value(value), json_string_length(value)))
                return value_error(e);
        if (!json_is_array(hosts) || json_array_size(hosts) == 0 || json_array_size(hosts) > MAX_SECRET_HOSTS)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "for example [\"api.openai.com\"]",
                                     "hosts must be an array of 1 to %d host patterns the secret may go to",
                                     MAX_SECRET_HOSTS);
        json_t *header = json_object_get(body, "header"), *format = json_object_get(body, "format");
        json_t *rules = json_object_get(body, "rules");
        if (json_is_null(header))
                header = NULL;
        if (json_is_null(format))
                format = NULL;
        if (json_is_null(rules))
                rules = NULL;
        if (header && (!json_is_string(header) || strlen(json_string_value(header)) != json_string_length(header) ||
                       !egress_secret_header_valid(json_string_value(header))))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "for example \"Authorization\" or \"X-Api-Key\"",
                                     "header must be a header name (a token of 1 to %d bytes) that does not frame "
                                     "the request (not Host, Content-Length, Transfer-Encoding, Connection, "
                                     "Upgrade, TE, Trailer, Expect or Proxy-*)",
                                     EGRESS_SECRET_MAX_HEADER);
        if (format && !header)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "give header with format", "format needs a header");
        if (format && (!json_is_string(format) || strlen(json_string_value(format)) != json_string_length(format) ||
                       !egress_secret_format_valid(json_string_value(format))))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "for example \"Bearer {value}\"",
                                     "format must be 1 to %d bytes of visible ASCII and spaces holding {value} "
                                     "exactly once",
                                     EGRESS_SECRET_MAX_FORMAT);
        _cleanup_json_ json_t *rules_norm = NULL;
        _cleanup_free_ char *rules_text = NULL;
        if (rules) {
                char err[256] = "";
                if (egress_secret_rules_parse(rules, &rules_norm, NULL, NULL, err, sizeof(err)) < 0)
                        return sandbox_error(e, SANDBOX_ERR_INVALID,
                                             "for example [{\"methods\": [\"GET\"], \"paths\": [\"/repos/acme/*\"]}]",
                                             "%s", err);
                if (!(rules_text = json_dumps(rules_norm, JSON_COMPACT)))
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        }
        _cleanup_json_ json_t *net = json_pack("{s:b,s:O}", "internet", 1, "allow", hosts);
        EgressPolicy *p = NULL;
        char err[256] = "";
        if (!net || egress_policy_parse(net, &p, err, sizeof(err)) < 0)
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL, "hosts: %s", err[0] ? err : "invalid");
        _cleanup_json_ json_t *norm = egress_policy_to_json(p);
        egress_policy_free(p);
        char *hosts_text = norm ? json_dumps(json_object_get(norm, "allow"), JSON_COMPACT) : NULL;
        if (!hosts_text)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        *ret = (SecretInput){
                .value = json_string_value(value),
                .header = header ? json_string_value(header) : NULL,
                .format = format ? json_string_value(format) : NULL,
                .hosts = hosts_text,
                .rules = TAKE_PTR(rules_text),
        };
        return 0;
}

int egress_secret_put(EgressService *svc, const char *owner, const char *name, const json_t *body,
                      EgressSecretInfo *ret, SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return name_error(e);
        SecretInput in = { 0 };
        int r = secret_input_parse(body, &in, e);
        if (r < 0)
                return r;
        char rnd[33], placeholder[96];
        if (random_hex(rnd, 16) < 0) {
                secret_input_done(&in);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "no randomness");
        }
        snprintf(placeholder, sizeof(placeholder), "%s%s-%s", EGRESS_PLACEHOLDER_PREFIX, name, rnd);
        /* The placeholder is made once and kept across replaces and rotations:
         * running sandboxes hold it in their environment. A replace sets
         * every field but the placeholder: rules or a header left out are
         * cleared, never kept from the old value's time. */
        _cleanup_free_ char *sealed = NULL;
        if (seal_value(svc, owner, name, in.value, &sealed) < 0) {
                secret_input_done(&in);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not seal the secret");
        }
        StoreEgressSecret row = {
                .name = (char *)name,
                .value = sealed,
                .hosts = in.hosts,
                .placeholder = placeholder,
                .header = (char *)in.header,
                .format = (char *)in.format,
                .rules = in.rules,
                .created_at = time_now_unix(),
        };
        row.updated_at = row.created_at;
        StoreEgressSecret stored = { 0 };
        /* The API has no version: a replace is unconditional, the last
         * writer's as before. */
        r = svc->store->secret_put(svc->records, owner, &row, STORE_EGRESS_ANY_VERSION, MAX_SECRETS_PER_OWNER,
                                   &stored);
        secret_input_done(&in);
        if (r == -EDQUOT)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "delete one you no longer use",
                                     "at most %d secrets per owner", MAX_SECRETS_PER_OWNER);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not store the secret");
        secret_info_take(&stored, ret);
        return 0;
}

int egress_secret_rotate(EgressService *svc, const char *owner, const char *name, const json_t *body,
                         EgressSecretInfo *ret, SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list them with GET /v1/egress-secrets", "no secret %.64s",
                                     name);
        const char *key;
        json_t *v;
        if (!json_is_object(body))
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL, "the body must be an object {value}");
        json_object_foreach((json_t *)body, key, v) {
                if (strcmp(key, "value") != 0)
                        return sandbox_error(e, SANDBOX_ERR_INVALID,
                                             "a rotation changes the value alone; to change the rest, PUT the secret",
                                             "unknown field %.64s", key);
        }
        json_t *value = json_object_get(body, "value");
        if (!json_is_string(value) ||
            !egress_secret_value_valid(json_string_value(value), json_string_length(value)))
                return value_error(e);
        StoreEgressSecret stored = { 0 };
        _cleanup_free_ char *sealed = NULL;
        if (seal_value(svc, owner, name, json_string_value(value), &sealed) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not seal the secret");
        int r = svc->store->secret_rotate(svc->records, owner, name, sealed, time_now_unix(),
                                          STORE_EGRESS_ANY_VERSION, &stored);
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "store it first with PUT /v1/egress-secrets/{name}",
                                     "no secret %s", name);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not rotate the secret");
        secret_info_take(&stored, ret);
        return 0;
}

int egress_secret_get(EgressService *svc, const char *owner, const char *name, EgressSecretInfo *ret,
                      SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list them with GET /v1/egress-secrets", "no secret %.64s",
                                     name);
        StoreEgressSecret stored = { 0 };
        int r = svc->store->secret_get(svc->records, owner, name, &stored);
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list them with GET /v1/egress-secrets", "no secret %s", name);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the secret");
        secret_info_take(&stored, ret);
        return 0;
}

int egress_secret_list(EgressService *svc, const char *owner, unsigned limit, const char *after,
                       EgressSecretInfo **ret, size_t *ret_n, bool *ret_more, SandboxError *e) {
        if (after && !egress_secret_name_ok(after))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "pass the last name of the page before",
                                     "after must be a secret's name");
        if (limit == 0 || limit > MAX_SECRETS_PER_OWNER)
                limit = MAX_SECRETS_PER_OWNER;
        StoreEgressSecret *rows = NULL;
        size_t n = 0;
        bool more = false;
        int r = svc->store->secret_list(svc->records, owner, after, limit, false, &rows, &n, &more);
        EgressSecretInfo *list = r == 0 ? calloc(n ? n : 1, sizeof(*list)) : NULL;
        if (!list) {
                store_egress_secrets_free(rows, n);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not list the secrets");
        }
        for (size_t i = 0; i < n; i++)
                secret_info_take(&rows[i], &list[i]);
        store_egress_secrets_free(rows, n);
        *ret = list;
        *ret_n = n;
        *ret_more = more;
        return 0;
}

int egress_secret_delete(EgressService *svc, const char *owner, const char *name, SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, NULL, "no secret %.64s", name);
        int r = svc->store->secret_delete(svc->records, owner, name, STORE_EGRESS_ANY_VERSION);
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, NULL, "no secret %s", name);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not delete the secret");
        /* Connections load the owner's secrets when they open: from now on no
         * new request carries the value. */
        return 0;
}
