#pragma once
/* What a key may do: read (look) or full (create, run, write, spend). */
typedef enum KeyAccess {
        KEY_ACCESS_READ = 0,
        KEY_ACCESS_FULL,
} KeyAccess;

/* "read" or "full", as the API and the store say it. */
const char *key_access_name(KeyAccess a);
/* -EINVAL for any other name. */
int key_access_from_name(const char *s, KeyAccess *ret);
