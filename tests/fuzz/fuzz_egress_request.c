/* Proxy request heads and bodies as a sandbox may send them, in arbitrary
 * pieces: the head/body split must hold whatever the chunking. */
#include <stdint.h>
#include <string.h>

#include "egress/httphead.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        /* The first byte picks the chunk size. */
        size_t step = (size_t)data[0] % 64 + 1;
        data++;
        size--;
        EgressParser *p = egress_parser_new();
        if (!p)
                return 0;
        size_t off = 0;
        char err[128];
        while (off < size) {
                size_t n = size - off < step ? size - off : step, used = 0;
                int r = egress_parser_feed(p, data + off, n, &used, err, sizeof(err));
                if (used > n)
                        __builtin_trap();
                if (r < 0 || r == EGRESS_PARSE_DONE)
                        break;
                if (r == EGRESS_PARSE_HEAD) {
                        const EgressHead *h = egress_parser_head(p);
                        if (!h || h->port == 0 || h->host[0] == '\0')
                                __builtin_trap();
                        if (h->is_connect)
                                break;
                }
                off += used;
                if (used == 0 && r == EGRESS_PARSE_MORE)
                        break;
        }
        egress_parser_free(p);
        return 0;
}
