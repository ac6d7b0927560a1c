#include "daemon/model/sandbox_request.h"

#include <stdlib.h>

void create_request_done(CreateRequest *r) {
        sandbox_spec_done(&r->spec);
        json_decref(r->labels);
        free(r->name);
        *r = (CreateRequest){ 0 };
}
