#pragma once
/*
 * An image's start command (docs/images.md, "The start command"): what a
 * sandbox made from the image runs, and how it is known to be ready. The
 * wire's `start` ({command, readyPort | readyCommand, readyTimeoutSeconds})
 * becomes one normalized JSON object here, the one the image's record
 * keeps: {command, readyPort?, readyCommand?, readyTimeoutSeconds}, where
 * command is an argv array (a string is run by /bin/sh -c, as a
 * Dockerfile's shell form). A Dockerfile's CMD and ENTRYPOINT give the
 * default when the build names none. Pure: logs nothing, keeps nothing.
 */
#include <jansson.h>
#include <stddef.h>

#define IMAGE_START_ARGV_MAX 256       /* words of a command */
#define IMAGE_START_COMMAND_MAX 16384  /* bytes of a command, its words together */
#define IMAGE_START_READY_COMMAND_MAX 4096
#define IMAGE_START_TIMEOUT_MIN 1
#define IMAGE_START_TIMEOUT_MAX 600
#define IMAGE_START_TIMEOUT_DEFAULT 60

/* The wire's start object into *ret (a new reference); on a bad one, -EINVAL
 * and why in msg (what the client sees). -ENOMEM. */
int image_start_parse(json_t *v, json_t **ret, char *msg, size_t msg_len);

/* The start a Dockerfile's config gives (its "entrypoint" and "cmd" argv
 * arrays, combined as Docker does: the ENTRYPOINT's words, then the CMD's
 * as its arguments, but none after a shell-form ENTRYPOINT, which
 * config's "entrypointShell" marks) and its "healthcheck" argv (a
 * HEALTHCHECK CMD) as the readiness command, in *ret; NULL when neither
 * CMD nor ENTRYPOINT is set. -ENOMEM. */
int image_start_from_config(json_t *config, json_t **ret);
