#pragma once
/* runtimed's log in systemd's journal, with structured fields: under a unit
 * whose stderr is the journal (JOURNAL_STREAM names it), each line is sent
 * with sd_journal_send, its PRIORITY from its level and, where the line has
 * them, REQUEST_ID and SANDBOX_ID, so that `journalctl REQUEST_ID=req_...`
 * or `SANDBOX_ID=sbx_...` finds every line of a request or a sandbox.
 * Elsewhere the log stays on stderr as it is. */
#include <stdbool.h>
#include <stddef.h>

#define JOURNAL_SANDBOX_ID_LEN 24 /* "sbx_" + 20 hex digits */

/* Whether stderr is the journal's stream (JOURNAL_STREAM="DEV:INODE" of
 * fd 2), and if so the log's sink set to the journal. */
bool journal_log_setup(void);

/* The first sandbox id a line names, into ret (JOURNAL_SANDBOX_ID_LEN + 1
 * bytes); false when it names none. */
bool journal_sandbox_id(const char *msg, char ret[JOURNAL_SANDBOX_ID_LEN + 1]);
