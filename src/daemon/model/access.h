#pragma once
/* What a key may do: read (look) or full (create, run, write, spend). */
#include <stdbool.h>

typedef enum KeyAccess {
        KEY_ACCESS_READ = 0,
        KEY_ACCESS_FULL,
} KeyAccess;

/* "read" or "full", as the API and the store say it. */
const char *key_access_name(KeyAccess a);
/* -EINVAL for any other name. */
int key_access_from_name(const char *s, KeyAccess *ret);
/* Whether a key's requests to a sandbox are activity, which keeps it from
 * its idle pause: a full key's always; a read key's only when its owner made
 * it so (keepsAwake), since by default a dashboard that polls must not keep a
 * sandbox running, and charged, when nobody uses it. */
bool key_access_keeps_awake(KeyAccess a, bool keeps_awake);
