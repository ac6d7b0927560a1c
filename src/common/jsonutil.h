#pragma once
#include <jansson.h>

/* jansson (>= 2.9) provides json_decrefp for exactly this use. */
#define _cleanup_json_ __attribute__((cleanup(json_decrefp)))
