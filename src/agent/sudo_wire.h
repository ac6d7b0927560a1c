#pragma once
/*
 * The sudo gateway's wire and policy (docs/drivers.md, "sudo"): what the
 * sandbox's `sudo` front sends the agent's root gateway over a unix socket,
 * and what the gateway makes of it. Pure code, for the unit tests: no
 * sockets, no processes.
 *
 * A request is one SudoHeader (sent with the caller's stdin, stdout and
 * stderr as SCM_RIGHTS) and then `len` bytes of NUL-terminated strings:
 * the target user, the working directory, the --preserve-env list, argc
 * arguments, envc variables of the caller and setc VAR=value operands.
 * After it both sides send SudoFrames: the front a SIGNAL per signal it
 * received, the gateway one EXIT (a wait status) or one ERROR (an exit
 * code and a message).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SUDO_SOCKET_PATH "/.runtime/sudo.sock"
/* An image (or an operator building one) turns the gateway off by making
 * this file; an image without /usr/bin/sudo has none either. */
#define SUDO_OFF_PATH "/.runtime/no-sudo-gateway"
/* Where the front is placed: ahead of /usr/bin on every PATH a shell or a
 * login of the image sets. */
#define SUDO_FRONT_PATH "/usr/local/bin/sudo"
#define SUDO_SECURE_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#define SUDO_MAGIC 0x52535544u /* "RSUD" */
#define SUDO_VERSION 1u
/* Bounds of a request: Linux's own ARG_MAX is about 2 MiB. */
#define SUDO_ARGC_MAX 4096u
#define SUDO_ENVC_MAX 1024u
#define SUDO_REQUEST_MAX (1024u * 1024u)
#define SUDO_MESSAGE_MAX 1024u

enum {
        SUDO_LOGIN = 1u << 0,         /* -i */
        SUDO_SHELL = 1u << 1,         /* -s */
        SUDO_PRESERVE_ENV = 1u << 2,  /* -E, --preserve-env */
        SUDO_FLAGS_ALL = (1u << 3) - 1,
};

enum {
        SUDO_FRAME_SIGNAL = 1, /* front: value is a signal number */
        SUDO_FRAME_EXIT = 2,   /* gateway: value is the command's wait status */
        SUDO_FRAME_ERROR = 3,  /* gateway: value is sudo's exit code, then len bytes of message */
};

typedef struct SudoHeader {
        uint32_t magic;
        uint32_t version;
        uint32_t flags;
        uint32_t argc;
        uint32_t envc;
        uint32_t setc;
        uint32_t len;
} SudoHeader;

typedef struct SudoFrame {
        uint32_t type;
        int32_t value;
        uint32_t len;
} SudoFrame;

/* A request as the gateway reads it: pointers into the payload. */
typedef struct SudoRequest {
        uint32_t flags;
        const char *user; /* "" is root */
        const char *cwd;
        const char *preserve; /* comma-separated names, or "" */
        const char **argv;
        size_t argc;
        const char **env;
        size_t envc;
        const char **set;
        size_t setc;
} SudoRequest;

/* What the front's command line asks for. */
typedef enum SudoAction {
        SUDO_ACTION_RUN,
        SUDO_ACTION_LIST,
        SUDO_ACTION_VALIDATE,
        SUDO_ACTION_VERSION,
        SUDO_ACTION_HELP,
} SudoAction;

typedef struct SudoOptions {
        SudoAction action;
        uint32_t flags;
        const char *user;
        const char *preserve;
        char **set; /* the VAR=value operands before the command */
        size_t setc;
        char **argv; /* the command */
        size_t argc;
} SudoOptions;

/* Parses sudo's command line (argv[0] is "sudo"). 0 and *ret (its arrays
 * point into argv; set is allocated, freed by the caller); -EINVAL with a
 * message for the user in err. */
int sudo_parse_options(int argc, char **argv, SudoOptions *ret, char *err, size_t err_len);

/* Checks hdr and the payload of hdr->len bytes and fills *ret with pointers
 * into it (the arrays allocated; sudo_request_free). -EPROTO for anything
 * malformed, -E2BIG past a bound. */
int sudo_header_check(const SudoHeader *hdr);
int sudo_request_parse(const SudoHeader *hdr, const char *payload, SudoRequest *ret);
void sudo_request_free(SudoRequest *r);

/* The payload of a request (malloc'd) for the front. */
int sudo_request_encode(const SudoOptions *o, const char *cwd, char *const env[], SudoHeader *ret_hdr,
                        char **ret_payload);

/* The target of a command: the passwd entry plus its shell. */
typedef struct SudoTarget {
        char name[33];
        char home[256];
        char shell[256];
        uid_t uid;
        gid_t gid;
} SudoTarget;

/* The environment the command gets, as Debian's sudo (env_reset,
 * secure_path) would make it for caller_name/caller_uid/caller_gid, plus the
 * sandbox's network settings (the egress relay and its CA). NULL-terminated,
 * every string allocated; sudo_env_free. */
char **sudo_build_env(const SudoRequest *r, const SudoTarget *t, const char *caller_name, uid_t caller_uid,
                      gid_t caller_gid);
void sudo_env_free(char **env);

/* The command's argv: the request's own, or the shell's for -i and -s (the
 * arguments joined, each character but letters, digits, '_', '-' and '$'
 * escaped with a backslash, as sudo does). argv[0] of a login shell is
 * "-NAME". Allocated strings in an allocated array; sudo_env_free. */
char **sudo_build_argv(const SudoRequest *r, const SudoTarget *t, const char *caller_shell);

/* The gids of user's groups in the text of an /etc/group (besides primary,
 * which comes first): at most max; the count. */
size_t sudo_parse_groups(const char *buf, size_t len, const char *user, gid_t primary, gid_t *gids, size_t max);

/* The shell field of name's line in the text of a passwd file into shell,
 * "/bin/sh" where it is empty. 0, -ENOENT, -ERANGE. */
int sudo_parse_shell(const char *buf, size_t len, const char *name, char *shell, size_t shell_len);
