#pragma once
#include <jansson.h>

static inline void json_decrefp(json_t **j) {
        if (*j)
                json_decref(*j);
}
#define _cleanup_json_ __attribute__((cleanup(json_decrefp)))
