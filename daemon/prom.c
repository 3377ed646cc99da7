/*
 * The Prometheus text exposition (format 0.0.4) of the daemon's counters,
 * for httpd.c's /metrics, and the readiness its /ready reports.
 *
 * Everything STATS counts has a counterpart here, named the Prometheus
 * way: the l3kv_ prefix, _total on counters, base units (_bytes,
 * _seconds). Every series carries the daemon's role; the cuda copy
 * engines' series their device, GPU and GPU UUID (CUDA_ENGINES_MAX
 * devices at most); the cache operations carry their namespace, from
 * metrics.c's slots, so the number of series is bounded whatever
 * engines attach: METRICS_NS_MAX
 * namespaces and "other", each with at most PROTO_POOLS_MAX pools, fixed
 * reason lists (declines, unfulfilled pages), and the statuses of
 * proto.h. The document is built from counters on the loop thread, never
 * from a walk of the index, so a scrape costs a few microseconds per
 * namespace and its size is bounded: about 1,800 lines, 250 KiB, with
 * every slot, pool, reason and status in use.
 *
 * The names of SGLang's HiCache counters about L3 have counterparts:
 * l3kv_prefetched_tokens_total (sglang:prefetched_tokens_total),
 * l3kv_backed_up_tokens_total (sglang:backuped_tokens_total),
 * l3kv_admit_hit_pages_total (sglang:storage_prefetch_hit_tokens_total,
 * in pages) and l3kv_unfulfilled_pages_total{reason}
 * (sglang:storage_prefetch_unfulfilled_tokens_total).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "daemon.h"

struct prom {
	struct evbuffer	*b;
	char		 role[80];	/* `role="decode"`, escaped */
	int		 failed;
};

/* Writes v as a label value: backslash, double quote and newline escaped. */
static void
prom_escape(char *out, size_t len, const char *v)
{
	size_t	o = 0;

	for (; *v != '\0' && o + 3 < len; v++) {
		if (*v == '\\' || *v == '"') {
			out[o++] = '\\';
			out[o++] = *v;
		} else if (*v == '\n') {
			out[o++] = '\\';
			out[o++] = 'n';
		} else
			out[o++] = *v;
	}
	out[o] = '\0';
}

static void
prom_printf(struct prom *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
prom_printf(struct prom *p, const char *fmt, ...)
{
	va_list	ap;

	va_start(ap, fmt);
	if (evbuffer_add_vprintf(p->b, fmt, ap) < 0)
		p->failed = 1;
	va_end(ap);
}

/* The HELP and TYPE lines that open a family. */
static void
prom_family(struct prom *p, const char *name, const char *type, const char *help)
{
	prom_printf(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample; labels are "" or `name="value",...` already escaped. */
static void
prom_sample(struct prom *p, const char *name, const char *labels, uint64_t v)
{
	prom_printf(p, "%s{%s%s%s} %llu\n", name, p->role, labels[0] != '\0' ? "," : "", labels,
	    (unsigned long long)v);
}

/* A family of one unlabelled sample. */
static void
prom_one(struct prom *p, const char *name, const char *type, const char *help, uint64_t v)
{
	prom_family(p, name, type, help);
	prom_sample(p, name, "", v);
}

#define PROM_COUNTER(p, name, help, v)	prom_one(p, name, "counter", help, v)
#define PROM_GAUGE(p, name, help, v)	prom_one(p, name, "gauge", help, v)

/* The namespace label of a slot. */
static void
prom_ns_label(const struct metrics_ns *m, char *out, size_t len)
{
	char	v[2 * PROTO_NSNAME_LEN];

	prom_escape(v, sizeof(v), m->name[0] != '\0' ? m->name : "other");
	snprintf(out, len, "namespace=\"%s\"", v);
}

/* A counter family with one sample per namespace slot in use, off a field of the slot. */
static void
prom_ns_counter(struct prom *p, const char *name, const char *help, size_t off)
{
	const struct metrics_ns	*m;
	char			 l[2 * PROTO_NSNAME_LEN + 16];
	unsigned		 i;

	prom_family(p, name, "counter", help);
	for (i = 0; i <= METRICS_NS_MAX; i++) {
		m = &metrics_ns[i];
		if (!m->used)
			continue;
		prom_ns_label(m, l, sizeof(l));
		prom_sample(p, name, l, *(const uint64_t *)(const void *)((const char *)m + off));
	}
}

#define PROM_NS(p, name, help, field)	\
	prom_ns_counter(p, name, help, offsetof(struct metrics_ns, field))

/* A counter per namespace and another label: n values of arr (a field of the slot). */
static void
prom_ns_counter_by(struct prom *p, const char *name, const char *help, const char *label,
    const char *const *values, size_t n, size_t off, int nonzero_only)
{
	const struct metrics_ns	*m;
	const uint64_t		*arr;
	char			 l[2 * PROTO_NSNAME_LEN + 96];
	size_t			 j, o;
	unsigned		 i;

	prom_family(p, name, "counter", help);
	for (i = 0; i <= METRICS_NS_MAX; i++) {
		m = &metrics_ns[i];
		if (!m->used)
			continue;
		arr = (const uint64_t *)(const void *)((const char *)m + off);
		for (j = 0; j < n; j++) {
			if (values[j] == NULL || (nonzero_only && arr[j] == 0))
				continue;
			prom_ns_label(m, l, sizeof(l));
			o = strlen(l);
			snprintf(l + o, sizeof(l) - o, ",%s=\"%s\"", label, values[j]);
			prom_sample(p, name, l, arr[j]);
		}
	}
}

/* Per namespace and pool: the slot's pool names (escaped: engines name them). */
static void
prom_ns_pool_counter(struct prom *p, const char *name, const char *help, size_t off)
{
	const struct metrics_ns	*m;
	const uint64_t		*arr;
	char			 l[2 * PROTO_NSNAME_LEN + 64], pool[40];
	unsigned		 i, j;
	size_t			 o;

	prom_family(p, name, "counter", help);
	for (i = 0; i <= METRICS_NS_MAX; i++) {
		m = &metrics_ns[i];
		if (!m->used)
			continue;
		arr = (const uint64_t *)(const void *)((const char *)m + off);
		for (j = 0; j < m->npools; j++) {
			prom_ns_label(m, l, sizeof(l));
			prom_escape(pool, sizeof(pool), m->pools[j]);
			o = strlen(l);
			snprintf(l + o, sizeof(l) - o, ",pool=\"%s\"", pool);
			prom_sample(p, name, l, arr[j]);
		}
	}
}

static const char *const prom_unfulfilled[METRICS_UNF__MAX] = {
	[METRICS_UNF_RESERVATION] = "reservation",
	[METRICS_UNF_STAGING] = "staging",
	[METRICS_UNF_DECLINED] = "declined",
	[METRICS_UNF_DEADLINE] = "deadline",
	[METRICS_UNF_FAILED] = "failed",
	[METRICS_UNF_CANCELLED] = "cancelled",
	[METRICS_UNF_EXPIRED] = "expired",
	[METRICS_UNF_RELEASED] = "released",
};

static const char *const prom_tiers[2] = { "dram", "file" };
/* Where a hit came from: the stores, and the peer tier (pulled from another daemon's DRAM). */
static const char *const prom_hit_tiers[3] = { "dram", "file", "peer" };

/* The cache operations, per namespace. */
static void
prom_cache(struct prom *p)
{
	const char	*statuses[PROTO_S__MAX], *declines[PROTO_DECLINE__MAX];
	unsigned	 i;

	for (i = 0; i < PROTO_DECLINE__MAX; i++)
		declines[i] = i == 0 ? NULL : proto_decline_name(i);

	PROM_NS(p, "l3kv_probes_total", "PROBE requests answered.", probes);
	PROM_NS(p, "l3kv_admits_total", "ADMIT requests taken, one per rank.", admits);
	PROM_NS(p, "l3kv_admits_limited_total",
	    "ADMIT requests refused: admit.max_waiting were waiting at the barrier.", admits_limited);
	PROM_NS(p, "l3kv_admitted_total", "Ranks admitted (a lease each).", admitted);
	prom_ns_counter_by(p, "l3kv_admit_declines_total",
	    "Ranks whose admission declined (promised 0 pages), by reason.", "reason", declines,
	    PROTO_DECLINE__MAX, offsetof(struct metrics_ns, declined), 0);
	PROM_NS(p, "l3kv_admit_requested_pages_total", "Pages each answered rank asked ADMIT for.",
	    requested_pages);
	PROM_NS(p, "l3kv_admit_hit_pages_total",
	    "Pages of the group hit each asking rank was told at ADMIT (as "
	    "sglang:storage_prefetch_hit_tokens_total, in pages).", hit_pages);
	PROM_NS(p, "l3kv_admitted_pages_total", "Pages promised, per rank.", admitted_pages);
	prom_ns_counter_by(p, "l3kv_unfulfilled_pages_total",
	    "Hit pages that were not restored, per rank, by reason (as "
	    "sglang:storage_prefetch_unfulfilled_tokens_total, in pages).", "reason",
	    prom_unfulfilled, METRICS_UNF__MAX, offsetof(struct metrics_ns, unfulfilled), 0);
	PROM_NS(p, "l3kv_restores_total", "RESTORE requests answered READY.", restores_ready);
	PROM_NS(p, "l3kv_restores_partial_total",
	    "READY answers short of the promise (best_effort, timeout deadlines).", restores_partial);
	for (i = 0; i < PROTO_S__MAX; i++)
		statuses[i] = i == 0 ? NULL : proto_status_name(i);
	prom_ns_counter_by(p, "l3kv_restores_failed_total",
	    "RESTORE requests that failed, by status (only statuses that happened).", "reason",
	    statuses, PROTO_S__MAX, offsetof(struct metrics_ns, restores_failed), 1);
	prom_ns_counter_by(p, "l3kv_restored_pages_total",
	    "KV pages restored, per rank, by the tier that held them at ADMIT (the hits; peer: "
	    "pulled from another daemon).", "tier", prom_hit_tiers, 3,
	    offsetof(struct metrics_ns, restored_pages), 0);
	PROM_NS(p, "l3kv_restored_bytes_total", "KV bytes restored.", restored_bytes);
	PROM_NS(p, "l3kv_prefetched_tokens_total",
	    "Tokens of the KV pages restored, per rank (as sglang:prefetched_tokens_total).",
	    prefetched_tokens);
	PROM_NS(p, "l3kv_publishes_total", "PUBLISH requests taken.", publishes);
	PROM_NS(p, "l3kv_publishes_failed_total", "PUBLISH requests that stored nothing.",
	    publishes_failed);
	prom_ns_pool_counter(p, "l3kv_published_pages_total", "Pages stored by PUBLISH, by pool.",
	    offsetof(struct metrics_ns, published_pages));
	prom_ns_pool_counter(p, "l3kv_published_bytes_total", "Bytes stored by PUBLISH, by pool.",
	    offsetof(struct metrics_ns, published_bytes));
	prom_ns_pool_counter(p, "l3kv_publish_present_pages_total",
	    "Pages a PUBLISH found stored already, by pool.", offsetof(struct metrics_ns,
	    present_pages));
	PROM_NS(p, "l3kv_backed_up_tokens_total",
	    "Tokens of the KV pages stored by PUBLISH (as sglang:backuped_tokens_total).",
	    backed_up_tokens);
	PROM_COUNTER(p, "l3kv_cancels_total", "CANCEL requests answered.", metrics.cancels);
	PROM_COUNTER(p, "l3kv_releases_total", "RELEASE requests answered.", metrics.releases);
	PROM_COUNTER(p, "l3kv_lease_expiries_total", "Leases that expired.", metrics.lease_expiries);
	PROM_GAUGE(p, "l3kv_leases_open", "Leases held now.", metrics.leases_open);
	PROM_COUNTER(p, "l3kv_objects_lost_total",
	    "Objects found lost or corrupt and dropped (a restore failed as lost).",
	    metrics.objects_lost);
}

/* Objects per namespace, pool and tier, and sessions: namespaces attached now, by slot. */
static void
prom_namespaces(struct prom *p, struct server *s)
{
	static uint64_t		 objs[METRICS_NS_MAX + 1][PROTO_POOLS_MAX][2];
	static uint64_t		 sessions[METRICS_NS_MAX + 1];
	uint64_t		 dram[PROTO_POOLS_MAX], file[PROTO_POOLS_MAX];
	const struct metrics_ns	*m;
	struct ns		*ns;
	char			 l[2 * PROTO_NSNAME_LEN + 80], pool[40];
	unsigned		 i, j, k, t;
	size_t			 o;

	memset(objs, 0, sizeof(objs));
	memset(sessions, 0, sizeof(sessions));
	TAILQ_FOREACH(ns, &s->namespaces, entry) {
		i = (unsigned)(ns->m - metrics_ns);
		sessions[i] += ns->refs;
		memset(dram, 0, sizeof(dram));
		memset(file, 0, sizeof(file));
		if (s->dram != NULL)
			dram_ns_objects(s->dram, ns->fingerprint, dram);
		if (s->file != NULL && filetier_ns_objects(s->file, ns->fingerprint, file) != 0)
			memset(file, 0, sizeof(file));
		for (j = 0; j < ns->layout.npools && j < PROTO_POOLS_MAX; j++) {
			k = metrics_ns_pool(ns->m, j);
			objs[i][k][0] += dram[j];
			objs[i][k][1] += file[j];
		}
	}
	prom_family(p, "l3kv_namespace_sessions", "gauge", "Sessions attached, by namespace.");
	for (i = 0; i <= METRICS_NS_MAX; i++) {
		if (!metrics_ns[i].used)
			continue;
		prom_ns_label(&metrics_ns[i], l, sizeof(l));
		prom_sample(p, "l3kv_namespace_sessions", l, sessions[i]);
	}
	prom_family(p, "l3kv_namespace_objects", "gauge",
	    "Objects stored, by namespace (attached now), pool and tier.");
	for (i = 0; i <= METRICS_NS_MAX; i++) {
		m = &metrics_ns[i];
		if (!m->used)
			continue;
		for (j = 0; j < m->npools; j++)
			for (t = 0; t < (s->file != NULL ? 2U : 1U); t++) {
				prom_ns_label(m, l, sizeof(l));
				prom_escape(pool, sizeof(pool), m->pools[j]);
				o = strlen(l);
				snprintf(l + o, sizeof(l) - o, ",pool=\"%s\",tier=\"%s\"", pool,
				    prom_tiers[t]);
				prom_sample(p, "l3kv_namespace_objects", l, objs[i][j][t]);
			}
	}
}

/* A family with one sample per tier configured; v[1] only with a file tier. */
static void
prom_tier(struct prom *p, int file, const char *name, const char *type, const char *help,
    uint64_t dram, uint64_t fv)
{
	prom_family(p, name, type, help);
	prom_sample(p, name, "tier=\"dram\"", dram);
	if (file)
		prom_sample(p, name, "tier=\"file\"", fv);
}

static void
prom_tiers_write(struct prom *p, struct server *s)
{
	struct filetier_stats	f;
	struct dram_stats	d;
	uint64_t		dirty, dirty_bytes, waiting, waiting_bytes;
	int			file = s->file != NULL;

	memset(&d, 0, sizeof(d));
	memset(&f, 0, sizeof(f));
	if (s->dram != NULL)
		dram_stats(s->dram, &d);
	if (file)
		filetier_stats(s->file, &f);
	prom_tier(p, file, "l3kv_tier_objects", "gauge", "Visible objects, by tier.", d.visible,
	    f.visible);
	prom_tier(p, file, "l3kv_tier_writing_objects", "gauge",
	    "Objects being written (not visible yet), by tier.", d.writing, f.writing);
	prom_tier(p, file, "l3kv_tier_pinned_objects", "gauge", "Objects pinned by leases or writes.",
	    d.pinned_objects, f.pinned_objects);
	prom_tier(p, file, "l3kv_tier_pins", "gauge", "Pins held.", d.pins, f.pins);
	prom_tier(p, file, "l3kv_tier_used_bytes", "gauge", "Bytes of objects stored, by tier.",
	    d.bytes_used, f.bytes_used);
	prom_tier(p, file, "l3kv_tier_capacity_bytes", "gauge", "Configured capacity, by tier.",
	    d.bytes_capacity, f.bytes_capacity);
	prom_tier(p, file, "l3kv_tier_evictions_total", "counter", "Objects evicted, by tier.",
	    d.evictions, f.evictions);
	prom_tier(p, file, "l3kv_tier_evict_failures_total", "counter",
	    "Allocations refused: everything left was pinned or being written.", d.evict_failures,
	    f.evict_failures);
	prom_tier(p, file, "l3kv_tier_drops_total", "counter",
	    "Objects dropped (lost, corrupt, or replaced).", d.drops, f.drops);
	PROM_GAUGE(p, "l3kv_dram_slabs", "Slabs of the DRAM arena in use.", d.slabs);
	PROM_GAUGE(p, "l3kv_dram_unverified_objects",
	    "Objects pulled from peers whose checksum no restore has checked yet.", d.unverified);
	PROM_GAUGE(p, "l3kv_dram_hugetlb", "1: the DRAM arena is MAP_HUGETLB; 0: THP advice.",
	    (uint64_t)d.hugetlb);
	prom_family(p, "l3kv_dram_meta_bytes_per_object", "gauge",
	    "Metadata bytes per object of the DRAM tier.");
	prom_printf(p, "l3kv_dram_meta_bytes_per_object{%s} %.3f\n", p->role,
	    d.meta_bytes_per_object);
	if (!file)
		return;
	PROM_GAUGE(p, "l3kv_file_namespaces", "Namespaces the file tier knows.", f.namespaces);
	PROM_GAUGE(p, "l3kv_file_namespaces_open", "Namespaces with their directory open.",
	    f.namespaces_open);
	PROM_COUNTER(p, "l3kv_file_namespaces_released_total",
	    "Namespace directories closed as they went idle.", f.namespaces_released);
	PROM_COUNTER(p, "l3kv_file_namespaces_forgotten_total",
	    "Idle, empty namespaces dropped for new ones.", f.namespaces_forgotten);
	PROM_GAUGE(p, "l3kv_file_scanning", "Namespaces whose startup scan still runs.", f.scanning);
	PROM_GAUGE(p, "l3kv_file_deleting_objects", "Objects whose unlink is queued.", f.deleting);
	PROM_GAUGE(p, "l3kv_file_capacity_effective_bytes",
	    "What eviction keeps the files under: lower while the filesystem is full.",
	    f.bytes_capacity_effective);
	PROM_COUNTER(p, "l3kv_file_reads_total", "Object reads finished.", f.reads);
	PROM_COUNTER(p, "l3kv_file_read_failures_total", "Reads that failed (the object dropped).",
	    f.read_failures);
	PROM_GAUGE(p, "l3kv_file_reads_inflight", "Reads queued or running.", f.reads_inflight);
	PROM_COUNTER(p, "l3kv_file_read_bytes_total", "Payload bytes read.", f.bytes_read);
	PROM_COUNTER(p, "l3kv_file_writes_total", "Object writes finished.", f.writes);
	PROM_COUNTER(p, "l3kv_file_write_failures_total", "Writes that failed (never visible).",
	    f.write_failures);
	PROM_COUNTER(p, "l3kv_file_write_nospace_total", "Of the failed writes: ENOSPC or EDQUOT.",
	    f.write_nospace);
	PROM_COUNTER(p, "l3kv_file_write_nospace_retries_total",
	    "Writes that found the filesystem full, evicted and wrote again.",
	    f.write_nospace_retries);
	PROM_COUNTER(p, "l3kv_file_writes_refused_total", "Writes refused: the write queue was full.",
	    f.writes_refused);
	PROM_COUNTER(p, "l3kv_file_writes_present_total", "Writes of a file that was there already.",
	    f.writes_present);
	PROM_GAUGE(p, "l3kv_file_writes_inflight", "Writes queued or running.", f.writes_inflight);
	PROM_COUNTER(p, "l3kv_file_written_bytes_total", "Payload bytes written.", f.bytes_written);
	PROM_COUNTER(p, "l3kv_file_scan_objects_total", "Objects the startup scans indexed.",
	    f.scan_objects);
	PROM_COUNTER(p, "l3kv_file_scan_removed_total",
	    "Bad objects, stale temp files and junk the scans removed.", f.scan_removed);
	prom_family(p, "l3kv_file_scan_seconds", "gauge", "Time the startup scans took.");
	prom_printf(p, "l3kv_file_scan_seconds{%s} %.3f\n", p->role, (double)f.scan_ms / 1000.0);
	PROM_COUNTER(p, "l3kv_file_dirs_recreated_total",
	    "Namespace directories deleted while running, made again.", f.dirs_recreated);
	publish_backlog_stats(s, &dirty, &dirty_bytes, &waiting, &waiting_bytes);
	PROM_COUNTER(p, "l3kv_write_through_queued_total", "Write-throughs handed to the file tier.",
	    metrics.file_writes);
	PROM_COUNTER(p, "l3kv_write_through_failed_total",
	    "Write-throughs refused or failed (the object stays in DRAM only).",
	    metrics.file_writes_failed);
	PROM_COUNTER(p, "l3kv_write_through_present_total",
	    "Write-throughs of an object the file tier had.", metrics.file_writes_present);
	PROM_COUNTER(p, "l3kv_write_through_deferred_total",
	    "Write-throughs that waited in the backlog.", metrics.file_writes_deferred);
	PROM_GAUGE(p, "l3kv_write_through_dirty_objects",
	    "Objects acknowledged and not on file yet (the file backlog).", dirty);
	PROM_GAUGE(p, "l3kv_write_through_dirty_bytes", "Bytes of the dirty objects.", dirty_bytes);
	PROM_GAUGE(p, "l3kv_write_through_backlog_objects",
	    "Dirty objects not handed to the file tier yet.", waiting);
	PROM_GAUGE(p, "l3kv_write_through_backlog_bytes", "Bytes of the backlog objects.",
	    waiting_bytes);
}

static void
prom_hist(struct prom *p, const char *name, const char *help, unsigned op, const char *ok,
    const char *failed)
{
	const struct metrics_hist	*h;
	uint64_t			 cum;
	unsigned			 r, i;

	prom_family(p, name, "histogram", help);
	for (r = 0; r < 2; r++) {
		const char	*res = r == 0 ? ok : failed;

		if (res == NULL)
			continue;
		h = &metrics_hist[op][r];
		for (i = 0, cum = 0; i <= METRICS_HIST_BOUNDS; i++) {
			cum += h->bucket[i];
			if (i < METRICS_HIST_BOUNDS)
				prom_printf(p, "%s_bucket{%s,result=\"%s\",le=\"%g\"} %llu\n", name,
				    p->role, res, (double)metrics_hist_bounds_ns[i] / 1e9,
				    (unsigned long long)cum);
			else
				prom_printf(p, "%s_bucket{%s,result=\"%s\",le=\"+Inf\"} %llu\n", name,
				    p->role, res, (unsigned long long)cum);
		}
		prom_printf(p, "%s_sum{%s,result=\"%s\"} %.9f\n", name, p->role, res,
		    (double)h->sum_ns / 1e9);
		prom_printf(p, "%s_count{%s,result=\"%s\"} %llu\n", name, p->role, res,
		    (unsigned long long)h->count);
	}
}

static void
prom_daemon(struct prom *p, struct server *s)
{
	char		 model[2 * sizeof(s->cfg->model)], why[160];
	unsigned	 nsess = 0, ngroups;
	struct rank_group *g;
	struct conn	*c;

	TAILQ_FOREACH(c, &s->conns, entry)
		nsess += c->session != NULL;
	prom_escape(model, sizeof(model), s->cfg->model);
	prom_family(p, "l3kv_info", "gauge", "The daemon: version, model, copy engine (always 1).");
	prom_printf(p, "l3kv_info{%s,version=\"%s\",model=\"%s\",copy_engine=\"%s\"} 1\n", p->role,
	    L3KV_VERSION, model, s->gpu_present ? "cuda" : "host");
	PROM_GAUGE(p, "l3kv_uptime_seconds", "Seconds since the daemon started.",
	    (server_now_ms() - s->started_ms) / 1000);
	PROM_GAUGE(p, "l3kv_ready", "1 while /ready answers 200.", (uint64_t)prom_ready(s, why,
	    sizeof(why)));
	PROM_GAUGE(p, "l3kv_draining", "1 while the daemon drains to stop.", (uint64_t)s->stopping);
	PROM_GAUGE(p, "l3kv_connections_open", "Engine connections open.", metrics.connections_open);
	PROM_COUNTER(p, "l3kv_connections_accepted_total", "Engine connections accepted.",
	    metrics.connections_accepted);
	PROM_COUNTER(p, "l3kv_connections_denied_total",
	    "Connections refused: credentials not allowed.", metrics.connections_denied);
	PROM_COUNTER(p, "l3kv_connections_limited_total",
	    "Connections refused: a connection limit, or no file descriptor.",
	    metrics.connections_limited);
	PROM_COUNTER(p, "l3kv_connections_no_fd_total",
	    "Of the limited: refused at EMFILE or ENFILE.", metrics.connections_no_fd);
	PROM_COUNTER(p, "l3kv_connections_timed_out_total",
	    "Connections closed at the HELLO, ATTACH or frame deadline.",
	    metrics.connections_timed_out);
	PROM_COUNTER(p, "l3kv_connections_slow_total",
	    "Connections closed: replies not drained in limits.output_timeout_ms.",
	    metrics.connections_slow);
	PROM_COUNTER(p, "l3kv_frames_received_total", "Frames received.", metrics.frames_in);
	PROM_COUNTER(p, "l3kv_frames_sent_total", "Frames sent.", metrics.frames_out);
	PROM_COUNTER(p, "l3kv_frames_bad_total", "Malformed frames (answered, then closed).",
	    metrics.frames_bad);
	PROM_COUNTER(p, "l3kv_received_bytes_total", "Bytes received on engine sockets.",
	    metrics.bytes_in);
	PROM_COUNTER(p, "l3kv_sent_bytes_total", "Bytes sent on engine sockets.", metrics.bytes_out);
	PROM_COUNTER(p, "l3kv_attaches_total", "ATTACH requests accepted.", metrics.attaches);
	PROM_COUNTER(p, "l3kv_attaches_refused_total", "ATTACH requests refused.",
	    metrics.attaches_refused);
	PROM_COUNTER(p, "l3kv_guards_refused_total", "Policies refused by a guard.",
	    metrics.guards_refused);
	PROM_COUNTER(p, "l3kv_detaches_total", "DETACH requests answered.", metrics.detaches);
	PROM_GAUGE(p, "l3kv_sessions", "Engine ranks attached.", nsess);
	ngroups = 0;
	TAILQ_FOREACH(g, &s->groups, entry)
		ngroups++;
	/* Groups are counted, not labelled: engines choose their ids, without bound. */
	PROM_GAUGE(p, "l3kv_groups", "Engine instances (rank groups) attached.", ngroups);
	prom_family(p, "l3kv_admin_requests_total", "counter", "STATS and HEALTH requests.");
	prom_sample(p, "l3kv_admin_requests_total", "op=\"stats\"", metrics.stats_requests);
	prom_sample(p, "l3kv_admin_requests_total", "op=\"health\"", metrics.health_requests);
	PROM_GAUGE(p, "l3kv_regions_mapped", "Engine memory regions mapped.", metrics.regions_mapped);
	PROM_GAUGE(p, "l3kv_region_mapped_bytes", "Bytes of engine memory mapped.",
	    metrics.region_bytes_mapped);
	PROM_GAUGE(p, "l3kv_events_open", "CUDA IPC events registered.", metrics.events_open);
	PROM_GAUGE(p, "l3kv_copy_jobs_inflight", "Copy jobs in flight on both copy engines.",
	    (s->copy != NULL ? copy_inflight(s->copy) : 0) + cuda_inflight(s->cuda));
	PROM_GAUGE(p, "l3kv_copy_waiting_on_events", "GPU copies waiting for an engine's event.",
	    cuda_waiting_on_events(s->cuda));
	prom_family(p, "l3kv_http_requests_total", "counter", "Requests to metrics.listen, by path.");
	prom_sample(p, "l3kv_http_requests_total", "path=\"/metrics\"", metrics.http_requests[0]);
	prom_sample(p, "l3kv_http_requests_total", "path=\"/health\"", metrics.http_requests[1]);
	prom_sample(p, "l3kv_http_requests_total", "path=\"/ready\"", metrics.http_requests[2]);
	prom_sample(p, "l3kv_http_requests_total", "path=\"other\"", metrics.http_requests[3]);
	prom_family(p, "l3kv_http_scrape_seconds", "gauge",
	    "Time the loop spent printing the previous /metrics.");
	prom_printf(p, "l3kv_http_scrape_seconds{%s} %.9f\n", p->role,
	    (double)metrics.http_scrape_ns / 1e9);
	PROM_COUNTER(p, "l3kv_http_rejected_total", "HTTP requests of a method other than GET, HEAD.",
	    metrics.http_rejected);
	prom_family(p, "l3kv_http_connections_closed_total", "counter",
	    "HTTP connections the daemon closed, by reason.");
	prom_sample(p, "l3kv_http_connections_closed_total", "reason=\"limit\"",
	    metrics.http_conns_refused);
	prom_sample(p, "l3kv_http_connections_closed_total", "reason=\"deadline\"",
	    metrics.http_conns_expired);
}

/* A family of every cuda copy engine: a field of struct cuda_dev_stats, 4 or 8 bytes. */
struct prom_dev_family {
	const char	*name;
	const char	*type;
	const char	*help;
	size_t		 off;
	size_t		 size;
};

#define PROM_DEVF(name, type, help, field)					\
	{ name, type, help, offsetof(struct cuda_dev_stats, field),		\
	    sizeof(((struct cuda_dev_stats *)0)->field) }

/* Every field is a uint64_t or a 4-byte int or unsigned. */
_Static_assert(sizeof(unsigned) == sizeof(uint32_t), "unsigned is 4 bytes");

static const struct prom_dev_family prom_dev_families[] = {
	PROM_DEVF("l3kv_copy_device_started", "gauge",
	    "1 once the device's copy engine has started (at its first region).", started),
	PROM_DEVF("l3kv_copy_device_regions", "gauge", "Engine memory regions open on the device.",
	    regions),
	PROM_DEVF("l3kv_copy_device_jobs_inflight", "gauge", "Copy jobs running on the device.",
	    jobs_inflight),
	PROM_DEVF("l3kv_copy_device_jobs_total", "counter",
	    "Copy jobs the device's engine finished (restores and publishes).", jobs),
	PROM_DEVF("l3kv_copy_device_restores_total", "counter", "RESTORE copies finished.",
	    restores),
	PROM_DEVF("l3kv_copy_device_publishes_total", "counter", "PUBLISH copies finished.",
	    publishes),
	PROM_DEVF("l3kv_copy_device_jobs_failed_total", "counter",
	    "Copy jobs that did not end ok (failed, cancelled, refused).", failed),
	PROM_DEVF("l3kv_copy_device_bytes_total", "counter", "Bytes moved by jobs that ended ok.",
	    bytes),
	PROM_DEVF("l3kv_copy_device_staging_slots", "gauge",
	    "Staging slots of the device's engine (0 until it starts).", staging_slots),
	PROM_DEVF("l3kv_copy_device_staging_slots_in_use", "gauge",
	    "Staging slots holding a chunk now.", staging_in_use),
	PROM_DEVF("l3kv_copy_device_waiting_on_events", "gauge",
	    "Copies on the device waiting for an engine's event.", waiting_on_events),
};

/*
 * The cuda copy engines, a series per device the daemon may start,
 * labelled with its index (what a region claims), its GPU and that GPU's
 * UUID (uuid="" where the driver did not say). Without a GPU there are
 * no devices, and the families are left out rather than printed empty.
 */
static void
prom_devices(struct prom *p, struct server *s)
{
	struct cuda_dev_stats	 st[CUDA_ENGINES_MAX];
	char			 l[CUDA_ENGINES_MAX][CUDA_UUID_LEN * 2 + 64], uuid[CUDA_UUID_LEN * 2];
	const char		*f;
	uint64_t		 v64;
	uint32_t		 v32;
	unsigned		 i, n = cuda_devices(s->cuda);
	size_t			 k;

	if (n > sizeof(st) / sizeof(st[0]))
		n = sizeof(st) / sizeof(st[0]);
	for (i = 0; i < n; i++) {
		cuda_dev_stats(s->cuda, i, &st[i]);
		prom_escape(uuid, sizeof(uuid), st[i].uuid);
		snprintf(l[i], sizeof(l[i]), "device=\"%u\",gpu=\"%d\",uuid=\"%s\"", st[i].device,
		    st[i].gpu, uuid);
	}
	for (k = 0; n > 0 && k < sizeof(prom_dev_families) / sizeof(prom_dev_families[0]); k++) {
		const struct prom_dev_family *fam = &prom_dev_families[k];

		prom_family(p, fam->name, fam->type, fam->help);
		for (i = 0; i < n; i++) {
			f = (const char *)&st[i] + fam->off;
			if (fam->size == sizeof(v64)) {
				memcpy(&v64, f, sizeof(v64));
			} else {
				memcpy(&v32, f, sizeof(v32));
				v64 = v32;
			}
			prom_sample(p, fam->name, l[i], v64);
		}
	}
}

/* The whole exposition, appended to b: 0, or -ENOMEM. */
int
prom_write(struct server *s, struct evbuffer *b)
{
	struct prom	p;
	char		role[sizeof(s->cfg->role) * 2];

	memset(&p, 0, sizeof(p));
	p.b = b;
	prom_escape(role, sizeof(role), s->cfg->role);
	snprintf(p.role, sizeof(p.role), "role=\"%s\"", role);
	prom_daemon(&p, s);
	prom_devices(&p, s);
	prom_cache(&p);
	prom_hist(&p, "l3kv_probe_duration_seconds", "PROBE, from the request to its answer.",
	    METRICS_OP_PROBE, "ok", NULL);
	prom_hist(&p, "l3kv_admit_duration_seconds",
	    "ADMIT, from a rank's request to its answer (the group barrier included).",
	    METRICS_OP_ADMIT, "admitted", "declined");
	prom_hist(&p, "l3kv_restore_duration_seconds",
	    "RESTORE, from the request to its answer (staging and the copy included).",
	    METRICS_OP_RESTORE, "ready", "failed");
	prom_hist(&p, "l3kv_publish_duration_seconds",
	    "PUBLISH, from the request to its acknowledgement.", METRICS_OP_PUBLISH, "stored",
	    "failed");
	prom_namespaces(&p, s);
	prom_tiers_write(&p, s);
	return p.failed ? -ENOMEM : 0;
}

/*
 * Ready: accepting engines, and every configured tier up. The DRAM tier
 * is up while it exists; the file tier is down while its last
 * write-through failed (other than a full filesystem), until one goes
 * through. Nothing here touches a filesystem: a hung shared filesystem
 * must not hang the loop through a probe.
 */
int
prom_ready(struct server *s, char *why, size_t len)
{
	if (s->stopping) {
		snprintf(why, len, "draining: the daemon is stopping");
		return 0;
	}
	if (s->listen_fd < 0) {
		snprintf(why, len, "not accepting on %s", s->cfg->socket_path);
		return 0;
	}
	if (s->dram == NULL) {
		snprintf(why, len, "tier dram is down");
		return 0;
	}
	if (s->file != NULL && metrics.file_write_error != 0) {
		snprintf(why, len, "tier file is down: the last write-through failed: %s",
		    strerror(-metrics.file_write_error));
		return 0;
	}
	snprintf(why, len, "ready");
	return 1;
}
