/* Operator public ranges: strict parsing, what a range may never cover, and
 * the per-connection admission that holds whatever the ranges say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/cidr.h"

static struct sockaddr_storage addr_of(const char *text) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        if (strchr(text, ':')) {
                struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
                in6->sin6_family = AF_INET6;
                assert_int_equal(inet_pton(AF_INET6, text, &in6->sin6_addr), 1);
        } else {
                struct sockaddr_in *in = (struct sockaddr_in *)&ss;
                in->sin_family = AF_INET;
                assert_int_equal(inet_pton(AF_INET, text, &in->sin_addr), 1);
        }
        return ss;
}

static void test_parse_accepts(void **state) {
        static const struct {
                const char *in, *out;
        } ok[] = {
                { "203.0.113.0/24", "203.0.113.0/24" },  { "203.0.113.80", "203.0.113.80/32" },
                { "203.0.113.80/32", "203.0.113.80/32" }, { "10.0.0.0/8", "10.0.0.0/8" },
                { "0.0.0.0/0", "0.0.0.0/0" },             { "2001:db8:5::/48", "2001:db8:5::/48" },
                { "2001:DB8::1", "2001:db8::1/128" },     { "::/0", "::/0" },
        };
        for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
                EgressCidr c;
                char buf[80];
                if (egress_cidr_parse(ok[i].in, &c) != 0)
                        fail_msg("%s refused", ok[i].in);
                assert_int_equal(egress_cidr_format(&c, buf, sizeof(buf)), 0);
                assert_string_equal(buf, ok[i].out);
        }
}

static void test_parse_refuses(void **state) {
        static const char *const bad[] = {
                "", "/", "/24", "203.0.113.0/", "203.0.113.0/33", "203.0.113.0/024", "203.0.113.0/2 4",
                "203.0.113.0/-1", "203.0.113.0/+8", "203.0.113.0/24/24", "203.0.113.80/24" /* host bits */,
                "203.0.113", "203.0.113.0.1/32", "127.1", "2130706433", "0x7f.0.0.1/32", "0177.0.0.1",
                "010.0.0.0/8", "203.0.113.00/32", "256.0.0.0/8", " 203.0.113.0/24", "203.0.113.0/24 ",
                "203.0.113.0/24\n", "[2001:db8::]/32", "2001:db8::/129", "2001:db8::1/32",
                "fe80::1%eth0/128", "2001:db8:::/48", "2001:db8::g/64", "example.com/24",
                "203.0.113.0/4294967320", "1.2.3.4/0x10",
                "2001:0db8:0000:0000:0000:0000:0000:0000:0000/64" /* too long, and not an address */,
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                EgressCidr c;
                if (egress_cidr_parse(bad[i], &c) != -EINVAL)
                        fail_msg("'%s' was accepted", bad[i]);
        }
        EgressCidr c;
        assert_int_equal(egress_cidr_parse(NULL, &c), -EINVAL);
        char huge[200];
        memset(huge, '1', sizeof(huge) - 1);
        huge[sizeof(huge) - 1] = '\0';
        assert_int_equal(egress_cidr_parse(huge, &c), -EINVAL);
}

static void test_contains(void **state) {
        EgressCidr c;
        assert_int_equal(egress_cidr_parse("203.0.113.0/24", &c), 0);
        struct sockaddr_storage a = addr_of("203.0.113.80"), b = addr_of("203.0.114.1"),
                                m = addr_of("::ffff:203.0.113.80");
        assert_true(egress_cidr_contains(&c, (struct sockaddr *)&a));
        assert_false(egress_cidr_contains(&c, (struct sockaddr *)&b));
        /* An IPv4 range is matched by IPv4 addresses only. */
        assert_false(egress_cidr_contains(&c, (struct sockaddr *)&m));
        assert_int_equal(egress_cidr_parse("2001:db8:5::/48", &c), 0);
        struct sockaddr_storage v6in = addr_of("2001:db8:5:ffff::1"), v6out = addr_of("2001:db8:6::1");
        assert_true(egress_cidr_contains(&c, (struct sockaddr *)&v6in));
        assert_false(egress_cidr_contains(&c, (struct sockaddr *)&v6out));
}

static void test_check_public(void **state) {
        /* Everything a sandbox must never reach, in ranges that hold it. */
        static const char *const refused[] = {
                "0.0.0.0/0", "0.0.0.0/8", "127.0.0.0/8", "127.0.0.1", "126.0.0.0/7", "169.254.0.0/16",
                "169.254.169.254", "169.0.0.0/8", "100.100.100.200", "100.64.0.0/10", "224.0.0.0/4",
                "239.1.2.3", "255.255.255.255", "240.0.0.0/4", "::/0", "::", "::1", "::ffff:0:0/96",
                "::ffff:203.0.113.80", "::203.0.113.80", "64:ff9b::/96", "64:ff9b::cb00:7150",
                "2002::/16", "2002:cb00:7150::/48", "2001::/32", "fe80::/10", "fe80::1", "ff02::1",
                "fd00:ec2::254", "fd00::/8",
        };
        char err[256];
        for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
                EgressCidr c;
                assert_int_equal(egress_cidr_parse(refused[i], &c), 0);
                err[0] = '\0';
                if (egress_cidr_check_public(&c, NULL, 0, err, sizeof(err)) != -EPERM)
                        fail_msg("%s was accepted", refused[i]);
                assert_non_null(strstr(err, "never reach"));
        }
        static const char *const accepted[] = { "203.0.113.0/24", "203.0.113.80", "10.0.0.0/8", "198.18.0.0/15",
                                                "2001:db8:5::/48", "fd12:3456::/32" };
        for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
                EgressCidr c;
                assert_int_equal(egress_cidr_parse(accepted[i], &c), 0);
                if (egress_cidr_check_public(&c, NULL, 0, err, sizeof(err)) != 0)
                        fail_msg("%s was refused: %s", accepted[i], err);
        }
        /* A range that holds one of this host's addresses. */
        struct sockaddr_storage own[2] = { addr_of("10.1.2.3"), addr_of("2001:db8:5::2") };
        EgressCidr c;
        assert_int_equal(egress_cidr_parse("10.0.0.0/8", &c), 0);
        assert_int_equal(egress_cidr_check_public(&c, own, 2, err, sizeof(err)), -EPERM);
        assert_non_null(strstr(err, "10.1.2.3"));
        assert_int_equal(egress_cidr_parse("10.1.2.80", &c), 0);
        assert_int_equal(egress_cidr_check_public(&c, own, 2, err, sizeof(err)), 0);
        assert_int_equal(egress_cidr_parse("2001:db8:5::/48", &c), 0);
        assert_int_equal(egress_cidr_check_public(&c, own, 2, err, sizeof(err)), -EPERM);
}

/* The ranges given to admission are made by hand here, past the start-up
 * check, to show that the check per connection holds on its own. */
static void test_admit(void **state) {
        EgressCidr all[2];
        assert_int_equal(egress_cidr_parse("0.0.0.0/0", &all[0]), 0);
        assert_int_equal(egress_cidr_parse("::/0", &all[1]), 0);
        static const char *const never[] = { "127.0.0.1",     "127.255.0.1", "0.0.0.0",      "169.254.169.254",
                                             "169.254.0.1",   "224.0.0.1",   "255.255.255.255", "100.100.100.200",
                                             "::1",           "::",          "fe80::1",      "ff02::1",
                                             "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1",
                                             "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "fd00:ec2::254" };
        for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
                struct sockaddr_storage a = addr_of(never[i]);
                if (egress_cidr_admit(all, 2, (struct sockaddr *)&a))
                        fail_msg("%s was admitted", never[i]);
        }
        /* This host's own addresses, whatever they are here. */
        struct sockaddr_storage own[64];
        size_t n_own = 0;
        assert_int_equal(egress_host_addrs(own, 64, &n_own), 0);
        assert_true(n_own >= 1); /* loopback at least */
        for (size_t i = 0; i < n_own; i++)
                assert_null(egress_cidr_admit(all, 2, (struct sockaddr *)&own[i]));

        EgressCidr doc;
        assert_int_equal(egress_cidr_parse("198.51.100.0/24", &doc), 0);
        struct sockaddr_storage in = addr_of("198.51.100.7"), out = addr_of("198.51.101.7"),
                                mapped = addr_of("::ffff:198.51.100.7");
        assert_ptr_equal(egress_cidr_admit(&doc, 1, (struct sockaddr *)&in), &doc);
        assert_null(egress_cidr_admit(&doc, 1, (struct sockaddr *)&out));
        assert_null(egress_cidr_admit(&doc, 1, (struct sockaddr *)&mapped));
        assert_null(egress_cidr_admit(NULL, 0, (struct sockaddr *)&in));
        assert_null(egress_cidr_admit(&doc, 1, NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_accepts), cmocka_unit_test(test_parse_refuses),
                cmocka_unit_test(test_contains),      cmocka_unit_test(test_check_public),
                cmocka_unit_test(test_admit),
        };
        return cmocka_run_group_tests_name("egress_cidr", tests, NULL, NULL);
}
