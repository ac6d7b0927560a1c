#pragma once
/* jansson >= 2.9 defines json_decrefp itself; use it for the cleanup
 * attribute. */
#include <jansson.h>

#ifndef _cleanup_json_
#define _cleanup_json_ __attribute__((cleanup(json_decrefp)))
#endif

#ifndef RUNTIME_VERSION
#define RUNTIME_VERSION "0.0.0"
#endif
