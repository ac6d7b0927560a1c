/* runtime: the command-line client of runtimed. */
#include <curl/curl.h>
#include <stdio.h>

#include "cli/cli.h"

int main(int argc, char **argv) {
        int r;

        /* Before any thread (the lease keeper is one): curl's global set-up is not thread-safe. */
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                fprintf(stderr, "runtime: cannot initialise libcurl\n");
                return CLI_EXIT_FAILURE;
        }
        r = cli_main(argc, argv);
        curl_global_cleanup();
        return r;
}
