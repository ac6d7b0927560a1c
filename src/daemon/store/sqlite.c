/* The SQLite backend's table of tables. Each kind's table is in its own
 * file of this folder (sqlite_<kind>.c). */
#include "daemon/store/store.h"

const StoreBackend store_sqlite = {
        .name = "sqlite",
};

const StoreBackend *store_backend_for(const char *location) {
        (void)location;
        return &store_sqlite;
}
