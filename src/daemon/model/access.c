#include "daemon/model/access.h"

#include <errno.h>
#include <string.h>

const char *key_access_name(KeyAccess a) {
        return a == KEY_ACCESS_FULL ? "full" : "read";
}

int key_access_from_name(const char *s, KeyAccess *ret) {
        if (s && strcmp(s, "full") == 0)
                *ret = KEY_ACCESS_FULL;
        else if (s && strcmp(s, "read") == 0)
                *ret = KEY_ACCESS_READ;
        else
                return -EINVAL;
        return 0;
}

bool key_access_keeps_awake(KeyAccess a, bool keeps_awake) {
        return a == KEY_ACCESS_FULL || keeps_awake;
}
