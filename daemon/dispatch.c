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
	if (c->session->jobs > 0) {
		/* Copies into this engine's memory drain first; then the answer. */
		c->session->detach_waiting = 1;
		c->session->detach_req = f->hdr;
		restore_session_closing(c->session);
		return;
	}
	session_close(c->session);
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

void
dispatch_frame(struct conn *c, struct proto_frame *f)
{
	if (!(c->flags & CONN_F_HELLO) && f->hdr.type != PROTO_T_HELLO) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "%s before HELLO",
		    proto_type_name(f->hdr.type));
		return;
	}
	switch (f->hdr.type) {
	case PROTO_T_PROBE:
	case PROTO_T_ADMIT:
	case PROTO_T_RESTORE:
	case PROTO_T_CANCEL:
	case PROTO_T_RELEASE:
	case PROTO_T_PUBLISH:
	case PROTO_T_SET_POLICY:
	case PROTO_T_DEBUG:
		if (!dispatch_need_session(c, f))
			return;
		break;
	case PROTO_T_DETACH:
		if (c->session != NULL && c->session->detach_waiting) {
			conn_reply_error(c, &f->hdr, PROTO_S_STATE, "already detaching");
			return;
		}
		break;
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
	case PROTO_T_PROBE:
		cache_probe(c, f);
		break;
	case PROTO_T_ADMIT:
		admit_request(c, f);
		break;
	case PROTO_T_RESTORE:
		restore_request(c, f);
		break;
	case PROTO_T_CANCEL:
		cancel_request(c, f);
		break;
	case PROTO_T_RELEASE:
		release_request(c, f);
		break;
	case PROTO_T_PUBLISH:
		publish_request(c, f);
		break;
	case PROTO_T_DEBUG:
		cache_debug(c, f);
		break;
	case PROTO_T_SET_POLICY:
		group_set_policy(c, f);
		break;
	default:
		/* proto_hdr_check() let through only served types. */
		conn_reply_error(c, &f->hdr, PROTO_S_BAD_TYPE, "type %u is not served",
		    f->hdr.type);
		break;
	}
}
