/* The journal's fields of a log line, the log's sink, and when the daemon
 * sends its log to the journal. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/journal.h"

static void sandbox_ids(void **state) {
        char id[JOURNAL_SANDBOX_ID_LEN + 1];
        assert_true(journal_sandbox_id("stopping sbx_0123456789abcdef0123: lease over", id));
        assert_string_equal(id, "sbx_0123456789abcdef0123");
        assert_true(journal_sandbox_id("sbx_00000000000000000000", id));
        assert_string_equal(id, "sbx_00000000000000000000");
        /* The first whole id, not a prefix or a longer word. */
        assert_true(journal_sandbox_id("sbx_0123 then xsbx_11111111111111111111 then sbx_22222222222222222222.",
                                       id));
        assert_string_equal(id, "sbx_22222222222222222222");
        assert_false(journal_sandbox_id("sbx_0123456789abcdef01234 is too long", id));
        assert_false(journal_sandbox_id("sbx_0123456789ABCDEF0123 is not ours", id));
        assert_false(journal_sandbox_id("no id here", id));
        assert_false(journal_sandbox_id("", id));
        assert_false(journal_sandbox_id(NULL, id));
}

static LogLevel seen_level;
static char seen_rid[64], seen_msg[256];
static int seen;

static void capture(LogLevel l, const char *rid, const char *msg) {
        seen_level = l;
        snprintf(seen_rid, sizeof seen_rid, "%s", rid ? rid : "-");
        snprintf(seen_msg, sizeof seen_msg, "%s", msg);
        seen++;
}

static void sink_takes_the_formatted_line(void **state) {
        log_set_sink(capture);
        log_msg(LOG_WARN, "req_1", "a %s\nb", "two-line");
        log_debug(NULL, "below the level: not sent");
        log_set_sink(NULL);
        assert_int_equal(seen, 1);
        assert_int_equal(seen_level, LOG_WARN);
        assert_string_equal(seen_rid, "req_1");
        assert_string_equal(seen_msg, "a two-line b");
}

static void setup_only_on_the_journal_stream(void **state) {
        unsetenv("JOURNAL_STREAM");
        assert_false(journal_log_setup());
        setenv("JOURNAL_STREAM", "1:2", 1);
        assert_false(journal_log_setup());
        setenv("JOURNAL_STREAM", "garbage", 1);
        assert_false(journal_log_setup());
        struct stat st;
        assert_int_equal(fstat(STDERR_FILENO, &st), 0);
        char v[64];
        snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
        setenv("JOURNAL_STREAM", v, 1);
        assert_true(journal_log_setup());
        /* Without a journal to take it, a line is dropped, never a crash. */
        log_error("req_2", "sandbox sbx_0123456789abcdef0123 failed");
        log_set_sink(NULL);
        unsetenv("JOURNAL_STREAM");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(sandbox_ids),
                cmocka_unit_test(sink_takes_the_formatted_line),
                cmocka_unit_test(setup_only_on_the_journal_stream),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
