/* The SQLite backend's table of tables. Each kind's table is in its own
 * file of this folder (sqlite_<kind>.c). */
#include "daemon/store/store.h"
#include "daemon/store/store_audit.h"
#include "daemon/store/store_egress.h"
#include "daemon/store/store_events.h"
#include "daemon/store/store_hosts.h"
#include "daemon/store/store_keys.h"
#include "daemon/store/store_otel.h"
#include "daemon/store/store_ledger.h"
#include "daemon/store/store_images.h"
#include "daemon/store/store_links.h"
#include "daemon/store/store_previews.h"
#include "daemon/store/store_sessions.h"
#include "daemon/store/store_requests.h"
#include "daemon/store/store_samples.h"
#include "daemon/store/store_sandboxes.h"
#include "daemon/store/store_snapshots.h"
#include "daemon/store/store_uploads.h"
#include "daemon/store/store_volumes.h"
#include "daemon/store/store_webhooks.h"

const StoreBackend store_sqlite = {
        .name = "sqlite",
        .keys = &store_sqlite_keys,
        .ledger = &store_sqlite_ledger,
        .uploads = &store_sqlite_uploads,
        .sandboxes = &store_sqlite_sandboxes,
        .snapshots = &store_sqlite_snapshots,
        .egress = &store_sqlite_egress,
        .hosts = &store_sqlite_hosts,
        .events = &store_sqlite_events,
        .webhooks = &store_sqlite_webhooks,
        .audit = &store_sqlite_audit,
        .samples = &store_sqlite_samples,
        .requests = &store_sqlite_requests,
        .otel = &store_sqlite_otel,
        .links = &store_sqlite_links,
        .previews = &store_sqlite_previews,
        .sessions = &store_sqlite_sessions,
        .images = &store_sqlite_images,
        .volumes = &store_sqlite_volumes,
};
