#pragma once
/* Where the daemon is and which key to show it: --url / RUNTIME_BASE_URL /
 * the default, and --key / RUNTIME_API_KEY / <state dir>/admin.key. */
#include <stddef.h>

#define CLI_DEFAULT_URL "http://127.0.0.1:7878"
#define CLI_URL_MAX 2048
#define CLI_KEY_MAX 512

typedef struct Endpoint {
        char *display;     /* as the user named it, for messages: "http://..." or "unix:/path" */
        char *base;        /* what requests are built on: scheme://authority[/prefix], no trailing '/' */
        char *unix_socket; /* NULL, or the socket path of a "unix:/path" endpoint */
} Endpoint;

/* Parses an http(s) URL or "unix:/path". Refuses credentials in the URL (a
 * key never travels in one), a query or fragment, spaces and control bytes. */
int endpoint_parse(const char *url, Endpoint *ret, char *err, size_t errlen);
void endpoint_done(Endpoint *e);

/* The URL to use: the flag, else RUNTIME_BASE_URL (when not empty), else the default. */
const char *endpoint_choose(const char *flag_url);

typedef enum KeySource {
        KEY_SOURCE_NONE,
        KEY_SOURCE_FLAG,
        KEY_SOURCE_ENV,
        KEY_SOURCE_FILE,
} KeySource;

typedef struct KeyInfo {
        char *key; /* NULL when none was found */
        KeySource source;
        char *file;     /* the admin.key path that was read or looked for */
        int file_errno; /* why that file gave no key, when it did not */
} KeyInfo;

/* The state dir: $RUNTIME_STATE_DIR, else /var/lib/runtime for root, else
 * $XDG_STATE_HOME/runtime, else ~/.local/state/runtime. */
char *state_dir_default(void);

/* A key is 1..512 bytes of printable ASCII without spaces: it goes into an
 * HTTP header, where a CR or LF would forge other headers. */
int key_check(const char *key);

/* Looks in order at flag_key, RUNTIME_API_KEY (when not empty) and the
 * admin.key file. Returns 0 also when no key is found (ret->key NULL);
 * -EINVAL when the key found is malformed (err says which source, never the
 * key); -ENOMEM. */
int key_discover(const char *flag_key, KeyInfo *ret, char *err, size_t errlen);
void key_info_done(KeyInfo *k);
const char *key_source_name(KeySource s);
/* Why the admin.key file gave no key, as the end of a sentence: "does not exist". */
const char *key_file_problem(int file_errno);
