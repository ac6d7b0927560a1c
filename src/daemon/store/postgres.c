/* The PostgreSQL backend's table of tables. Each kind's table is in its own
 * file of this folder (postgres_<kind>.c); the schema of all of them is
 * postgres_schema.c's. */
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
#include "daemon/store/store_uploads.h"
#include "daemon/store/store_requests.h"
#include "daemon/store/store_samples.h"
#include "daemon/store/store_sandboxes.h"
#include "daemon/store/store_snapshots.h"
#include "daemon/store/store_volumes.h"
#include "daemon/store/store_webhooks.h"

const StoreBackend store_postgres = {
        .name = "postgresql",
        .keys = &store_postgres_keys,
        .ledger = &store_postgres_ledger,
        .uploads = &store_postgres_uploads,
        .egress = &store_postgres_egress,
        .hosts = &store_postgres_hosts,
        .events = &store_postgres_events,
        .sandboxes = &store_postgres_sandboxes,
        .snapshots = &store_postgres_snapshots,
        .webhooks = &store_postgres_webhooks,
        .audit = &store_postgres_audit,
        .samples = &store_postgres_samples,
        .requests = &store_postgres_requests,
        .otel = &store_postgres_otel,
        .links = &store_postgres_links,
        .previews = &store_postgres_previews,
        .sessions = &store_postgres_sessions,
        .images = &store_postgres_images,
        .volumes = &store_postgres_volumes,
};
