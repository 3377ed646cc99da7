/*
 * The dispatcher: the engine connections' callbacks. dispatch_frame()
 * gets a frame whose header and payload length conn.c already checked and
 * looks up its handler in dispatch_table, indexed by the type numbers of
 * proto.c's list: proto.c says which types are served, this table how,
 * and dispatch_init() makes sure that the two agree. A table entry's
 * flags are the state a request needs (HELLO done, a session attached
 * and not detaching); handlers validate fields, act, and answer exactly
 * once. Errors in a well-framed request are answered with their status
 * and the connection stays open; only framing errors (conn.c) close it.
 *
 * A session ends in one place, dispatch_session_end(): when its
 * connection closes (the engine left or died), and at DETACH, at once or
 * once its copies drained.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon.h"

static void
dispatch_hello(struct conn *c, struct proto_frame *f)
{
	struct proto_hello		hello;
	struct proto_hello_reply	r;
	uint16_t			version;
	int				st;

	if (c->flags & CONN_F_HELLO) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "HELLO was already sent");
		return;
	}
	memcpy(&hello, f->payload, sizeof(hello));
	if ((st = proto_hello_check(&hello, &version)) != 0) {
		conn_reply_error(c, &f->hdr, st, "HELLO: client speaks versions %u..%u, daemon %u..%u",
		    hello.version_min, hello.version_max, PROTO_VERSION_MIN, PROTO_VERSION_MAX);
		if (st == PROTO_S_BAD_VERSION)
			conn_close(c);
		return;
	}
	c->flags |= CONN_F_HELLO;
	c->version = version;
	memcpy(c->client, hello.client, sizeof(c->client));
	memset(&r, 0, sizeof(r));
	r.version = version;
	r.caps = PROTO_CAP_HOST_COPY | PROTO_CAP_NONBLOCK |
	    (c->server->gpu_present ? PROTO_CAP_CUDA_COPY : 0);
	r.max_frame = c->server->cfg->max_frame;
	r.lease_ttl_ms = c->server->cfg->lease_ttl_ms;
	snprintf(r.server, sizeof(r.server), "l3kvd %s", L3KV_VERSION);
	snprintf(r.role, sizeof(r.role), "%s", c->server->cfg->role);
	log_debug("conn", "conn %llu: hello from \"%s\" pid %d uid %u", (unsigned long long)c->id,
	    c->client, (int)c->pid, (unsigned)c->uid);
	conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
}

static void
dispatch_attach(struct conn *c, struct proto_frame *f)
{
	struct proto_attach_reply	 r;
	struct session			*sess;
	char				 err[PROTO_ERRMSG_MAX + 1] = "";
	int				 st;

	if (c->session != NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "already attached as session %u",
		    c->session->id);
		return;
	}
	if (c->server->stopping) {
		conn_reply_error(c, &f->hdr, PROTO_S_SHUTTING_DOWN, "daemon is shutting down");
		return;
	}
	st = session_attach(c, f, &sess, &r, err, sizeof(err));
	if (st != PROTO_S_OK) {
		metrics.attaches_refused++;
		log_info("attach", "conn %llu (pid %d): refused: %s: %s", (unsigned long long)c->id,
		    (int)c->pid, proto_status_name(st), err);
		conn_reply_error(c, &f->hdr, st, "%s", err);
		return;
	}
	c->session = sess;
	c->flags |= CONN_F_ATTACHED;
	metrics.attaches++;
	log_info("attach", "conn %llu (pid %d): session %u in %s, group %s rank %u/%u",
	    (unsigned long long)c->id, (int)c->pid, sess->id, sess->ns->name, sess->group->id,
	    sess->group_rank, sess->group->size);
	conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
}

/*
 * Ends the connection's session: the one teardown path. detach is the
 * DETACH to answer, NULL when the connection closed.
 */
void
dispatch_session_end(struct conn *c, const struct proto_hdr *detach)
{
	struct session		*sess = c->session;
	struct proto_hdr	 req;

	if (sess == NULL)
		return;
	if (detach != NULL)
		req = *detach;	/* it may live in the session */
	session_close(sess);
	c->session = NULL;
	c->flags &= ~CONN_F_ATTACHED;
	if (detach != NULL) {
		metrics.detaches++;
		conn_reply(c, &req, PROTO_S_OK, NULL, 0);
	}
}

static void
dispatch_detach(struct conn *c, struct proto_frame *f)
{
	if (c->session == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "not attached");
		return;
	}
	if (c->session->detach_waiting) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "already detaching");
		return;
	}
	log_info("attach", "conn %llu: session %u detached", (unsigned long long)c->id,
	    c->session->id);
	/*
	 * The engine still reads this connection: PROBEs waiting for peers,
	 * and the group's ADMITs waiting at its barrier (this rank's among
	 * them, rank_left), are answered first.
	 */
	cache_probes_end(c->session, 1);
	if (c->session->group != NULL)
		admit_session_closing(c->session, 1);
	if (c->session->jobs > 0) {
		/* Copies into this engine's memory drain first; then the answer. */
		c->session->detach_waiting = 1;
		c->session->detach_req = f->hdr;
		restore_session_closing(c->session);
		return;
	}
	dispatch_session_end(c, &f->hdr);
}

static void
dispatch_json(struct conn *c, struct proto_frame *f, char *json)
{
	if (json == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "out of memory");
		return;
	}
	conn_reply(c, &f->hdr, PROTO_S_OK, json, (uint32_t)strlen(json));
	free(json);
}

/* The cache operations need an attached session that is not detaching. */
static int
dispatch_need_session(struct conn *c, struct proto_frame *f)
{
	if (c->session == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "%s before ATTACH",
		    proto_type_name(f->hdr.type));
		return 0;
	}
	if (c->session->detach_waiting) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "%s while detaching",
		    proto_type_name(f->hdr.type));
		return 0;
	}
	return 1;
}

static void
dispatch_stats(struct conn *c, struct proto_frame *f)
{
	metrics.stats_requests++;
	dispatch_json(c, f, metrics_stats_json(c->server));
}

static void
dispatch_health(struct conn *c, struct proto_frame *f)
{
	metrics.health_requests++;
	dispatch_json(c, f, metrics_health_json(c->server));
}

/*
 * LIST: the module that owns the state lists it (ns_list, group_list,
 * lease_list), at most max entries (PROTO_LIST_MAX bounds it), and says
 * how many there were.
 */
static void
dispatch_list(struct conn *c, struct proto_frame *f)
{
	struct proto_list	 l;
	json_t			*j, *a;
	size_t			 max, total = 0;

	memcpy(&l, f->payload, sizeof(l));
	if (proto_list_check(&l) != PROTO_S_OK) {
		conn_reply_error(c, &f->hdr, PROTO_S_INVALID, "LIST: what %u flags 0x%x: what is "
		    "%u (namespaces), %u (groups) or %u (leases), flags 0", l.what, l.flags,
		    PROTO_LIST_NAMESPACES, PROTO_LIST_GROUPS, PROTO_LIST_LEASES);
		return;
	}
	max = l.max == 0 || l.max > PROTO_LIST_MAX ? PROTO_LIST_MAX : l.max;
	if ((a = json_array()) == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "out of memory");
		return;
	}
	switch (l.what) {
	case PROTO_LIST_NAMESPACES:
		ns_list(c->server, a, max, &total);
		break;
	case PROTO_LIST_GROUPS:
		group_list(c->server, a, max, &total);
		break;
	case PROTO_LIST_LEASES:
		lease_list(c->server, a, max, &total);
		break;
	}
	j = json_pack("{s:o, s:I, s:I, s:b}", proto_list_name(l.what), a,
	    "count", (json_int_t)json_array_size(a), "total", (json_int_t)total,
	    "truncated", total > json_array_size(a));
	dispatch_json(c, f, j != NULL ? json_dumps(j, JSON_COMPACT) : NULL);
	json_decref(j);
}

/* How each served type is handled, indexed by its number (proto.h). */
struct dispatch_entry {
	void	(*fn)(struct conn *, struct proto_frame *);
	int	 flags;
#define DISPATCH_F_HELLO	0x1	/* only after HELLO */
#define DISPATCH_F_SESSION	0x2	/* only attached and not detaching */
};

#define DISPATCH_CACHE_OP	(DISPATCH_F_HELLO | DISPATCH_F_SESSION)
static const struct dispatch_entry dispatch_table[PROTO_TYPES_MAX] = {
	[PROTO_T_HELLO] =	{ dispatch_hello, 0 },
	[PROTO_T_ATTACH] =	{ dispatch_attach, DISPATCH_F_HELLO },
	[PROTO_T_DETACH] =	{ dispatch_detach, DISPATCH_F_HELLO },
	[PROTO_T_STATS] =	{ dispatch_stats, DISPATCH_F_HELLO },
	[PROTO_T_HEALTH] =	{ dispatch_health, DISPATCH_F_HELLO },
	[PROTO_T_PROBE] =	{ cache_probe, DISPATCH_CACHE_OP },
	[PROTO_T_ADMIT] =	{ admit_request, DISPATCH_CACHE_OP },
	[PROTO_T_RESTORE] =	{ restore_request, DISPATCH_CACHE_OP },
	[PROTO_T_CANCEL] =	{ cancel_request, DISPATCH_CACHE_OP },
	[PROTO_T_RELEASE] =	{ release_request, DISPATCH_CACHE_OP },
	[PROTO_T_PUBLISH] =	{ publish_request, DISPATCH_CACHE_OP },
	[PROTO_T_SET_POLICY] =	{ group_set_policy, DISPATCH_CACHE_OP },
	[PROTO_T_RELOAD] =	{ reload_request, DISPATCH_F_HELLO },
	[PROTO_T_LIST] =	{ dispatch_list, DISPATCH_F_HELLO },
	[PROTO_T_DEBUG] =	{ cache_debug, DISPATCH_CACHE_OP },
};

/* At start: every type proto.c lets through has a handler, and only those. */
void
dispatch_init(void)
{
	unsigned	t;

	for (t = 0; t < PROTO_TYPES_MAX; t++)
		if (proto_type_served(t, PROTO_CHAN_ENGINE) != (dispatch_table[t].fn != NULL))
			fatalx("dispatch", "type %u (%s): %s", t, proto_type_name(t),
			    proto_type_served(t, PROTO_CHAN_ENGINE) ? "served by proto.c, no handler" :
			    "a handler for a type proto.c refuses");
}

/* conn.c's frame callback: one checked frame, borrowed with its fds. */
void
dispatch_frame(struct conn *c, struct proto_frame *f, void *arg)
{
	const struct dispatch_entry	*d;

	(void)arg;
	/* proto_hdr_check() let through only served types; dispatch_init() checked them. */
	if (f->hdr.type >= PROTO_TYPES_MAX || (d = &dispatch_table[f->hdr.type])->fn == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_BAD_TYPE, "type %u is not served",
		    f->hdr.type);
		return;
	}
	if ((d->flags & DISPATCH_F_HELLO) && !(c->flags & CONN_F_HELLO)) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "%s before HELLO",
		    proto_type_name(f->hdr.type));
		return;
	}
	if ((d->flags & DISPATCH_F_SESSION) && !dispatch_need_session(c, f))
		return;
	d->fn(c, f);
}
