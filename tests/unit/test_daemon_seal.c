/* Sealed values (daemon/egress/egress_seal.h): what opens, and what does
 * not: another key, another row, a change, text that is not sealed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/egress/egress_seal.h"

static const uint8_t KEY[SEAL_KEY_LEN] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                           17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32 };

static void test_round_trip_and_refusals(void **state) {
        const char *values[] = { "", "s3cret", "a value with spaces and ünïcode", NULL };
        for (size_t i = 0; values[i]; i++) {
                char *sealed = NULL, *plain = NULL;
                assert_int_equal(seal_encrypt(KEY, "egress-secret/alice/TOKEN", values[i], &sealed), 0);
                assert_true(seal_is_sealed(sealed));
                assert_null(strstr(sealed + strlen(SEAL_PREFIX), "s3cret"));
                assert_int_equal(seal_decrypt(KEY, "egress-secret/alice/TOKEN", sealed, &plain), 0);
                assert_string_equal(plain, values[i]);
                free(plain);
                /* Another row, another key: it does not open. */
                assert_int_equal(seal_decrypt(KEY, "egress-secret/bob/TOKEN", sealed, &plain), -EBADMSG);
                uint8_t other[SEAL_KEY_LEN];
                memcpy(other, KEY, sizeof(other));
                other[0] ^= 1;
                assert_int_equal(seal_decrypt(other, "egress-secret/alice/TOKEN", sealed, &plain), -EBADMSG);
                /* A changed byte anywhere does not open (the last group of
                 * base64 left out: its low bits may be padding). */
                size_t end = strlen(sealed) - 4;
                for (size_t j = strlen(SEAL_PREFIX); j < end; j++) {
                        char saved = sealed[j];
                        sealed[j] = saved == 'A' ? 'B' : 'A';
                        assert_int_not_equal(seal_decrypt(KEY, "egress-secret/alice/TOKEN", sealed, &plain), 0);
                        sealed[j] = saved;
                }
                free(sealed);
        }
        /* Two seals of one value differ (a fresh nonce each). */
        char *a = NULL, *b = NULL;
        assert_int_equal(seal_encrypt(KEY, "x", "same", &a), 0);
        assert_int_equal(seal_encrypt(KEY, "x", "same", &b), 0);
        assert_string_not_equal(a, b);
        free(a);
        free(b);
}

static void test_text_that_is_not_sealed(void **state) {
        char *plain = NULL;
        const char *bad[] = { "plain", "sealed:v1:", "sealed:v1:@@@@", "sealed:v1:QUJD", "sealed:v2:QUJDRA==",
                              "sealed:v1:" "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB", NULL };
        for (size_t i = 0; bad[i]; i++)
                assert_int_equal(seal_decrypt(KEY, "x", bad[i], &plain), -EBADMSG);
        assert_false(seal_is_sealed("plain"));
        char *big = malloc(SEAL_MAX_PLAIN + 2), *out = NULL;
        memset(big, 'x', SEAL_MAX_PLAIN + 1);
        big[SEAL_MAX_PLAIN + 1] = '\0';
        assert_int_equal(seal_encrypt(KEY, "x", big, &out), -E2BIG);
        free(big);
}

static void test_key_text(void **state) {
        uint8_t k[SEAL_KEY_LEN];
        assert_int_equal(seal_key_parse("0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20\n", k), 0);
        assert_memory_equal(k, KEY, SEAL_KEY_LEN);
        assert_int_equal(seal_key_parse("0102", k), -EINVAL);
        assert_int_equal(seal_key_parse("zz02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20", k), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_round_trip_and_refusals),
                cmocka_unit_test(test_text_that_is_not_sealed),
                cmocka_unit_test(test_key_text),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
