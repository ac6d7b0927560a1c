#pragma once
/*
 * The user a request runs as, by name, looked up in the sandbox's own
 * /etc/passwd (the image says who "sandbox" is; a static agent has no NSS).
 * The parser is pure, for the unit tests and the fuzzer; the agent applies
 * the ids: a child with setgroups/setgid/setuid before its exec, the agent
 * itself for a file operation with its effective ids (user_enter and
 * user_leave: setfsuid is missing on gVisor).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define USER_NAME_MAX 32
#define USER_HOME_MAX 256
/* /etc/passwd read at most this far: a sandbox's root may grow it. */
#define USER_PASSWD_MAX (1024u * 1024u)
/* The ids a user may have: the drivers map 0..65535, and 65534 and above are
 * nobody and the overflow ids, never a command's on purpose. */
#define USER_ID_MAX 65533u

typedef struct AgentUser {
        char name[USER_NAME_MAX + 1];
        char home[USER_HOME_MAX];
        uid_t uid;
        gid_t gid;
} AgentUser;

/* A name the protocol accepts: 1..32 bytes of [a-z_][a-z0-9_-]*. */
bool user_name_valid(const char *name);
/* Finds name in the text of a passwd file (buf, len bytes, not necessarily
 * NUL-terminated). 0 and *ret; -ENOENT when no line names it; -ERANGE when
 * its ids are past USER_ID_MAX or its home is not an absolute path that fits. */
int user_parse_passwd(const char *buf, size_t len, const char *name, AgentUser *ret);
/* The text of a user database of the sandbox (/etc/passwd, /etc/group): a
 * regular file, its first USER_PASSWD_MAX bytes, into *ret (the caller's to
 * free). -ENOENT when it is missing or not a regular file. */
int user_read_db(const char *path, char **ret, size_t *ret_len);
/* The same over the file at path (the sandbox's /etc/passwd). */
int user_lookup(const char *path, const char *name, AgentUser *ret);
/* Names of ids for a listing's owner and group, from the text of the
 * sandbox's /etc/passwd or /etc/group: the first usable line naming an id
 * wins, as getpwuid's does. A name is used only when it is 1..USER_NAME_MAX
 * bytes of [A-Za-z0-9._-] not starting with '-' (a '$' may end it, as a
 * machine account's does): the files are the sandbox's, and what they say
 * reaches the API's JSON. */
typedef struct UserNames UserNames;
/* Text of an id: a name or up to ten digits. */
#define USER_ID_TEXT_MAX (USER_NAME_MAX + 1)

/* Parses the text (buf, len bytes, not necessarily NUL-terminated); the
 * table keeps no pointer into buf. -ENOMEM. */
int user_names_parse(const char *buf, size_t len, UserNames **ret);
/* The same over the file at path; a missing or unreadable one gives an
 * empty table (every id then shows as its number). -ENOMEM. */
int user_names_load(const char *path, UserNames **ret);
void user_names_free(UserNames *n);
/* The name of id, or its number as text; n may be NULL. Returns buf. */
const char *user_names_get(const UserNames *n, uint32_t id, char buf[static USER_ID_TEXT_MAX]);

/* The agent's own effective ids become the user's (its groups first), and
 * back to root: the permissions and the owner of a file operation are then
 * the user's. The agent is single-threaded and goes back before its next
 * poll; its real and saved ids stay root, so no process of the user's can
 * signal, trace or read it meanwhile (the kernel also clears its dumpable
 * flag). What the user could reach in that window, a renice or an affinity
 * of the agent by euid, costs only its own sandbox. */
int user_enter(uid_t uid, gid_t gid);
void user_leave(void);
