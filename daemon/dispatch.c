/*
 * The dispatcher: one handler per request type, called by conn.c with a
 * frame whose header and payload length were already checked. Handlers
 * validate fields, act, and answer exactly once. Errors in a well-framed
 * request are answered with their status and the connection stays open;
 * only framing errors (conn.c) close it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	metrics.attaches++;
	log_info("attach", "conn %llu (pid %d): session %u in %s, group %s rank %u/%u",
	    (unsigned long long)c->id, (int)c->pid, sess->id, sess->ns->name, sess->group->id,
	    sess->group_rank, sess->group->size);
	conn_reply(c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
}

static void
dispatch_detach(struct conn *c, struct proto_frame *f)
{
	if (c->session == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "not attached");
		return;
	}
	log_info("attach", "conn %llu: session %u detached", (unsigned long long)c->id,
	    c->session->id);
	session_free(c->session);
	c->session = NULL;
	metrics.detaches++;
	conn_reply(c, &f->hdr, PROTO_S_OK, NULL, 0);
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

void
dispatch_frame(struct conn *c, struct proto_frame *f)
{
	if (!(c->flags & CONN_F_HELLO) && f->hdr.type != PROTO_T_HELLO) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "%s before HELLO",
		    proto_type_name(f->hdr.type));
		return;
	}
	switch (f->hdr.type) {
	case PROTO_T_HELLO:
		dispatch_hello(c, f);
		break;
	case PROTO_T_ATTACH:
		dispatch_attach(c, f);
		break;
	case PROTO_T_DETACH:
		dispatch_detach(c, f);
		break;
	case PROTO_T_STATS:
		metrics.stats_requests++;
		dispatch_json(c, f, metrics_stats_json(c->server));
		break;
	case PROTO_T_HEALTH:
		metrics.health_requests++;
		dispatch_json(c, f, metrics_health_json(c->server));
		break;
	default:
		/* proto_hdr_check() let through only served types. */
		conn_reply_error(c, &f->hdr, PROTO_S_BAD_TYPE, "type %u is not served",
		    f->hdr.type);
		break;
	}
}
