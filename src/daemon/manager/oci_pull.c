/* Images from OCI registries and archives (oci_pull.h). skopeo runs as the
 * overflow user (65534) and downloads into a directory of its own; umoci runs
 * as uid 100000 (root of the sandboxes' range) and unpacks without privilege
 * (--rootless), so every file of the tree belongs to the sandbox's root and
 * no tool of the pull holds root or the daemon's state. Each runs in a
 * process group of its own, killed when the pull passes its time or its
 * bytes. What those tools wrote is read back as hostile: beneath the pull's
 * directory only, no symbolic links, bounded, and the manifest hashed. */
#include "daemon/manager/oci_pull.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <linux/openat2.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "common/log.h"
#include "driver/launch.h"

#define PULL_UID 65534u /* nobody: the downloader */
#define UNPACK_UID LAUNCH_DEFAULT_UID_SHIFT
#define SKOPEO "/usr/bin/skopeo"
#define UMOCI "/usr/bin/umoci"
#define BLOB_MAX (4u << 20) /* a manifest or a config */
#define ERR_KEEP 2048

void oci_pulled_done(OciPulled *p) {
        if (!p)
                return;
        json_decref(p->config);
        p->config = NULL;
}

/* ---- references ---- */

static bool repo_ok(const char *s) {
        /* path components of [a-z0-9] joined by one of . _ __ - (lenient:
         * any run of them), never empty, never at an end. */
        if (!*s || strlen(s) > 255)
                return false;
        char prev = '/';
        for (const char *p = s; *p; p++) {
                bool alnum = islower((unsigned char)*p) || isdigit((unsigned char)*p);
                if (!alnum && !strchr("._-/", *p))
                        return false;
                if (!alnum && (prev == '/' || (*p == '/' && !isalnum((unsigned char)prev))))
                        return false;
                prev = *p;
        }
        return isalnum((unsigned char)prev);
}

static bool host_ok(const char *s, size_t n) {
        if (n == 0 || n > 253 || s[0] == '-' || s[0] == '.')
                return false;
        size_t colon = n;
        for (size_t i = 0; i < n; i++)
                if (s[i] == ':') {
                        colon = i;
                        break;
                }
        for (size_t i = 0; i < colon; i++)
                if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '-')
                        return false;
        if (colon < n) {
                if (colon + 1 == n || n - colon - 1 > 5)
                        return false;
                for (size_t i = colon + 1; i < n; i++)
                        if (!isdigit((unsigned char)s[i]))
                                return false;
        }
        return colon > 0;
}

static bool tag_ok(const char *s) {
        if (!*s || strlen(s) > 128 || !(isalnum((unsigned char)s[0]) || s[0] == '_'))
                return false;
        for (; *s; s++)
                if (!isalnum((unsigned char)*s) && !strchr("_.-", *s))
                        return false;
        return true;
}

static bool digest_ok(const char *s) {
        if (strncmp(s, "sha256:", 7) != 0 || strlen(s) != OCI_DIGEST_LEN)
                return false;
        for (s += 7; *s; s++)
                if (!isdigit((unsigned char)*s) && !(*s >= 'a' && *s <= 'f'))
                        return false;
        return true;
}

int oci_ref_parse(const char *ref, OciRef *ret) {
        if (!ref || !*ref || strlen(ref) > OCI_REF_MAX || ref[0] == '-')
                return -EINVAL;
        OciRef r = { 0 };
        char name[OCI_REF_MAX + 1];
        snprintf(name, sizeof name, "%s", ref);
        char *at = strchr(name, '@');
        if (at) {
                *at = '\0';
                if (!digest_ok(at + 1))
                        return -EINVAL;
                snprintf(r.digest, sizeof r.digest, "%s", at + 1);
        }
        /* The first component is a registry when it looks like a host. */
        char *slash = strchr(name, '/');
        char *path = name;
        if (slash && (memchr(name, '.', (size_t)(slash - name)) || memchr(name, ':', (size_t)(slash - name)) ||
                      ((size_t)(slash - name) == 9 && strncmp(name, "localhost", 9) == 0))) {
                if (!host_ok(name, (size_t)(slash - name)))
                        return -EINVAL;
                snprintf(r.registry, sizeof r.registry, "%.*s", (int)(slash - name), name);
                path = slash + 1;
        } else
                snprintf(r.registry, sizeof r.registry, "docker.io");
        char *colon = strrchr(path, ':');
        if (colon) {
                *colon = '\0';
                if (!tag_ok(colon + 1))
                        return -EINVAL;
                if (!r.digest[0])
                        snprintf(r.tag, sizeof r.tag, "%s", colon + 1);
        }
        if (!repo_ok(path))
                return -EINVAL;
        const char *library = strcmp(r.registry, "docker.io") == 0 && !strchr(path, '/') ? "library/" : "";
        if (strlen(library) + strlen(path) >= sizeof r.repo)
                return -EINVAL;
        memcpy(r.repo, library, strlen(library));
        memcpy(r.repo + strlen(library), path, strlen(path) + 1);
        if (!r.digest[0] && !r.tag[0])
                snprintf(r.tag, sizeof r.tag, "latest");
        *ret = r;
        return 0;
}

int oci_registry_normalize(const char *in, char ret[256]) {
        if (!in || strlen(in) > 255)
                return -EINVAL;
        const char *s = in;
        if (strncmp(s, "https://", 8) == 0)
                s += 8;
        else if (strncmp(s, "http://", 7) == 0)
                s += 7;
        size_t n = strcspn(s, "/");
        /* Only a path of Docker's own ("/v1/", "/v2/") may follow. */
        if (s[n] && strcmp(s + n, "/") != 0 && strcmp(s + n, "/v1/") != 0 && strcmp(s + n, "/v2/") != 0 &&
            strcmp(s + n, "/v1") != 0 && strcmp(s + n, "/v2") != 0)
                return -EINVAL;
        if (!host_ok(s, n))
                return -EINVAL;
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)n, s);
        for (char *p = host; *p; p++)
                *p = (char)tolower((unsigned char)*p);
        if (strcmp(host, "index.docker.io") == 0 || strcmp(host, "registry-1.docker.io") == 0)
                snprintf(host, sizeof host, "docker.io");
        memcpy(ret, host, strlen(host) + 1);
        return 0;
}

int oci_ref_transport(const OciRef *ref, char *buf, size_t len) {
        int n = ref->digest[0] ? snprintf(buf, len, "docker://%s/%s@%s", ref->registry, ref->repo, ref->digest)
                               : snprintf(buf, len, "docker://%s/%s:%s", ref->registry, ref->repo, ref->tag);
        return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- where trees live ---- */

char *oci_images_dir(const char *state_dir) {
        char *p = NULL;
        return asprintf(&p, "%s/oci-images", state_dir) < 0 ? NULL : p;
}

char *oci_image_dir(const char *state_dir, const char *name) {
        if (!name || strncmp(name, OCI_IMAGE_PREFIX, strlen(OCI_IMAGE_PREFIX)) != 0 ||
            strlen(name) != OCI_IMAGE_NAME_LEN)
                return NULL;
        for (const char *p = name + strlen(OCI_IMAGE_PREFIX); *p; p++)
                if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f'))
                        return NULL;
        char *p = NULL;
        return asprintf(&p, "%s/oci-images/%s", state_dir, name) < 0 ? NULL : p;
}

/* ---- running a tool ---- */

/* A tree's owner (the owner's name) and the bytes its rootfs holds, beside
 * it: what its collection reads. */
#define TREE_OWNER "owner"
#define TREE_BYTES "bytes"

static uint64_t walk_bytes;

static int walk_add(const char *p, const struct stat *st, int flag, struct FTW *f) {
        (void)p;
        (void)flag;
        (void)f;
        walk_bytes += (uint64_t)st->st_blocks * 512u;
        return 0;
}

static pthread_mutex_t walk_lock = PTHREAD_MUTEX_INITIALIZER;

/* The bytes a tree holds on disk (nftw's callback has no userdata). */
static uint64_t tree_bytes(const char *dir) {
        pthread_mutex_lock(&walk_lock);
        walk_bytes = 0;
        nftw(dir, walk_add, 16, FTW_PHYS | FTW_MOUNT);
        uint64_t n = walk_bytes;
        pthread_mutex_unlock(&walk_lock);
        return n;
}

/* The bytes of the rootfs under directory fd. */
static uint64_t tree_bytes_at(int fd) {
        char p[64];
        snprintf(p, sizeof p, "/proc/self/fd/%d/rootfs", fd);
        return tree_bytes(p);
}

typedef struct Tool {
        const char *sub;     /* its working directory under the pull's ("s" or "u") */
        const char *const *hidden; /* two directories hidden from it, or NULL entries */
        uid_t uid;           /* it runs as */
        const char *watch;   /* the pull's directory, whose bytes are bounded */
        uint64_t max_bytes;
        int64_t deadline_ms;
        int input_fd;        /* given as fd 3, or -1 */
        int out_fd;          /* its stdout, or -1: with stderr, kept in err */
        char err[ERR_KEEP];  /* the end of what it printed */
} Tool;

/* mount_setattr(2)'s argument (linux/mount.h's, which glibc's
 * sys/mount.h cannot be included with). */
struct MountAttr {
        uint64_t attr_set, attr_clr, propagation, userns_fd;
};
#define MOUNT_ATTR_RDONLY_ 0x00000001
#define AT_RECURSIVE_ 0x8000

/* Runs argv (an absolute path first) as t->uid in t->sub with a clean
 * environment; 0 when it exits 0, -EIO with its output in t->err when it
 * fails, -ETIMEDOUT or -EFBIG when it passed a bound and was killed. */
static int tool_run(Tool *t, char *const argv[]) {
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) < 0)
                return -errno;
        /* Paths as the tool sees them: the pull's directory is its /tmp. */
        char cwd[16], home[32], tmp[32];
        snprintf(cwd, sizeof cwd, "/tmp/%s", t->sub);
        snprintf(home, sizeof home, "HOME=/tmp/%s", t->sub);
        snprintf(tmp, sizeof tmp, "TMPDIR=/tmp/%s/tmp", t->sub);
        const char *tmpdir = tmp + strlen("TMPDIR=");
        char *const envp[] = { "PATH=/usr/bin:/bin", home, tmp, "LC_ALL=C", NULL };
        struct MountAttr ro = { .attr_set = MOUNT_ATTR_RDONLY_ }, rw = { .attr_clr = MOUNT_ATTR_RDONLY_ };
        pid_t pid = fork();
        if (pid < 0) {
                int r = -errno;
                close(pfd[0]);
                close(pfd[1]);
                return r;
        }
        if (pid == 0) {
                /* Async-signal-safe calls only, up to exec: other threads of
                 * the daemon may have held any lock at the fork. */
                sigset_t all;
                sigemptyset(&all);
                sigprocmask(SIG_SETMASK, &all, NULL);
                setpgid(0, 0);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (null < 0 || dup2(null, 0) < 0 || dup2(t->out_fd >= 0 ? t->out_fd : pfd[1], 1) < 0 ||
                    dup2(pfd[1], 2) < 0)
                        _exit(126);
                if (t->input_fd >= 0 && dup2(t->input_fd, 3) < 0)
                        _exit(126);
                /* The tools resolve their paths from / and the state
                 * directory's parents are root's alone: in a mount
                 * namespace of its own the pull's directory is its /tmp
                 * and its only writable place; the state and image
                 * directories (the sandboxes' files, the database, the
                 * trees, all of uid 100000's) are empty there, and every
                 * other mount is read-only. */
                /* The pull's directory first: a state directory under the
                 * host's /tmp is then gone with it, and one elsewhere is
                 * covered after. */
                if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
                    mount(t->watch, "/tmp", NULL, MS_BIND, NULL) < 0)
                        _exit(126);
                for (int i = 0; i < 2 && t->hidden; i++)
                        if (t->hidden[i] && mount("none", t->hidden[i], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                                                  "size=4k,mode=0755") < 0 && errno != ENOENT)
                                _exit(126);
                /* skopeo stages an archive's files in /var/tmp whatever
                 * TMPDIR says: that is the tool's tmp/ too. */
                if (mount(tmpdir, "/var/tmp", NULL, MS_BIND, NULL) < 0 ||
                    syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE_, &ro, sizeof ro) < 0 ||
                    syscall(SYS_mount_setattr, AT_FDCWD, "/tmp", 0, &rw, sizeof rw) < 0 ||
                    syscall(SYS_mount_setattr, AT_FDCWD, "/var/tmp", 0, &rw, sizeof rw) < 0 || chdir(cwd) < 0)
                        _exit(126);
                /* Root goes for good before the tool runs. */
                if (setgroups(0, NULL) < 0 || setresgid(t->uid, t->uid, t->uid) < 0 ||
                    setresuid(t->uid, t->uid, t->uid) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                        _exit(126);
                closefrom(t->input_fd >= 0 ? 4 : 3);
                execve(argv[0], argv, envp);
                _exit(127);
        }
        close(pfd[1]);
        size_t got = 0;
        int r = 0, status = 0;
        bool exited = false;
        int64_t next_walk = 0;
        for (;;) {
                struct pollfd p = { .fd = pfd[0], .events = POLLIN };
                int n = poll(&p, 1, 250);
                if (n > 0) {
                        char buf[1024];
                        ssize_t k = read(pfd[0], buf, sizeof buf);
                        if (k > 0) {
                                /* Keep the end: the cause is the last line. */
                                if (got + (size_t)k >= sizeof t->err) {
                                        size_t drop = got + (size_t)k - (sizeof t->err - 1);
                                        if (drop > got)
                                                drop = got;
                                        memmove(t->err, t->err + drop, got - drop);
                                        got -= drop;
                                }
                                size_t take = (size_t)k < sizeof t->err - 1 - got ? (size_t)k : sizeof t->err - 1 - got;
                                memcpy(t->err + got, buf + (size_t)k - take, take);
                                got += take;
                                t->err[got] = '\0';
                        } else if (k == 0) {
                                if (waitpid(pid, &status, 0) == pid)
                                        exited = true;
                                break;
                        }
                }
                int64_t now = (int64_t)time_now_mono_ms();
                if (now > t->deadline_ms) {
                        r = -ETIMEDOUT;
                        break;
                }
                if (now >= next_walk) {
                        next_walk = now + 500;
                        if (tree_bytes(t->watch) > t->max_bytes) {
                                r = -EFBIG;
                                break;
                        }
                }
        }
        close(pfd[0]);
        if (!exited) {
                kill(-pid, SIGKILL);
                kill(pid, SIGKILL);
                while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                        ;
        }
        if (r == 0 && tree_bytes(t->watch) > t->max_bytes)
                r = -EFBIG;
        if (r == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 126) {
                snprintf(t->err, sizeof t->err, "the daemon could not confine the pull's tools (a mount namespace "
                                                 "of their own, read-only mounts, no root)");
                r = -EIO;
        } else if (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
                r = -EIO;
        return r;
}

/* ---- reading what the tools wrote ---- */

/* A regular file beneath dirfd, no symbolic link on the way, at most max
 * bytes; NUL-terminated. */
static int read_beneath(int dirfd, const char *path, size_t max, char **ret, size_t *ret_len) {
        struct open_how how = { .flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW,
                                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
        _cleanup_close_ int fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADMSG;
        if ((uint64_t)st.st_size > max)
                return -EFBIG;
        char *buf = malloc((size_t)st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        size_t n = 0;
        int r = io_read_full(fd, buf, (size_t)st.st_size, &n);
        if (r < 0) {
                free(buf);
                return r;
        }
        buf[n] = '\0';
        *ret = buf;
        *ret_len = n;
        return 0;
}

static void sha256_hex(const void *data, size_t len, char out[65]) {
        uint8_t md[32];
        unsigned l = 0;
        EVP_Digest(data, len, md, &l, EVP_sha256(), NULL);
        hex_encode(md, 32, out);
}

static int read_blob(int dirfd, const char *digest, char **ret, size_t *ret_len) {
        if (!digest || !digest_ok(digest))
                return -EBADMSG;
        char p[128];
        snprintf(p, sizeof p, "s/layout/blobs/sha256/%s", digest + 7);
        int r = read_beneath(dirfd, p, BLOB_MAX, ret, ret_len);
        if (r < 0)
                return r;
        char hex[65];
        sha256_hex(*ret, *ret_len, hex);
        if (strcmp(hex, digest + 7) != 0) {
                free(*ret);
                *ret = NULL;
                return -EBADMSG;
        }
        return 0;
}

/* The OCI config's fields, as an image of ours records them. */
static json_t *config_of(json_t *oci) {
        json_t *c = json_object_get(oci, "config");
        json_t *out = json_pack("{s:{},s:{},s:[]}", "env", "labels", "exposedPorts");
        if (!out)
                return NULL;
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(c, "Env"), i, v) {
                const char *kv = json_string_value(v);
                const char *eq = kv ? strchr(kv, '=') : NULL;
                if (!eq || eq == kv || i >= 512 || strlen(kv) > 16384)
                        continue;
                char key[257];
                snprintf(key, sizeof key, "%.*s", (int)(eq - kv < 256 ? eq - kv : 256), kv);
                json_object_set_new(json_object_get(out, "env"), key, json_string(eq + 1));
        }
        const char *wd = json_string_value(json_object_get(c, "WorkingDir"));
        json_object_set_new(out, "workdir", json_string(wd && wd[0] == '/' && strlen(wd) < 4096 ? wd : "/"));
        /* The trees have two users, root and sandbox; an image's other user
         * runs as sandbox. */
        const char *user = json_string_value(json_object_get(c, "User"));
        bool root = !user || !*user || strcmp(user, "root") == 0 || strcmp(user, "0") == 0 ||
                    strncmp(user, "0:", 2) == 0 || strncmp(user, "root:", 5) == 0;
        json_object_set_new(out, "user", json_string(root ? "root" : "sandbox"));
        const char *arrays[][2] = { { "Cmd", "cmd" }, { "Entrypoint", "entrypoint" } };
        for (size_t k = 0; k < ELEMENTSOF(arrays); k++) {
                json_t *a = json_object_get(c, arrays[k][0]);
                if (json_is_array(a) && json_array_size(a) <= 256)
                        json_object_set(out, arrays[k][1], a);
        }
        /* Healthcheck.Test: ["CMD", argv...], ["CMD-SHELL", line] or
         * ["NONE"]; the command as a Dockerfile's HEALTHCHECK CMD gives it. */
        json_t *test = json_object_get(json_object_get(c, "Healthcheck"), "Test");
        const char *kind = json_string_value(json_array_get(test, 0));
        if (kind && json_array_size(test) >= 2 && json_array_size(test) <= 257) {
                json_t *hc = NULL;
                if (strcmp(kind, "CMD") == 0) {
                        hc = json_array();
                        for (size_t k = 1; hc && k < json_array_size(test); k++)
                                json_array_append(hc, json_array_get(test, k));
                } else if (strcmp(kind, "CMD-SHELL") == 0 && json_is_string(json_array_get(test, 1)))
                        hc = json_pack("[s,s,O]", "/bin/sh", "-c", json_array_get(test, 1));
                if (hc)
                        json_object_set_new(out, "healthcheck", hc);
        }
        const char *key;
        json_object_foreach(json_object_get(c, "Labels"), key, v) if (json_is_string(v) &&
                                                                         json_object_size(json_object_get(out, "labels")) < 256)
                json_object_set(json_object_get(out, "labels"), key, v);
        json_object_foreach(json_object_get(c, "ExposedPorts"), key, v) if (json_array_size(json_object_get(out, "exposedPorts")) < 256)
                json_array_append_new(json_object_get(out, "exposedPorts"), json_string(key));
        return out;
}

/* ---- the pull ---- */

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
}

/* What skopeo said, for the client: the registry's own words, without the
 * pull's paths. */
static void tool_failure(const Tool *t, const char *what, char *why, size_t len) {
        const char *e = t->err;
        if (strstr(e, "manifest unknown") || strstr(e, "name unknown") || strstr(e, "not found"))
                say(why, len, "%s: the registry has no such image", what);
        else if (strstr(e, "unauthorized") || strstr(e, "authentication required") || strstr(e, "denied"))
                say(why, len, "%s: the registry refused access; store its credentials with POST /v1/images/registries",
                    what);
        else if (strstr(e, "server gave HTTP response to HTTPS client"))
                say(why, len, "%s: the registry speaks plain HTTP, which the operator has not allowed for it "
                              "(--image-insecure-registry)", what);
        else {
                /* The last line, its last cause (after the last ": "). */
                char last[ERR_KEEP];
                snprintf(last, sizeof last, "%s", e);
                size_t n = strlen(last);
                while (n && (last[n - 1] == '\n' || last[n - 1] == ' '))
                        last[--n] = '\0';
                char *nl = strrchr(last, '\n');
                char *line = nl ? nl + 1 : last;
                char *cause = strstr(line, "level=fatal msg=");
                if (cause)
                        line = cause + 16;
                for (char *p = line; *p; p++)
                        if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\' || (unsigned char)*p >= 0x7f)
                                *p = ' ';
                while (*line == ' ')
                        line++;
                size_t l = strlen(line);
                say(why, len, "%s: the pull failed: %s", what, l > 300 ? line + l - 300 : *line ? line : "no cause given");
        }
}

static int make_owned_dir(int dirfd, const char *name, uid_t uid, mode_t mode) {
        if (mkdirat(dirfd, name, mode) < 0)
                return -errno;
        if (fchownat(dirfd, name, uid, uid, AT_SYMLINK_NOFOLLOW) < 0 || fchmodat(dirfd, name, mode, 0) < 0)
                return -errno;
        return 0;
}

static int write_auth(int dirfd, const OciRef *ref, const json_t *auth) {
        const char *u = json_string_value(json_object_get(auth, "username"));
        const char *p = json_string_value(json_object_get(auth, "password"));
        if (!u || !p)
                return -EINVAL;
        _cleanup_free_ char *plain = NULL;
        if (asprintf(&plain, "%s:%s", u, p) < 0)
                return -ENOMEM;
        size_t n = strlen(plain);
        _cleanup_free_ char *b64 = malloc(4 * ((n + 2) / 3) + 1);
        if (!b64)
                return -ENOMEM;
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)plain, (int)n);
        explicit_bzero(plain, n);
        _cleanup_json_ json_t *doc = json_pack("{s:{s:{s:s}}}", "auths", ref->registry, "auth", b64);
        explicit_bzero(b64, strlen(b64));
        _cleanup_free_ char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        if (!text)
                return -ENOMEM;
        int r = io_write_text_at(dirfd, "s/auth.json", text, true, 0600);
        explicit_bzero(text, strlen(text));
        if (r == 0 && fchownat(dirfd, "s/auth.json", PULL_UID, PULL_UID, AT_SYMLINK_NOFOLLOW) < 0)
                r = -errno;
        return r;
}

static bool insecure(const OciPullLimits *lim, const char *registry) {
        for (unsigned i = 0; i < lim->n_insecure; i++)
                if (strcmp(lim->insecure[i], registry) == 0)
                        return true;
        return false;
}

/* The archive, copied where the downloader may read it. */
static int stage_archive(int dirfd, const char *archive) {
        _cleanup_close_ int in = open(archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return -errno;
        _cleanup_close_ int out = openat(dirfd, "s/archive.tar", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0)
                return -errno;
        int r = io_copy_sparse(in, out);
        if (r == 0 && fchown(out, PULL_UID, PULL_UID) < 0)
                r = -errno;
        return r;
}

/* The image name of an owner's pull of a manifest. */
static void tree_name(const char *owner, const char *digest, char out[OCI_IMAGE_NAME_LEN + 1]) {
        _cleanup_free_ char *key = NULL;
        char hex[65] = "";
        if (asprintf(&key, "%s\n%s", owner, digest) >= 0)
                sha256_hex(key, strlen(key), hex);
        snprintf(out, OCI_IMAGE_NAME_LEN + 1, "%s%.60s", OCI_IMAGE_PREFIX, hex);
}

static int copy_step(Tool *t, int sfd, const OciPullLimits *lim, const OciRef *ref, const char *archive, const json_t *auth,
                     const char *what, char *why, size_t why_len) {
        char src[OCI_REF_MAX + 64];
        char *argv[16];
        int n = 0, r;
        argv[n++] = SKOPEO;
        argv[n++] = "--command-timeout";
        char tmo[32];
        snprintf(tmo, sizeof tmo, "%llds", (long long)(lim->timeout_ms / 1000 + 1));
        argv[n++] = tmo;
        argv[n++] = "copy";
        if (archive) {
                argv[n++] = "--retry-times=0";
                argv[n++] = src;
                argv[n++] = "oci:layout:img";
                argv[n] = NULL;
                /* An OCI layout archive, else what `docker save` writes. */
                snprintf(src, sizeof src, "oci-archive:archive.tar");
                if ((r = tool_run(t, argv)) != -EIO)
                        return r;
                path_remove_tree_at(sfd, "layout");
                snprintf(src, sizeof src, "docker-archive:archive.tar");
                if ((r = tool_run(t, argv)) == -EIO)
                        say(why, why_len, "%s: not an OCI layout archive nor a docker save archive", what);
                return r;
        }
        if ((r = oci_ref_transport(ref, src, sizeof src)) < 0)
                return r;
        argv[n++] = "--retry-times=1";
        argv[n++] = insecure(lim, ref->registry) ? "--src-tls-verify=false" : "--src-tls-verify=true";
        if (auth) {
                argv[n++] = "--src-authfile";
                argv[n++] = "auth.json";
        } else
                argv[n++] = "--src-no-creds";
        argv[n++] = src;
        argv[n++] = "oci:layout:img";
        argv[n] = NULL;
        r = tool_run(t, argv);
        if (r == -EIO)
                tool_failure(t, what, why, why_len);
        return r;
}

/* Whether the raw manifest the registry has under the digest asked for
 * (s/index.raw, what `skopeo inspect --raw` printed) is an index of that
 * digest naming the manifest skopeo chose for this platform. */
static bool index_lists(int dirfd, const char *asked, const char *chosen) {
        _cleanup_free_ char *raw = NULL;
        size_t len = 0;
        if (read_beneath(dirfd, "s/index.raw", BLOB_MAX, &raw, &len) < 0)
                return false;
        char hex[65];
        sha256_hex(raw, len, hex);
        if (strcmp(hex, asked + 7) != 0)
                return false;
        _cleanup_json_ json_t *index = json_loadb(raw, len, 0, NULL);
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(index, "manifests"), i, m) if (json_is_string(json_object_get(m, "digest")) &&
                                                                            strcmp(json_string_value(json_object_get(m, "digest")), chosen) == 0)
                return true;
        return false;
}

/* What the registry has under the digest asked for, as it is, into
 * s/index.raw: a multi-platform index's digest names no manifest of the
 * layout, and the index itself is checked against it (index_lists). */
static int fetch_raw(Tool *t, int sfd, const OciPullLimits *lim, const OciRef *ref, const json_t *auth,
                     const char *what, char *why, size_t why_len) {
        char src[OCI_REF_MAX + 64];
        int r = oci_ref_transport(ref, src, sizeof src);
        if (r < 0)
                return r;
        _cleanup_close_ int out = openat(sfd, "index.raw", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0)
                return -errno;
        char *argv[] = { SKOPEO, "inspect", "--raw", "--retry-times=1",
                         insecure(lim, ref->registry) ? "--tls-verify=false" : "--tls-verify=true",
                         auth ? "--authfile" : "--no-creds", auth ? "auth.json" : NULL, NULL, NULL };
        argv[auth ? 7 : 6] = src;
        t->out_fd = out;
        r = tool_run(t, argv);
        t->out_fd = -1;
        if (r == -EIO)
                tool_failure(t, what, why, why_len);
        return r;
}

/* The manifest the layout holds: its digest checked against the one asked
 * for and its own bytes, its layers counted, its config read. */
static int read_manifest(int dirfd, const OciRef *ref, OciPulled *p, const char *what, char *why, size_t why_len) {
        _cleanup_free_ char *text = NULL;
        size_t len = 0;
        int r = read_beneath(dirfd, "s/layout/index.json", 65536, &text, &len);
        _cleanup_json_ json_t *index = r == 0 ? json_loadb(text, len, 0, NULL) : NULL;
        json_t *m = json_array_get(json_object_get(index, "manifests"), 0);
        const char *digest = json_string_value(json_object_get(m, "digest"));
        if (!digest || !digest_ok(digest)) {
                say(why, why_len, "%s: the registry's answer was not an image", what);
                return -EBADMSG;
        }
        if (ref && ref->digest[0] && strcmp(ref->digest, digest) != 0 &&
            !index_lists(dirfd, ref->digest, digest)) {
                say(why, why_len, "%s: the registry gave manifest %s, not the digest asked for", what, digest);
                return -EBADMSG;
        }
        _cleanup_free_ char *mtext = NULL, *ctext = NULL;
        if (read_blob(dirfd, digest, &mtext, &len) < 0) {
                say(why, why_len, "%s: the image's manifest does not match its digest", what);
                return -EBADMSG;
        }
        _cleanup_json_ json_t *manifest = json_loadb(mtext, len, 0, NULL);
        json_t *layers = json_object_get(manifest, "layers");
        if (!json_is_array(layers)) {
                say(why, why_len, "%s: the image's manifest has no layers", what);
                return -EBADMSG;
        }
        if (json_array_size(layers) > OCI_LAYERS_MAX) {
                say(why, why_len, "%s: the image has %zu layers, more than the %u a pull takes", what,
                    json_array_size(layers), OCI_LAYERS_MAX);
                return -E2BIG;
        }
        size_t i;
        json_t *l;
        uint64_t size = 0;
        json_array_foreach(layers, i, l) {
                json_int_t s = json_integer_value(json_object_get(l, "size"));
                if (s > 0)
                        size += (uint64_t)s;
        }
        const char *cdigest = json_string_value(json_object_get(json_object_get(manifest, "config"), "digest"));
        if (read_blob(dirfd, cdigest, &ctext, &len) < 0) {
                say(why, why_len, "%s: the image's config does not match its digest", what);
                return -EBADMSG;
        }
        _cleanup_json_ json_t *config = json_loadb(ctext, len, 0, NULL);
        p->config = config ? config_of(config) : NULL;
        if (!p->config) {
                say(why, why_len, "%s: the image's config is not JSON", what);
                return -EBADMSG;
        }
        snprintf(p->digest, sizeof p->digest, "%s", digest);
        p->layers = (unsigned)json_array_size(layers);
        p->size_bytes = size;
        return 0;
}

/* The unpacked tree moved where sandboxes find it (an owner's second pull
 * of the same manifest finds it there). */
static int install_tree(int dirfd, const char *state_dir, const char *name, const char *owner) {
        _cleanup_free_ char *root = oci_images_dir(state_dir);
        _cleanup_free_ char *dir = oci_image_dir(state_dir, name);
        if (!root || !dir)
                return -ENOMEM;
        if (mkdir(root, 0711) < 0 && errno != EEXIST)
                return -errno;
        _cleanup_close_ int rootfd = open(root, O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (rootfd < 0)
                return -errno;
        /* Assembled beside, then renamed into place in one step. */
        char tmp[OCI_IMAGE_NAME_LEN + 32];
        uint32_t rnd = 0;
        random_bytes(&rnd, sizeof rnd);
        snprintf(tmp, sizeof tmp, ".%s.%08x", name, rnd);
        if (mkdirat(rootfd, tmp, 0711) < 0)
                return -errno;
        _cleanup_close_ int tfd = openat(rootfd, tmp, O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        char shift[16];
        snprintf(shift, sizeof shift, "%u\n", UNPACK_UID);
        int r = tfd < 0 ? -errno : 0;
        /* What umoci left is its: reached without a symbolic link, and
         * taken only when the root is a directory. */
        struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW,
                                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
        _cleanup_close_ int bfd = r == 0 ? (int)syscall(SYS_openat2, dirfd, "u/bundle", &how, sizeof how) : -1;
        struct stat st;
        if (r == 0 && (bfd < 0 || fstatat(bfd, "rootfs", &st, AT_SYMLINK_NOFOLLOW) < 0))
                r = -errno;
        else if (r == 0 && !S_ISDIR(st.st_mode))
                r = -ENOTDIR;
        if (r == 0 && renameat(bfd, "rootfs", tfd, "rootfs") < 0)
                r = -errno;
        /* Owned by the shifted root, and no host user can reach its set-id
         * files (as runtime-image-build leaves its trees). */
        if (r == 0 && (fchownat(tfd, "rootfs", UNPACK_UID, UNPACK_UID, AT_SYMLINK_NOFOLLOW) < 0 ||
                       fchmodat(tfd, "rootfs", 0700, AT_SYMLINK_NOFOLLOW) < 0))
                r = -errno;
        if (r == 0)
                r = io_write_text_at(tfd, "uid-shift", shift, true, 0644);
        /* Whose it is and what it holds: its collection reads them. */
        char bytes[24];
        snprintf(bytes, sizeof bytes, "%llu\n", (unsigned long long)tree_bytes_at(tfd));
        if (r == 0 && (r = io_write_text_at(tfd, TREE_OWNER, owner, true, 0600)) == 0)
                r = io_write_text_at(tfd, TREE_BYTES, bytes, true, 0600);
        if (r == 0 && renameat(rootfd, tmp, rootfd, name) < 0)
                r = errno == EEXIST || errno == ENOTEMPTY ? 0 : -errno; /* a pull beside this one won */
        path_remove_tree_at(rootfd, tmp);
        return r;
}

/* A tree kept from before trees named their owner, found again by a pull
 * of owner's: its name is made of the owner and the manifest's digest, so
 * it is owner's, and from now on collected as the owner's other trees.
 * Its bytes first: a crash between leaves it unowned, as it was. */
static void adopt_tree(const char *dest, const char *owner) {
        _cleanup_close_ int tfd = open(dest, O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (tfd < 0 || fstatat(tfd, TREE_OWNER, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
                return;
        char bytes[24];
        snprintf(bytes, sizeof bytes, "%llu\n", (unsigned long long)tree_bytes_at(tfd));
        if (io_write_text_at(tfd, TREE_BYTES, bytes, false, 0600) == 0 &&
            io_write_text_at(tfd, TREE_OWNER, owner, true, 0600) == 0)
                log_info(NULL, "pulled tree %s from before trees named their owner is now its owner's",
                         strrchr(dest, '/') ? strrchr(dest, '/') + 1 : dest);
}

void oci_pull_clean(const char *state_dir) {
        _cleanup_free_ char *pulls = NULL, *trees = oci_images_dir(state_dir);
        if (asprintf(&pulls, "%s/oci-pull", state_dir) >= 0)
                path_remove_tree_at(AT_FDCWD, pulls);
        DIR *d = trees ? opendir(trees) : NULL;
        if (!d)
                return;
        struct dirent *e;
        while ((e = readdir(d)))
                if (e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                        path_remove_tree_at(dirfd(d), e->d_name);
        closedir(d);
}

int oci_pull(const char *state_dir, const OciPullLimits *lim, const char *owner, const char *ref_s, const char *archive,
             const json_t *auth, OciPulled *ret, char *why, size_t why_len) {
        OciRef ref;
        const char *what = archive ? "the archive" : ref_s;
        say(why, why_len, "%s: the pull failed", what);
        if (!archive && oci_ref_parse(ref_s, &ref) < 0) {
                say(why, why_len, "%.128s is not an image reference (registry/repository:tag or @sha256:digest)",
                    ref_s);
                return -EINVAL;
        }
        _cleanup_free_ char *pulls = NULL, *work = NULL;
        if (asprintf(&pulls, "%s/oci-pull", state_dir) < 0 || asprintf(&work, "%s/XXXXXX", pulls) < 0)
                return -ENOMEM;
        if (mkdir(pulls, 0711) < 0 && errno != EEXIST)
                return -errno;
        if (!mkdtemp(work))
                return -errno;
        OciPulled p = { 0 };
        _cleanup_close_ int dirfd = -1, sfd = -1;
        _cleanup_free_ char *dest = NULL;
        int r = chmod(work, 0711) < 0 ? -errno : 0;
        if (r == 0 && (dirfd = open(work, O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0)
                r = -errno;
        /* s/ is the downloader's, u/ the unpacker's; each has its tmp/. */
        if (r == 0 && ((r = make_owned_dir(dirfd, "s", PULL_UID, 0711)) < 0 ||
                       (r = make_owned_dir(dirfd, "s/tmp", PULL_UID, 0700)) < 0 ||
                       (r = make_owned_dir(dirfd, "u", UNPACK_UID, 0700)) < 0 ||
                       (r = make_owned_dir(dirfd, "u/tmp", UNPACK_UID, 0700)) < 0))
                goto done;
        if (r == 0 && auth && (r = write_auth(dirfd, &ref, auth)) < 0) {
                say(why, why_len, "%s: the registry's stored credentials are not usable", what);
                goto done;
        }
        if (r == 0 && archive && (r = stage_archive(dirfd, archive)) < 0)
                goto done;
        if (r == 0 && (sfd = openat(dirfd, "s", O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0)
                r = -errno;
        if (r < 0)
                goto done;
        int64_t t0 = (int64_t)time_now_mono_ms();
        Tool down = { .sub = "s", .hidden = lim->hidden, .uid = PULL_UID, .watch = work, .max_bytes = lim->max_bytes,
                      .deadline_ms = t0 + lim->timeout_ms, .input_fd = -1, .out_fd = -1 };
        r = copy_step(&down, sfd, lim, archive ? NULL : &ref, archive, auth, what, why, why_len);
        if (r == -ETIMEDOUT)
                say(why, why_len, "%s: the download passed its time of %lld s", what, (long long)(lim->timeout_ms / 1000));
        else if (r == -EFBIG)
                say(why, why_len, "%s: the image is larger than the %llu MiB a pull may take", what,
                    (unsigned long long)(lim->max_bytes >> 20));
        if (r < 0)
                goto done;
        if (!archive && ref.digest[0] && (r = fetch_raw(&down, sfd, lim, &ref, auth, what, why, why_len)) < 0)
                goto done;
        path_remove_tree_at(dirfd, "s/auth.json");
        path_remove_tree_at(dirfd, "s/archive.tar");
        if ((r = read_manifest(dirfd, archive ? NULL : &ref, &p, what, why, why_len)) < 0)
                goto done;
        tree_name(owner, p.digest, p.name);
        dest = oci_image_dir(state_dir, p.name);
        char rootfs[PATH_MAX];
        struct stat st;
        if (!dest || path_join(rootfs, sizeof rootfs, dest, "rootfs") < 0) {
                r = -ENOMEM;
                goto done;
        }
        if (stat(rootfs, &st) == 0 && S_ISDIR(st.st_mode)) {
                p.reused = true;
                adopt_tree(dest, owner);
                goto done;
        }
        Tool unpack = { .sub = "u", .hidden = lim->hidden, .uid = UNPACK_UID, .watch = work, .max_bytes = lim->max_bytes,
                        .deadline_ms = (int64_t)time_now_mono_ms() + lim->timeout_ms, .input_fd = -1, .out_fd = -1 };
        char *uargv[] = { UMOCI, "unpack", "--rootless", "--image", "../s/layout:img", "bundle", NULL };
        r = tool_run(&unpack, uargv);
        if (r == -ETIMEDOUT)
                say(why, why_len, "%s: unpacking passed its time of %lld s", what, (long long)(lim->timeout_ms / 1000));
        else if (r == -EFBIG)
                say(why, why_len, "%s: the image unpacked is larger than the %llu MiB a pull may take", what,
                    (unsigned long long)(lim->max_bytes >> 20));
        else if (r == -EIO)
                tool_failure(&unpack, what, why, why_len);
        if (r == 0 && (r = install_tree(dirfd, state_dir, p.name, owner)) < 0)
                say(why, why_len, "%s: the unpacked image could not be kept", what);
done:
        path_remove_tree_at(AT_FDCWD, work);
        if (r < 0) {
                oci_pulled_done(&p);
                return r;
        }
        /* A use: the tree is the owner's most recently used. */
        if (dest)
                (void)utimensat(AT_FDCWD, dest, NULL, 0);
        *ret = p;
        return 0;
}

/* ---- collecting trees (docs/images.md, "Images from registries") ---- */

typedef struct Tree {
        char name[OCI_IMAGE_NAME_LEN + 1];
        uint64_t bytes;
        int64_t used; /* the directory's mtime: its last pull */
} Tree;

static int tree_cmp(const void *a, const void *b) {
        const Tree *x = a, *y = b;
        return x->used != y->used ? (x->used < y->used ? -1 : 1) : strcmp(x->name, y->name);
}

int oci_trees_owners(const char *state_dir, OciTreeOwnerFn fn, void *userdata) {
        _cleanup_free_ char *root = oci_images_dir(state_dir);
        if (!root)
                return -ENOMEM;
        DIR *d = opendir(root);
        if (!d)
                return errno == ENOENT ? 0 : -errno;
        struct dirent *e;
        while ((e = readdir(d))) {
                _cleanup_free_ char *dir = oci_image_dir(state_dir, e->d_name);
                char path[PATH_MAX], who[256] = "";
                if (dir && path_join(path, sizeof path, dir, TREE_OWNER) == 0 && io_read_text(path, who, sizeof who) >= 0 &&
                    who[0])
                        fn(userdata, who);
        }
        closedir(d);
        return 0;
}

int oci_trees_collect(const char *state_dir, const char *owner, uint64_t max_bytes, unsigned max_trees,
                      OciTreeInUseFn in_use, void *userdata) {
        _cleanup_free_ char *root = oci_images_dir(state_dir);
        if (!root)
                return -ENOMEM;
        DIR *d = opendir(root);
        if (!d)
                return errno == ENOENT ? 0 : -errno;
        Tree *trees = NULL;
        size_t n = 0;
        uint64_t total = 0;
        int r = 0;
        struct dirent *e;
        while ((e = readdir(d)) && r == 0) {
                _cleanup_free_ char *dir = oci_image_dir(state_dir, e->d_name);
                char path[PATH_MAX], who[256] = "", bytes[32] = "";
                struct stat st;
                /* A tree pulled before trees named their owner is not
                 * known to be this owner's: it stays. */
                if (!dir || path_join(path, sizeof path, dir, TREE_OWNER) < 0 || io_read_text(path, who, sizeof who) < 0 ||
                    strcmp(who, owner) != 0 || stat(dir, &st) < 0)
                        continue;
                if (path_join(path, sizeof path, dir, TREE_BYTES) < 0 || io_read_text(path, bytes, sizeof bytes) < 0)
                        bytes[0] = '\0';
                Tree *t = realloc(trees, (n + 1) * sizeof(*t));
                if (!t) {
                        r = -ENOMEM;
                        break;
                }
                trees = t;
                t = &trees[n++];
                snprintf(t->name, sizeof t->name, "%.*s", OCI_IMAGE_NAME_LEN, e->d_name);
                t->bytes = strtoull(bytes, NULL, 10);
                t->used = (int64_t)st.st_mtim.tv_sec;
                total += t->bytes;
        }
        closedir(d);
        if (r == 0 && n)
                qsort(trees, n, sizeof *trees, tree_cmp);
        size_t count = n;
        for (size_t i = 0; r == 0 && i < n && (total > max_bytes || count > max_trees); i++) {
                if (in_use(userdata, trees[i].name))
                        continue;
                /* Out of its name first, in one rename: a crash in the
                 * removal leaves a dot name, which a start removes. */
                char gone[OCI_IMAGE_NAME_LEN + 8];
                snprintf(gone, sizeof gone, ".%s.gone", trees[i].name);
                _cleanup_close_ int rfd = open(root, O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (rfd < 0 || renameat(rfd, trees[i].name, rfd, gone) < 0)
                        continue;
                path_remove_tree_at(rfd, gone);
                log_info(NULL, "pulled tree %s removed: nothing uses it and its owner's trees passed their bound",
                         trees[i].name);
                total -= trees[i].bytes;
                count--;
        }
        free(trees);
        return r;
}
