#pragma once
/* The one error shape of the HTTP API: {"error": {code, status, message,
 * hint, requestId}}. Handlers fill an ApiError; the HTTP layer renders it. */
#include <jansson.h>

typedef struct ApiError {
        int status;       /* HTTP status */
        const char *code; /* stable code: invalid_request, not_found, ... */
        char message[512];
        char hint[256];
} ApiError;

/* Fills e and returns -EINVAL, so that validators can `return api_error(...)`.
 * hint may be NULL. */
int api_error(ApiError *e, int status, const char *code, const char *hint, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));
/* The error object for a response body (a new reference, NULL on ENOMEM). */
json_t *api_error_json(const ApiError *e, const char *request_id);
