#pragma once
/* What every backend's previews kind keeps (store_previews.h), run on a
 * fresh handle by each backend's test. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_previews.h"

static inline StorePreview preview_row(const char *sandbox_id, unsigned port, bool public, const char *secret,
                                       int64_t expires_at) {
        StorePreview p = { .port = port, .public = public, .created_at = 100, .rotated_at = 100,
                           .expires_at = expires_at };
        snprintf(p.sandbox_id, sizeof p.sandbox_id, "%s", sandbox_id);
        snprintf(p.owner, sizeof p.owner, "%s", "alice");
        snprintf(p.secret, sizeof p.secret, "%s", secret);
        return p;
}

static inline void previews_contract(const StorePreviewOps *ops, StorePreviews *h) {
        StorePreview got, p = preview_row("sbx_a", 8000, false, "sealed-1", 0);
        assert_int_equal(ops->get(h, "sbx_a", 8000, &got), -ENOENT);
        assert_int_equal(ops->put(h, &p, false, &got), 0);
        assert_string_equal(got.sandbox_id, "sbx_a");
        assert_string_equal(got.owner, "alice");
        assert_string_equal(got.secret, "sealed-1");
        assert_int_equal(got.port, 8000);
        assert_false(got.public);
        assert_int_equal(got.expires_at, 0);
        /* A put of a shared port changes its visibility and end, never its
         * secret: its tokens stay valid. */
        StorePreview again = preview_row("sbx_a", 8000, true, "sealed-2", 500);
        assert_int_equal(ops->put(h, &again, false, &got), 0);
        assert_true(got.public);
        assert_int_equal(got.expires_at, 500);
        assert_string_equal(got.secret, "sealed-1");
        /* Another port and another sandbox are rows of their own. */
        StorePreview other = preview_row("sbx_a", 3000, false, "sealed-3", 0);
        StorePreview theirs = preview_row("sbx_b", 8000, false, "sealed-4", 0);
        assert_int_equal(ops->put(h, &other, false, &got), 0);
        assert_int_equal(ops->put(h, &theirs, false, &got), 0);
        StorePreview *all = NULL;
        size_t n = 0;
        assert_int_equal(ops->list(h, "sbx_a", &all, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(all[0].port, 3000); /* by port */
        assert_int_equal(all[1].port, 8000);
        free(all);
        /* A rotation replaces the secret, of that row only. */
        assert_int_equal(ops->rotate(h, "sbx_a", 8000, "sealed-5", 200), 0);
        assert_int_equal(ops->get(h, "sbx_a", 8000, &got), 0);
        assert_string_equal(got.secret, "sealed-5");
        assert_int_equal(got.rotated_at, 200);
        assert_int_equal(ops->get(h, "sbx_b", 8000, &got), 0);
        assert_string_equal(got.secret, "sealed-4");
        assert_int_equal(ops->rotate(h, "sbx_a", 9999, "x", 1), -ENOENT);
        /* Removing one port, then every preview of a sandbox. */
        assert_int_equal(ops->remove(h, "sbx_a", 3000), 0);
        assert_int_equal(ops->remove(h, "sbx_a", 3000), -ENOENT);
        assert_int_equal(ops->remove(h, "sbx_a", 0), 0);
        assert_int_equal(ops->list(h, "sbx_a", &all, &n), 0);
        assert_int_equal(n, 0);
        free(all);
        assert_int_equal(ops->get(h, "sbx_b", 8000, &got), 0);
        assert_string_equal(got.embed_origins, "");
        /* The sites that may frame a preview: set on a new row even
         * without set_embed (its value is the row's), replaced by a put
         * that sets them, kept by one that does not. */
        StorePreview framed = preview_row("sbx_c", 8000, true, "sealed-6", 0);
        snprintf(framed.embed_origins, sizeof framed.embed_origins, "%s", "https://app.example.com");
        assert_int_equal(ops->put(h, &framed, false, &got), 0);
        assert_string_equal(got.embed_origins, "https://app.example.com");
        snprintf(framed.embed_origins, sizeof framed.embed_origins, "%s",
                 "https://a.example.com\nhttps://*.example.org:8443");
        assert_int_equal(ops->put(h, &framed, true, &got), 0);
        assert_string_equal(got.embed_origins, "https://a.example.com\nhttps://*.example.org:8443");
        StorePreview changed = preview_row("sbx_c", 8000, false, "sealed-7", 0);
        assert_int_equal(ops->put(h, &changed, false, &got), 0);
        assert_false(got.public);
        assert_string_equal(got.embed_origins, "https://a.example.com\nhttps://*.example.org:8443");
        assert_int_equal(ops->list(h, "sbx_c", &all, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(all[0].embed_origins, "https://a.example.com\nhttps://*.example.org:8443");
        free(all);
        assert_int_equal(ops->put(h, &changed, true, &got), 0);
        assert_string_equal(got.embed_origins, "");
}
