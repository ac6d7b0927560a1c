#include "daemon/journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Before sd-journal.h: it includes syslog.h, whose LOG_INFO and LOG_DEBUG
 * macros would rename the log's levels. */
#include "common/log.h"

#include <systemd/sd-journal.h>

bool journal_sandbox_id(const char *msg, char ret[JOURNAL_SANDBOX_ID_LEN + 1]) {
        for (const char *p = msg ? strstr(msg, "sbx_") : NULL; p; p = strstr(p + 1, "sbx_")) {
                size_t n = 0;
                while (n < 20 && ((p[4 + n] >= '0' && p[4 + n] <= '9') || (p[4 + n] >= 'a' && p[4 + n] <= 'f')))
                        n++;
                /* An id is whole: not the start of a longer word. */
                bool whole = n == 20 && !((p[24] >= '0' && p[24] <= '9') || (p[24] >= 'a' && p[24] <= 'z') ||
                                          (p[24] >= 'A' && p[24] <= 'Z') || p[24] == '_');
                if (whole && (p == msg || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                            (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9')))) {
                        memcpy(ret, p, JOURNAL_SANDBOX_ID_LEN);
                        ret[JOURNAL_SANDBOX_ID_LEN] = '\0';
                        return true;
                }
        }
        return false;
}

static void journal_sink(LogLevel l, const char *rid, const char *msg) {
        /* syslog(3)'s priorities, by number: its header's names clash with
         * the log's levels. err 3, warning 4, info 6, debug 7. */
        static const int priority[] = { 3, 4, 6, 7 };
        char sid[JOURNAL_SANDBOX_ID_LEN + 1];
        bool has_sid = journal_sandbox_id(msg, sid);
        int p = priority[(unsigned)l < 4 ? (unsigned)l : 3];
        /* sd_journal_send ends its list at the first NULL: the optional
         * fields go last. */
        if (rid && has_sid)
                sd_journal_send("MESSAGE=%s", msg, "PRIORITY=%d", p, "SYSLOG_IDENTIFIER=runtimed", "REQUEST_ID=%s", rid,
                                "SANDBOX_ID=%s", sid, NULL);
        else if (rid)
                sd_journal_send("MESSAGE=%s", msg, "PRIORITY=%d", p, "SYSLOG_IDENTIFIER=runtimed", "REQUEST_ID=%s", rid,
                                NULL);
        else if (has_sid)
                sd_journal_send("MESSAGE=%s", msg, "PRIORITY=%d", p, "SYSLOG_IDENTIFIER=runtimed", "SANDBOX_ID=%s", sid,
                                NULL);
        else
                sd_journal_send("MESSAGE=%s", msg, "PRIORITY=%d", p, "SYSLOG_IDENTIFIER=runtimed", NULL);
}

bool journal_log_setup(void) {
        const char *stream = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;
        if (!stream || sscanf(stream, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0 ||
            (unsigned long long)st.st_dev != dev || (unsigned long long)st.st_ino != ino)
                return false;
        log_set_sink(journal_sink);
        return true;
}
