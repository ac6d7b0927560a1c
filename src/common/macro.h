#pragma once
/* Cleanup helpers in the manner of systemd: a variable declared with one of
 * these is released when it goes out of scope; TAKE_PTR/TAKE_FD hand
 * ownership on. Every destructor accepts NULL / -1. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))

#define TAKE_PTR(p)                                                                                         \
        ({                                                                                                  \
                __typeof__(p) _p_ = (p);                                                                    \
                (p) = NULL;                                                                                 \
                _p_;                                                                                        \
        })
#define TAKE_FD(fd)                                                                                         \
        ({                                                                                                  \
                int _fd_ = (fd);                                                                            \
                (fd) = -1;                                                                                  \
                _fd_;                                                                                       \
        })

static inline void freep(void *p) {
        free(*(void **)p);
}
static inline void closep(int *fd) {
        if (*fd >= 0) {
                int saved = errno;
                close(*fd);
                errno = saved;
        }
}
static inline void fclosep(FILE **f) {
        if (*f)
                fclose(*f);
}
/* A child pid that is killed and reaped when it goes out of scope. */
static inline void sigkill_waitp(pid_t *pid) {
        if (*pid > 0) {
                kill(*pid, SIGKILL);
                while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        }
}
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_fclose_ _cleanup_(fclosep)
#define _cleanup_sigkill_wait_ _cleanup_(sigkill_waitp)


/* FNV-1a, 64 bits: a string's is fnv1a64_str(FNV1A64_INIT, s); chain calls
 * for several. Not for anything a client could aim collisions at with harm. */
#define FNV1A64_INIT 14695981039346656037ull
static inline uint64_t fnv1a64_byte(uint64_t h, uint8_t b) {
        return (h ^ b) * 1099511628211ull;
}
static inline uint64_t fnv1a64_str(uint64_t h, const char *s) {
        for (; s && *s; s++)
                h = fnv1a64_byte(h, (uint8_t)*s);
        return h;
}
