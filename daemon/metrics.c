/*
 * Counters and the STATS / HEALTH documents. Counters are plain integers
 * owned by the loop thread; the JSON is built on demand with jansson, so
 * a STATS request costs nothing until it is asked for.
 */
#include <stdlib.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon.h"

struct metrics metrics;

static const char *
metrics_copy_engine(struct server *s)
{
	switch (s->cfg->copy_engine) {
	case CONFIG_COPY_CUDA:	return "cuda";
	case CONFIG_COPY_HOST:	return "host";
	}
	return s->gpu_present ? "cuda" : "host";
}

static json_t *
metrics_namespaces(struct server *s)
{
	json_t		*a = json_array();
	struct ns	*ns;

	TAILQ_FOREACH(ns, &s->namespaces, entry)
		json_array_append_new(a, json_pack("{s:s, s:s, s:I}", "name", ns->name,
		    "model", ns->layout.model, "sessions", (json_int_t)ns->refs));
	return a;
}

static json_t *
metrics_groups(struct server *s)
{
	json_t		*a = json_array();
	struct rank_group	*g;

	TAILQ_FOREACH(g, &s->groups, entry)
		json_array_append_new(a, json_pack("{s:s, s:I, s:I}", "id", g->id,
		    "size", (json_int_t)g->size, "attached", (json_int_t)g->nmembers));
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

/* The STATS document; returns a new string (free) or NULL. */
char *
metrics_stats_json(struct server *s)
{
	json_t	*j;
	char	*out;

	j = json_pack("{s:{s:s, s:s, s:s, s:I, s:I, s:s, s:b},"
	    " s:{s:I, s:I, s:I, s:I},"
	    " s:{s:I, s:I, s:I, s:I, s:I},"
	    " s:{s:I, s:I, s:I, s:I, s:I},"
	    " s:{s:I, s:I},"
	    " s:{s:I, s:I}}",
	    "daemon", "version", L3KV_VERSION, "role", s->cfg->role, "model", s->cfg->model,
	    "pid", I(getpid()), "uptime_ms", I(server_now_ms() - s->started_ms),
	    "copy_engine", metrics_copy_engine(s), "gpu", s->gpu_present,
	    "connections", "open", I(metrics.connections_open),
	    "accepted", I(metrics.connections_accepted), "denied", I(metrics.connections_denied),
	    "limited", I(metrics.connections_limited),
	    "frames", "in", I(metrics.frames_in), "out", I(metrics.frames_out),
	    "bad", I(metrics.frames_bad), "bytes_in", I(metrics.bytes_in),
	    "bytes_out", I(metrics.bytes_out),
	    "attach", "attaches", I(metrics.attaches), "refused", I(metrics.attaches_refused),
	    "guards_refused", I(metrics.guards_refused), "detaches", I(metrics.detaches),
	    "sessions", I(metrics_sessions(s)),
	    "requests", "stats", I(metrics.stats_requests), "health", I(metrics.health_requests),
	    "memory", "regions_mapped", I(metrics.regions_mapped),
	    "region_bytes_mapped", I(metrics.region_bytes_mapped));
	if (j == NULL)
		return NULL;
	json_object_set_new(j, "namespaces", metrics_namespaces(s));
	json_object_set_new(j, "groups", metrics_groups(s));
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

	j = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:b}",
	    "status", s->stopping ? "stopping" : "ok", "version", L3KV_VERSION,
	    "role", s->cfg->role, "uptime_ms", I(server_now_ms() - s->started_ms),
	    "connections", I(s->nconns), "sessions", I(metrics_sessions(s)),
	    "copy_engine", metrics_copy_engine(s), "gpu", s->gpu_present);
	if (j == NULL)
		return NULL;
	out = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return out;
}
