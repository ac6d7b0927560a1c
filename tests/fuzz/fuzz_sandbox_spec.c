/* Arbitrary bytes as a stored sandbox spec through the model's codec: a
 * row of the database is input too (a newer daemon's, a corrupt one). What
 * decodes must encode again and decode to the same spec. The first byte
 * is the row's spec version. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/sandbox_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        int64_t version = (int64_t)(data[0] % 4);
        char *text = strndup((const char *)data + 1, size - 1);
        if (!text)
                return 0;
        SandboxSpec s;
        char why[256];
        if (sandbox_spec_decode(text, version, &s, why, sizeof why) == 0) {
                char *again = sandbox_spec_encode(&s);
                if (again) {
                        SandboxSpec t;
                        if (sandbox_spec_decode(again, SANDBOX_SPEC_VERSION, &t, why, sizeof why) != 0)
                                abort();
                        char *third = sandbox_spec_encode(&t);
                        if (!third || strcmp(again, third) != 0)
                                abort();
                        free(third);
                        sandbox_spec_done(&t);
                        free(again);
                }
                sandbox_spec_done(&s);
        }
        free(text);
        return 0;
}
