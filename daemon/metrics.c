/*
 * Counters and the STATS / HEALTH documents. Counters are plain integers
 * owned by the loop thread; the JSON is built on demand with jansson, so
 * a STATS request costs nothing until it is asked for. Beside the global
 * counters: the latency histograms and the per-namespace slots that
 * /metrics labels (prom.c), kept here because every layer adds to them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon.h"

struct metrics metrics;
struct metrics_hist metrics_hist[METRICS_OP__MAX][2];
struct metrics_ns metrics_ns[METRICS_NS_MAX + 1];

/* 10 us to 10 s, 1-2.5-5 per decade: a DRAM PROBE to a restore from a slow file tier. */
const uint64_t metrics_hist_bounds_ns[METRICS_HIST_BOUNDS] = {
	10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000, 25000000, 50000000,
	100000000, 250000000, 500000000, 1000000000, 2500000000ULL, 5000000000ULL,
	10000000000ULL,
};

/*
 * The slot of a namespace (at its creation, not on any request's path):
 * the one it had before (by fingerprint), a free one, or the shared last
 * slot once METRICS_NS_MAX are taken. Never NULL.
 */
struct metrics_ns *
metrics_ns_slot(const struct ns *ns)
{
	struct metrics_ns	*m;
	unsigned		 i;

	for (i = 0; i < METRICS_NS_MAX; i++) {
		m = &metrics_ns[i];
		if (m->used && memcmp(m->fingerprint, ns->fingerprint, sizeof(m->fingerprint)) == 0)
			return m;
		if (!m->used)
			break;
	}
	if (i == METRICS_NS_MAX) {
		m = &metrics_ns[METRICS_NS_MAX];
		m->used = 1;
		m->npools = 1;
		snprintf(m->pools[0], sizeof(m->pools[0]), "other");
		return m;
	}
	m->used = 1;
	memcpy(m->fingerprint, ns->fingerprint, sizeof(m->fingerprint));
	snprintf(m->name, sizeof(m->name), "%s", ns->name);
	m->npools = ns->layout.npools < PROTO_POOLS_MAX ? ns->layout.npools : PROTO_POOLS_MAX;
	for (i = 0; i < m->npools; i++)
		snprintf(m->pools[i], sizeof(m->pools[i]), "%.*s", (int)sizeof(ns->pools[i].name) - 1,
		    ns->pools[i].name);
	return m;
}

static const char *
metrics_copy_engine(struct server *s)
{
	switch (s->cfg->copy_engine) {
	case CONFIG_COPY_CUDA:	return "cuda";
	case CONFIG_COPY_HOST:	return "host";
	}
	return s->gpu_present ? "cuda" : "host";
}

/*
 * A namespace's pools by name, with the objects DRAM holds of each
 * (counted as they come and go, so this is no walk of the index).
 */
static json_t *
metrics_ns_pools(struct server *s, const struct ns *ns)
{
	static const char *const kinds[] = { "?", "kv", "state", "sidecar" };
	uint64_t	 dram[PROTO_POOLS_MAX], file[PROTO_POOLS_MAX];
	json_t		*o = json_object(), *p;
	int		 i, has_file;

	if (s->dram != NULL)
		dram_ns_objects(s->dram, ns->fingerprint, dram);
	else
		memset(dram, 0, sizeof(dram));
	has_file = s->file != NULL && filetier_ns_objects(s->file, ns->fingerprint, file) == 0;
	for (i = 0; i < ns->layout.npools && i < PROTO_POOLS_MAX; i++) {
		p = json_pack("{s:s, s:I}", "kind",
		    kinds[ns->pools[i].kind <= PROTO_POOL_SIDECAR ? ns->pools[i].kind : 0],
		    "dram_objects", (json_int_t)dram[i]);
		/* Files visible now (written, or found by the scan), not only what the scan found. */
		if (p != NULL && has_file)
			json_object_set_new(p, "file_objects", json_integer((json_int_t)file[i]));
		json_object_set_new(o, ns->pools[i].name, p);
	}
	return o;
}

static json_t *
metrics_namespaces(struct server *s)
{
	json_t		*a = json_array();
	struct ns	*ns;

	json_t		*o;
	uint64_t	 objects;
	int		 st;

	TAILQ_FOREACH(ns, &s->namespaces, entry) {
		o = json_pack("{s:s, s:s, s:I}", "name", ns->name, "model", ns->layout.model,
		    "sessions", (json_int_t)ns->refs);
		if (o != NULL)
			json_object_set_new(o, "pools", metrics_ns_pools(s, ns));
		/* The file tier's scan of it: "scanning" with the objects indexed so far, or "done". */
		st = s->file != NULL ? filetier_scan_state(s->file, ns->fingerprint, &objects) :
		    -ENOENT;
		if (o != NULL && st >= 0) {
			json_object_set_new(o, "file_scan", json_string(st ? "scanning" : "done"));
			json_object_set_new(o, "file_objects", json_integer((json_int_t)objects));
		}
		json_array_append_new(a, o);
	}
	return a;
}

static json_t *
metrics_groups(struct server *s)
{
	json_t		*a = json_array();
	struct rank_group	*g;

	static const char *const prefetch[] = { "?", "wait_complete", "best_effort", "timeout" };
	static const char *const write[] = { "?", "write_through", "write_back", "offload" };

	/* With the group's current policies (ATTACH's, or the last SET_POLICY's). */
	TAILQ_FOREACH(g, &s->groups, entry)
		json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:s, s:s, s:I}", "id", g->id,
		    "size", (json_int_t)g->size, "attached", (json_int_t)g->nmembers,
		    "prefetch", prefetch[g->prefetch <= PROTO_PREFETCH_TIMEOUT ? g->prefetch : 0],
		    "write", write[g->write <= PROTO_WRITE_OFFLOAD ? g->write : 0],
		    "prefetch_timeout_ms", (json_int_t)g->prefetch_timeout_ms));
	return a;
}

static unsigned
metrics_sessions(struct server *s)
{
	struct conn	*c;
	unsigned	 n = 0;

	TAILQ_FOREACH(c, &s->conns, entry)
		if (c->session != NULL)
			n++;
	return n;
}

#define I(x)	((json_int_t)(x))

/* Counters by reason, only the reasons that happened. */
static json_t *
metrics_declines(void)
{
	json_t	*o = json_object();
	int	 i;

	for (i = 1; i < PROTO_DECLINE__MAX; i++)
		json_object_set_new(o, proto_decline_name((unsigned)i),
		    json_integer(I(metrics.admits_declined[i])));
	return o;
}

static json_t *
metrics_failures(void)
{
	json_t	*o = json_object();
	int	 i;

	for (i = 1; i < PROTO_S__MAX; i++)
		if (metrics.restores_failed[i] > 0)
			json_object_set_new(o, proto_status_name((unsigned)i),
			    json_integer(I(metrics.restores_failed[i])));
	return o;
}

/* The cache operations, named after SGLang's HiCache counters where they match. */
static json_t *
metrics_cache(void)
{
	json_t	*o;

	o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
	    " s:I, s:I, s:I, s:I, s:I}",
	    "probes", I(metrics.probes), "admits", I(metrics.admits),
	    "admits_limited", I(metrics.admits_limited),
	    "admitted", I(metrics.admits_admitted), "admitted_pages", I(metrics.admit_pages),
	    "restores_ready", I(metrics.restores_ready),
	    "restores_partial", I(metrics.restores_partial),
	    "pages_restored", I(metrics.pages_restored), "bytes_restored", I(metrics.bytes_restored),
	    "publishes", I(metrics.publishes), "publishes_failed", I(metrics.publishes_failed),
	    "pages_published", I(metrics.pages_published),
	    "bytes_published", I(metrics.bytes_published), "pages_present", I(metrics.pages_present),
	    "cancels", I(metrics.cancels), "releases", I(metrics.releases),
	    "lease_expiries", I(metrics.lease_expiries), "leases_open", I(metrics.leases_open),
	    "objects_lost", I(metrics.objects_lost));
	if (o == NULL)
		return json_null();
	/* Restored kv pages by the tier that held them at ADMIT: dram + file + peer = pages_restored. */
	json_object_set_new(o, "hits", json_pack("{s:I, s:I, s:I}", "dram", I(metrics.hits_dram),
	    "file", I(metrics.hits_file), "peer", I(metrics.hits_peer)));
	json_object_set_new(o, "declined", metrics_declines());
	json_object_set_new(o, "restores_failed", metrics_failures());
	return o;
}

/* The DRAM tier's occupancy. */
static json_t *
metrics_dram(struct server *s)
{
	struct dram_stats	st;

	if (s->dram == NULL)
		return json_null();
	dram_stats(s->dram, &st);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:b}",
	    "objects", I(st.visible), "writing", I(st.writing), "unverified",
	    I(st.unverified), "pinned_objects",
	    I(st.pinned_objects), "pins", I(st.pins), "bytes_used", I(st.bytes_used),
	    "bytes_capacity", I(st.bytes_capacity), "slabs", I(st.slabs),
	    "evictions", I(st.evictions), "evict_failures", I(st.evict_failures),
	    "drops", I(st.drops), "meta_bytes_per_object", st.meta_bytes_per_object,
	    "hugetlb", st.hugetlb);
}

/*
 * The file tier: null when tiers.file.path is unset. "write_through"
 * counts publish.c's side: writes queued, failed (refused at queueing,
 * or failed after; never visible), found present and deferred (waited in
 * the backlog); dirty objects are acknowledged and not on file yet (in
 * the backlog or being written), backlog ones not handed to the tier yet.
 */
static json_t *
metrics_file(struct server *s)
{
	struct filetier_stats	st;
	json_t			*o;
	uint64_t		 dirty, dirty_bytes, waiting, waiting_bytes;

	if (s->file == NULL)
		return json_null();
	filetier_stats(s->file, &st);
	o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
	    " s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	    "namespaces", I(st.namespaces), "objects", I(st.visible), "writing", I(st.writing),
	    "deleting", I(st.deleting), "pinned_objects", I(st.pinned_objects),
	    "pins", I(st.pins), "bytes_used", I(st.bytes_used),
	    "bytes_capacity", I(st.bytes_capacity), "reads", I(st.reads),
	    "read_failures", I(st.read_failures), "reads_inflight", I(st.reads_inflight),
	    "bytes_read", I(st.bytes_read), "writes", I(st.writes),
	    "write_failures", I(st.write_failures), "write_nospace", I(st.write_nospace),
	    "writes_refused", I(st.writes_refused), "writes_present", I(st.writes_present),
	    "writes_inflight", I(st.writes_inflight), "bytes_written", I(st.bytes_written),
	    "evictions", I(st.evictions), "drops", I(st.drops),
	    "scan_objects", I(st.scan_objects), "scan_removed", I(st.scan_removed),
	    "scan_ms", I(st.scan_ms));
	if (o == NULL)
		return json_null();
	json_object_set_new(o, "scanning", json_integer((json_int_t)st.scanning));
	/* Namespaces in use (directory open), closed as they went idle, forgotten for new ones. */
	json_object_set_new(o, "namespaces_open", json_integer(I(st.namespaces_open)));
	json_object_set_new(o, "namespaces_released", json_integer(I(st.namespaces_released)));
	json_object_set_new(o, "namespaces_forgotten", json_integer(I(st.namespaces_forgotten)));
	/* A full filesystem lowers the capacity eviction keeps to; deleted directories are made again. */
	json_object_set_new(o, "bytes_capacity_effective",
	    json_integer((json_int_t)st.bytes_capacity_effective));
	json_object_set_new(o, "write_nospace_retries",
	    json_integer((json_int_t)st.write_nospace_retries));
	json_object_set_new(o, "dirs_recreated", json_integer((json_int_t)st.dirs_recreated));
	publish_backlog_stats(s, &dirty, &dirty_bytes, &waiting, &waiting_bytes);
	json_object_set_new(o, "write_through", json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	    "queued", I(metrics.file_writes), "failed", I(metrics.file_writes_failed),
	    "present", I(metrics.file_writes_present), "deferred", I(metrics.file_writes_deferred),
	    "dirty_objects", I(dirty), "dirty_bytes", I(dirty_bytes),
	    "backlog_objects", I(waiting), "backlog_bytes", I(waiting_bytes)));
	return o;
}

/* The STATS document; returns a new string (free) or NULL. */
/* A RESTORE's timeline (struct copy_times): CLOCK_MONOTONIC ns, 0 where not known. */
static json_t *
metrics_times(const struct copy_times *t)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	    "arrive", I(t->arrive), "handled", I(t->handled), "submit", I(t->submit),
	    "first_issue", I(t->first_issue), "last_issue", I(t->last_issue),
	    "gpu_dma_start", I(t->gpu_dma_start), "gpu_dma_end", I(t->gpu_dma_end),
	    "gpu_csum_start", I(t->gpu_csum_start), "gpu_csum_end", I(t->gpu_csum_end),
	    "gpu_verified", I(t->gpu_verified), "gpu_end", I(t->gpu_end),
	    "notify", I(t->notify), "done", I(t->done), "reply", I(t->reply));
}

/*
 * The cuda copy engines, one object per device (engine) the daemon may
 * start: its GPU and that GPU's UUID (absent where the driver did not
 * say), whether it started (at its first region), its jobs and bytes,
 * its staging ring in use, its last RESTORE's timeline. [] without a
 * GPU.
 */
static json_t *
metrics_devices(struct server *s)
{
	struct cuda_dev_stats	 st;
	json_t			*a = json_array();
	unsigned		 i, n = cuda_devices(s->cuda);

	for (i = 0; i < n && a != NULL; i++) {
		cuda_dev_stats(s->cuda, i, &st);
		json_array_append_new(a, json_pack("{s:I, s:I, s:s*, s:b, s:I, s:I, s:I, s:I, s:I, "
		    "s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
		    "device", I(st.device), "gpu", I(st.gpu),
		    "uuid", st.uuid[0] != '\0' ? st.uuid : NULL, "started", st.started,
		    "regions", I(st.regions), "jobs_inflight", I(st.jobs_inflight),
		    "jobs", I(st.jobs), "restores", I(st.restores), "publishes", I(st.publishes),
		    "failed", I(st.failed), "bytes", I(st.bytes),
		    "staging_slots", I(st.staging_slots), "staging_in_use", I(st.staging_in_use),
		    "staging_slot_bytes", I(st.staging_bytes),
		    "waiting_on_events", I(st.waiting_on_events),
		    "last_restore", metrics_times(&st.last_restore)));
	}
	return a;
}

/*
 * HEALTH's device_uuids: entry i is device i's GPU UUID (null where not
 * known), what a client matches its own GPU's UUID against to find the
 * index to claim. [] without a GPU.
 */
static json_t *
metrics_device_uuids(struct server *s)
{
	json_t		*a = json_array();
	const char	*u;
	unsigned	 i, n = cuda_devices(s->cuda);

	for (i = 0; i < n && a != NULL; i++) {
		u = cuda_device_uuid(s->cuda, i);
		json_array_append_new(a, u[0] != '\0' ? json_string(u) : json_null());
	}
	return a;
}

char *
metrics_stats_json(struct server *s)
{
	json_t	*j;
	char	*out;

	j = json_pack("{s:{s:s, s:s, s:s, s:I, s:I, s:s, s:b},"
	    " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
	    " s:{s:I, s:I, s:I, s:I, s:I},"
	    " s:{s:I, s:I, s:I, s:I, s:I},"
	    " s:{s:I, s:I},"
	    " s:{s:I, s:I, s:I}}",
	    "daemon", "version", L3KV_VERSION, "role", s->cfg->role, "model", s->cfg->model,
	    "pid", I(getpid()), "uptime_ms", I(server_now_ms() - s->started_ms),
	    "copy_engine", metrics_copy_engine(s), "gpu", s->gpu_present,
	    "connections", "open", I(metrics.connections_open),
	    "accepted", I(metrics.connections_accepted), "denied", I(metrics.connections_denied),
	    "limited", I(metrics.connections_limited), "no_fd", I(metrics.connections_no_fd),
	    "timed_out", I(metrics.connections_timed_out), "slow", I(metrics.connections_slow),
	    "frames", "in", I(metrics.frames_in), "out", I(metrics.frames_out),
	    "bad", I(metrics.frames_bad), "bytes_in", I(metrics.bytes_in),
	    "bytes_out", I(metrics.bytes_out),
	    "attach", "attaches", I(metrics.attaches), "refused", I(metrics.attaches_refused),
	    "guards_refused", I(metrics.guards_refused), "detaches", I(metrics.detaches),
	    "sessions", I(metrics_sessions(s)),
	    "requests", "stats", I(metrics.stats_requests), "health", I(metrics.health_requests),
	    "memory", "regions_mapped", I(metrics.regions_mapped),
	    "events_open", I(metrics.events_open),
	    "region_bytes_mapped", I(metrics.region_bytes_mapped));
	if (j == NULL)
		return NULL;
	/* Where metrics.listen serves (the address bound), "" when off. */
	json_object_set_new(json_object_get(j, "daemon"), "metrics_listen",
	    json_string(httpd_address(s->httpd)));
	json_object_set_new(j, "copy", json_pack("{s:I, s:I, s:o, s:o}",
	    "jobs_inflight", I((s->copy != NULL ? copy_inflight(s->copy) : 0) +
	    cuda_inflight(s->cuda)),
	    "waiting_on_events", I(cuda_waiting_on_events(s->cuda)),
	    "last_restore", metrics_times(&metrics.last_restore),
	    "devices", metrics_devices(s)));
	json_object_set_new(j, "cache", metrics_cache());
	json_object_set_new(j, "dram", metrics_dram(s));
	json_object_set_new(j, "file", metrics_file(s));
	json_object_set_new(j, "namespaces", metrics_namespaces(s));
	json_object_set_new(j, "groups", metrics_groups(s));
	/* Reloads (reload.c): files compared, bad files, keys applied and refused; watchdog pings. */
	json_object_set_new(j, "reload", json_pack("{s:I, s:I, s:I, s:I, s:I}",
	    "reloads", I(metrics.reloads), "failed", I(metrics.reloads_failed),
	    "keys_applied", I(metrics.reload_keys_applied),
	    "keys_refused", I(metrics.reload_keys_refused),
	    "watchdog_pings", I(metrics.watchdog_pings)));
	json_object_set_new(j, "peers", peer_stats_json(s));
	out = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return out;
}

/* The HEALTH document: short, for probes and l3kvctl. */
char *
metrics_health_json(struct server *s)
{
	json_t	*j;
	char	*out;

	j = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:b, s:o}",
	    "status", s->stopping ? "stopping" : "ok", "version", L3KV_VERSION,
	    "role", s->cfg->role, "uptime_ms", I(server_now_ms() - s->started_ms),
	    "connections", I(s->nconns), "sessions", I(metrics_sessions(s)),
	    "copy_engine", metrics_copy_engine(s), "gpu", s->gpu_present,
	    "device_uuids", metrics_device_uuids(s));
	if (j == NULL)
		return NULL;
	out = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return out;
}
