/*
 * Groups: the ranks of one engine instance attached to this daemon.
 * Answers that must agree across ranks (probe, admission, restore
 * completion) are made per group, so a group knows its size, its
 * policies and which ranks are attached. A group lives while at least one
 * of its ranks is attached.
 *
 * The policy guards live here too, because they are group properties
 * checked before any side effect, at ATTACH and at every policy change.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon.h"

/*
 * docs/contract.md, item 9. DCP shards a prefix across ranks, so a rank
 * that ends early leaves a hole no other rank can fill: DCP > 1 requires
 * wait_complete; decode KV offload with DCP storage is refused; DCP
 * sharding is defined for MLA only.
 */
int
group_guard(uint16_t dcp_size, uint8_t prefetch, uint8_t write, uint8_t attention,
    char *err, size_t errlen)
{
	if (dcp_size <= 1)
		return 0;
	if (prefetch != PROTO_PREFETCH_WAIT_COMPLETE) {
		snprintf(err, errlen, "dcp_size %u requires prefetch policy wait_complete", dcp_size);
		return -EPERM;
	}
	if (write == PROTO_WRITE_OFFLOAD) {
		snprintf(err, errlen, "dcp_size %u refuses the offload write policy", dcp_size);
		return -EPERM;
	}
	if (attention != PROTO_ATTN_MLA) {
		snprintf(err, errlen, "dcp_size %u requires MLA attention", dcp_size);
		return -EPERM;
	}
	return 0;
}

static struct rank_group *
group_find(struct server *s, const char *id)
{
	struct rank_group	*g;

	TAILQ_FOREACH(g, &s->groups, entry)
		if (strcmp(g->id, id) == 0)
			return g;
	return NULL;
}

/*
 * Checks that a rank may join its group without changing anything;
 * group_join() then cannot fail for a reason other than memory.
 */
int
group_check(struct server *s, const struct proto_attach *a, char *err, size_t errlen)
{
	struct rank_group	*g;

	if ((g = group_find(s, a->group)) == NULL)
		return 0;
	if (g->size != a->group_size) {
		snprintf(err, errlen, "group %s has size %u, not %u", g->id, g->size, a->group_size);
		return -EXDEV;
	}
	if (g->prefetch != a->prefetch || g->write != a->write ||
	    g->prefetch_timeout_ms != a->prefetch_timeout_ms) {
		snprintf(err, errlen, "group %s is attached with other policies", g->id);
		return -EXDEV;
	}
	if (g->members[a->group_rank] != NULL) {
		snprintf(err, errlen, "group %s rank %u is already attached", g->id, a->group_rank);
		return -EEXIST;
	}
	return 0;
}

/* Adds a checked rank to its group, creating the group. 0 or -ENOMEM. */
int
group_join(struct server *s, struct session *sess, const struct proto_attach *a,
    struct rank_group **out)
{
	struct rank_group	*g;

	if ((g = group_find(s, a->group)) == NULL) {
		if ((g = calloc(1, sizeof(*g))) == NULL)
			return -ENOMEM;
		if ((g->members = calloc(a->group_size, sizeof(*g->members))) == NULL) {
			free(g);
			return -ENOMEM;
		}
		snprintf(g->id, sizeof(g->id), "%s", a->group);
		g->size = a->group_size;
		g->prefetch = a->prefetch;
		g->write = a->write;
		g->prefetch_timeout_ms = a->prefetch_timeout_ms;
		TAILQ_INIT(&g->admissions);
		TAILQ_INSERT_TAIL(&s->groups, g, entry);
		log_debug("group", "group %s (size %u) created", g->id, g->size);
	}
	g->members[a->group_rank] = sess;
	g->nmembers++;
	*out = g;
	return 0;
}

/* Removes a session from its group; frees the group with its last rank. */
void
group_leave(struct server *s, struct session *sess)
{
	struct rank_group	*g = sess->group;

	if (g == NULL)
		return;
	if (g->members[sess->group_rank] == sess) {
		g->members[sess->group_rank] = NULL;
		g->nmembers--;
	}
	sess->group = NULL;
	if (g->nmembers > 0)
		return;
	TAILQ_REMOVE(&s->groups, g, entry);
	log_debug("group", "group %s has no ranks", g->id);
	admit_group_gone(s, g);
	free(g->members);
	free(g);
}

/*
 * Whether the group has a restore under way: an admission still waiting
 * for its ranks, or a lease admitted and not yet restored, restoring, or
 * waiting for the rest of its group. A policy change must not move under
 * those; ended leases (ready, failed, cancelled, expired) do not count.
 */
static int
group_busy(const struct rank_group *g)
{
	const struct admission	*a;
	const struct lease	*l;
	unsigned		 r;

	TAILQ_FOREACH(a, &g->admissions, entry)
		if (!a->answered)
			return 1;
	for (r = 0; r < g->size; r++) {
		if (g->members[r] == NULL)
			continue;
		TAILQ_FOREACH(l, &g->members[r]->leases, entry)
			if (l->state == LEASE_ADMITTED || l->state == LEASE_RESTORING ||
			    l->state == LEASE_COPIED)
				return 1;
	}
	return 0;
}

/*
 * SET_POLICY: validated and guarded before any side effect, refused while
 * the group is busy; the same policy again changes nothing.
 */
void
group_set_policy(struct conn *c, struct proto_frame *f)
{
	struct proto_set_policy	 p;
	struct session		*sess = c->session;
	struct rank_group	*g = sess->group;
	char			 err[PROTO_ERRMSG_MAX + 1];
	unsigned		 r;

	memcpy(&p, f->payload, sizeof(p));
	if (p.pad != 0 || p.prefetch < PROTO_PREFETCH_WAIT_COMPLETE ||
	    p.prefetch > PROTO_PREFETCH_TIMEOUT || p.write < PROTO_WRITE_THROUGH ||
	    p.write > PROTO_WRITE_OFFLOAD ||
	    (p.prefetch == PROTO_PREFETCH_TIMEOUT && p.prefetch_timeout_ms == 0)) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID,
		    "SET_POLICY: prefetch %u, write %u, timeout %u ms is not a policy",
		    p.prefetch, p.write, p.prefetch_timeout_ms);
		return;
	}
	if (group_guard(sess->ns->layout.dcp_size, p.prefetch, p.write,
	    sess->ns->layout.attention, err, sizeof(err)) != 0) {
		metrics.guards_refused++;
		conn_reply_error(c, &f->hdr, PROTO_S_GUARD, "SET_POLICY: %s", err);
		return;
	}
	if (g->prefetch == p.prefetch && g->write == p.write &&
	    g->prefetch_timeout_ms == p.prefetch_timeout_ms) {
		conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
		return;
	}
	if (group_busy(g)) {
		conn_reply_error(c, &f->hdr, PROTO_S_BUSY,
		    "SET_POLICY: group %s has admissions or leases", g->id);
		return;
	}
	g->prefetch = p.prefetch;
	g->write = p.write;
	g->prefetch_timeout_ms = p.prefetch_timeout_ms;
	for (r = 0; r < g->size; r++) {
		if (g->members[r] == NULL)
			continue;
		g->members[r]->prefetch = p.prefetch;
		g->members[r]->prefetch_timeout_ms = p.prefetch_timeout_ms;
	}
	log_info("group", "group %s: policy now prefetch %u write %u timeout %u ms", g->id,
	    p.prefetch, p.write, p.prefetch_timeout_ms);
	conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
}

/* One group for LIST: its policies, its ranks (session, process), its admissions and leases. */
static json_t *
group_json(const struct rank_group *g)
{
	static const char *const prefetch[] = { "?", "wait_complete", "best_effort", "timeout" };
	static const char *const write[] = { "?", "write_through", "write_back", "offload" };
	const struct admission	*a;
	const struct session	*m;
	const struct lease	*l;
	json_t			*o, *members;
	unsigned		 r, waiting = 0, leases, all = 0;

	TAILQ_FOREACH(a, &g->admissions, entry)
		if (!a->answered)
			waiting++;
	members = json_array();
	for (r = 0; r < g->size; r++) {
		if ((m = g->members[r]) == NULL)
			continue;
		leases = 0;
		TAILQ_FOREACH(l, &m->leases, entry)
			leases++;
		all += leases;
		json_array_append_new(members, json_pack("{s:I, s:I, s:o, s:o, s:I, s:I, s:I}",
		    "rank", (json_int_t)r, "session", (json_int_t)m->id,
		    "pid", m->conn != NULL ? json_integer(m->conn->pid) : json_null(),
		    "uid", m->conn != NULL ? json_integer((json_int_t)m->conn->uid) : json_null(),
		    "tp_rank", (json_int_t)m->tp_rank, "shard", (json_int_t)m->shard,
		    "leases", (json_int_t)leases));
	}
	o = json_pack("{s:s, s:I, s:I, s:s, s:s, s:I, s:I, s:I}", "id", g->id,
	    "size", (json_int_t)g->size, "attached", (json_int_t)g->nmembers,
	    "prefetch", prefetch[g->prefetch <= PROTO_PREFETCH_TIMEOUT ? g->prefetch : 0],
	    "write", write[g->write <= PROTO_WRITE_OFFLOAD ? g->write : 0],
	    "prefetch_timeout_ms", (json_int_t)g->prefetch_timeout_ms,
	    "admissions_waiting", (json_int_t)waiting, "leases", (json_int_t)all);
	if (o == NULL) {
		json_decref(members);
		return NULL;
	}
	for (r = 0; r < g->size; r++)
		if (g->members[r] != NULL) {
			json_object_set_new(o, "namespace", json_string(g->members[r]->ns->name));
			break;
		}
	json_object_set_new(o, "members", members);
	return o;
}

void
group_list(struct server *s, json_t *array, size_t max, size_t *total)
{
	const struct rank_group	*g;

	*total = 0;
	TAILQ_FOREACH(g, &s->groups, entry)
		if ((*total)++ < max)
			json_array_append_new(array, group_json(g));
}
