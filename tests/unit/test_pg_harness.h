#pragma once
/* The PostgreSQL backend's unit tests run against the server the suite
 * starts (tests/integration/helpers/postgres.py), whose URL comes in
 * RUNTIME_TEST_PG_URL; without it they skip, saying so. Each test gets a
 * schema of its own, made empty, through its URL's search_path. */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

/* The URL of a fresh schema named name, malloc'ed; skips the test when
 * there is no server. */
static inline char *pg_fresh(const char *name) {
        const char *base = getenv("RUNTIME_TEST_PG_URL");
        if (!base || !*base) {
                printf("RUNTIME_TEST_PG_URL is not set: no PostgreSQL server to test against\n");
                skip();
        }
        PGconn *c = PQconnectdb(base);
        assert_int_equal(PQstatus(c), CONNECTION_OK);
        PGresult *quiet = PQexec(c, "SET client_min_messages = warning");
        PQclear(quiet);
        char sql[256];
        snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", name, name);
        PGresult *r = PQexec(c, sql);
        assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
        PQclear(r);
        PQfinish(c);
        char *url = NULL;
        assert_true(asprintf(&url, "%s%soptions=-csearch_path%%3D%s", base, strchr(base, '?') ? "&" : "?", name) > 0);
        return url;
}
