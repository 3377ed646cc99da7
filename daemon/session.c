/*
 * Sessions: one attached engine rank. ATTACH validates everything first
 * (layout, policies and guards, the group, the configured model, the live
 * slot list), then maps the memory regions, then joins the namespace and
 * the group; a failure at any step unwinds the earlier ones in reverse,
 * so a refused ATTACH leaves the daemon exactly as it was.
 *
 * A session is owned by its connection and freed with it or at DETACH.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

static int
session_cmp_u32(const void *a, const void *b)
{
	uint32_t	x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The state-slot region of a view, or -1 when none was registered. */
static int
session_slot_region(const struct proto_attach_view *v)
{
	unsigned	i;

	for (i = 0; i < v->fixed.nregions; i++)
		if (v->regions[i].layout == PROTO_LAYOUT_SLOTS)
			return (int)i;
	return -1;
}

/* Live slots: sorted, unique, inside the slot region. */
static int
session_load_live(struct session *sess, const struct proto_attach_view *v, char *err,
    size_t errlen)
{
	int		 slots = session_slot_region(v);
	uint32_t	 i, n = v->fixed.nlive;

	if (n == 0)
		return 0;
	if (slots < 0) {
		snprintf(err, errlen, "live slots given but no state-slot region registered");
		return -EINVAL;
	}
	if ((sess->live = malloc(n * sizeof(*sess->live))) == NULL) {
		snprintf(err, errlen, "out of memory for %u live slots", n);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		sess->live[i] = proto_attach_live(v, i);
		if (sess->live[i] >= v->regions[slots].num_pages) {
			snprintf(err, errlen, "live slot %u is outside the %u-slot region",
			    sess->live[i], v->regions[slots].num_pages);
			return -ERANGE;
		}
	}
	qsort(sess->live, n, sizeof(*sess->live), session_cmp_u32);
	for (i = 1; i < n; i++) {
		if (sess->live[i] == sess->live[i - 1]) {
			snprintf(err, errlen, "live slot %u listed twice", sess->live[i]);
			return -EINVAL;
		}
	}
	sess->nlive = n;
	return 0;
}

int
session_slot_is_live(const struct session *sess, uint32_t slot)
{
	return bsearch(&slot, sess->live, sess->nlive, sizeof(slot), session_cmp_u32) != NULL;
}

/* Maps every region; fds are the frame's, borrowed. */
static int
session_map_regions(struct session *sess, const struct proto_attach_view *v,
    const struct proto_frame *f, char *err, size_t errlen)
{
	char		why[256];
	unsigned	i;
	int		rc, fd;

	for (i = 0; i < v->fixed.nregions; i++) {
		const struct proto_region *d = &v->regions[i];

		fd = -1;
		if (d->kind != PROTO_MEM_CUDA_IPC) {
			if (d->fd_index >= f->nfds) {
				snprintf(err, errlen, "regions[%u].fd_index: %u but the frame carried %d fds",
				    i, d->fd_index, f->nfds);
				return -EBADF;
			}
			fd = f->fds[d->fd_index];
		}
		if ((rc = region_map(&sess->regions[i], d, fd, why, sizeof(why))) != 0) {
			snprintf(err, errlen, "regions[%u]: %s", i, why);
			return rc;
		}
		sess->nregions = i + 1;
	}
	return 0;
}

/* A failed registration step is a bad region unless memory ran out. */
static unsigned
session_status(int rc)
{
	return rc == -ENOMEM ? PROTO_S_NO_MEMORY : PROTO_S_BAD_REGION;
}

/*
 * Handles ATTACH for conn. On success *out is a new session owned by the
 * caller and reply is filled; otherwise returns a PROTO_S_* status with
 * err filled, and nothing in the daemon changed.
 */
int
session_attach(struct conn *c, const struct proto_frame *f, struct session **out,
    struct proto_attach_reply *reply, char *err, size_t errlen)
{
	static struct proto_attach_view	 v;	/* 9 KiB: not on the stack */
	struct server			*s = c->server;
	struct session			*sess;
	int				 st, rc;

	*out = NULL;
	if ((st = proto_attach_decode(f->payload, f->hdr.length, &v, err, errlen)) != 0)
		return st;
	if (s->cfg->model[0] != '\0' && strcmp(s->cfg->model, v.fixed.layout.model) != 0) {
		snprintf(err, errlen, "layout.model: \"%s\" is not this daemon's model \"%s\"",
		    v.fixed.layout.model, s->cfg->model);
		return PROTO_S_INVALID;
	}
	if (group_guard(v.fixed.layout.dcp_size, v.fixed.prefetch, v.fixed.write,
	    v.fixed.layout.attention, err, errlen) != 0) {
		metrics.guards_refused++;
		return PROTO_S_GUARD;
	}
	if (group_check(s, &v.fixed, err, errlen) != 0)
		return PROTO_S_GROUP_MISMATCH;

	if ((sess = calloc(1, sizeof(*sess))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return PROTO_S_NO_MEMORY;
	}
	sess->conn = c;
	sess->group_rank = v.fixed.group_rank;
	sess->tp_rank = v.fixed.tp_rank;
	if ((rc = session_load_live(sess, &v, err, errlen)) != 0)
		goto fail;
	if ((rc = session_map_regions(sess, &v, f, err, errlen)) != 0)
		goto fail;
	if ((sess->ns = ns_ref(s, &v.fixed.layout, v.pools)) == NULL) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = group_join(s, sess, &v.fixed, &sess->group)) != 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	sess->id = ++s->next_session_id;

	memset(reply, 0, sizeof(*reply));
	memcpy(reply->fingerprint, sess->ns->fingerprint, sizeof(reply->fingerprint));
	snprintf(reply->ns, sizeof(reply->ns), "%s", sess->ns->name);
	reply->session = sess->id;
	reply->lease_ttl_ms = s->cfg->lease_ttl_ms;
	reply->group_members = sess->group->nmembers;
	*out = sess;
	return PROTO_S_OK;

fail:
	session_free(sess);
	return session_status(rc);
}

/* Releases everything a session holds, in reverse order. Idempotent on NULL. */
void
session_free(struct session *sess)
{
	struct server	*s;
	unsigned	 i;

	if (sess == NULL)
		return;
	s = sess->conn->server;
	group_leave(s, sess);
	if (sess->ns != NULL) {
		ns_unref(s, sess->ns);
		sess->ns = NULL;
	}
	for (i = sess->nregions; i > 0; i--)
		region_unmap(&sess->regions[i - 1]);
	free(sess->live);
	free(sess);
}
