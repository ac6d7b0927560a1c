/* runtime sandbox port-forward's [LOCAL:]REMOTE. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cli/portfwd.h"

static void test_port_spec(void **state) {
        unsigned l = 1, r = 1;
        assert_int_equal(cli_parse_port_spec("8000", &l, &r), 0);
        assert_true(l == 8000 && r == 8000);
        assert_int_equal(cli_parse_port_spec("0:8000", &l, &r), 0);
        assert_true(l == 0 && r == 8000);
        assert_int_equal(cli_parse_port_spec("18080:80", &l, &r), 0);
        assert_true(l == 18080 && r == 80);
        static const char *const bad[] = { "", "0", ":80", "80:", "65536", "1:65536", "-1", "80:0", "a:80",
                                           "80:80:80", "000008000", " 80", "80 " };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(cli_parse_port_spec(bad[i], &l, &r), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = { cmocka_unit_test(test_port_spec) };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
