#pragma once
/* A SQLite store kind's test fixture: a temporary directory with the
 * database's path in it, made before each test and removed after. Define
 * STORE_TMPDIR_PREFIX (a string: "/tmp/store-NAME-") before including. */
#include <stdio.h>
#include <stdlib.h>

typedef struct Fixture {
        char dir[64];
        char path[96];
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        snprintf(f->dir, sizeof(f->dir), "%sXXXXXX", STORE_TMPDIR_PREFIX);
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/runtime.db", f->dir);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
        if (system(cmd) != 0)
                return -1;
        free(f);
        return 0;
}
