#pragma once
/* Parsing and local validation of command-line values. Every function here
 * refuses absurd input with a message in err (a NUL-terminated sentence
 * without a trailing newline) and returns a negative errno; results go in the
 * ret_* parameter, written only on success. Nothing here prints. */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define CLI_ERR_MAX 512

/* API bounds (docs/api.md) that the CLI checks before sending anything. */
#define CLI_LEASE_MAX_S 86400L
#define CLI_EXEC_TIMEOUT_MAX_MS 86400000LL
#define CLI_ENV_MAX 128
#define CLI_ENV_NAME_MAX 255
#define CLI_ENV_VALUE_MAX (32 * 1024)
#define CLI_LABELS_MAX 32
#define CLI_LABEL_KEY_MAX 63
#define CLI_LABEL_VALUE_MAX 256
#define CLI_NAME_MAX 64
#define CLI_PATH_MAX 4096
#define CLI_STDIN_MAX (16L * 1024 * 1024)
#define CLI_SANDBOX_ID_MAX 64

/* A whole decimal number in [min, max], nothing else (no sign, no spaces). */
int parse_uint_bounded(const char *what, const char *s, long long min, long long max, long long *ret,
                       char *err, size_t errlen);

/* A duration: "90", "90s", "1500ms", "5m", "2h", "1d". A bare number is in
 * seconds. ret is in milliseconds, within [min_ms, max_ms]. */
int parse_duration_ms(const char *what, const char *s, long long min_ms, long long max_ms, long long *ret,
                      char *err, size_t errlen);

/* The same, in whole seconds: a value that is not a whole number of seconds is refused. */
int parse_duration_s(const char *what, const char *s, long long min_s, long long max_s, long long *ret,
                     char *err, size_t errlen);

/* A size in MiB: "512", "512M", "512MiB", "2G", "2GiB", "1T". A bare number
 * is in MiB. Within [min_mib, max_mib]. */
int parse_size_mib(const char *what, const char *s, long long min_mib, long long max_mib, long long *ret,
                   char *err, size_t errlen);

typedef enum KvKind {
        KV_ENV,   /* names [A-Za-z_][A-Za-z0-9_]*, the API's env bounds */
        KV_LABEL, /* labels: non-empty keys, the API's label bounds */
} KvKind;

/* Parses "K=V" and sets it in obj (a JSON object of strings); the last of
 * two equal keys wins. Refuses a missing '=', a bad name, values over the
 * bounds, and more entries than the API takes. */
int parse_kv_into(KvKind kind, const char *s, json_t *obj, char *err, size_t errlen);

bool env_name_valid(const char *name, size_t len);

/* A sandbox id as the daemon makes them: [A-Za-z0-9_-]{1,64}. Checked before
 * it goes into a URL path, so an argument like "../keys" never reaches the
 * daemon as another route. */
bool sandbox_id_valid(const char *id);

/* An image name: [a-z0-9][a-z0-9._-]{0,63}. */
bool image_name_valid(const char *name);

/* A user a command runs as: "sandbox" (the default) or "root", the two every
 * sandbox has. */
bool cli_user_valid(const char *user);

/* A path inside the sandbox: 1..4096 bytes. */
int sandbox_path_check(const char *path, char *err, size_t errlen);

/* Standard base64 with padding; NULL on allocation failure. */
char *base64_encode(const void *data, size_t len);
