/*
 * Sessions: one attached engine rank. ATTACH validates everything first
 * (layout, policies and guards, the group, the configured model, the live
 * slot list), then maps the memory regions, then joins the namespace and
 * the group; a failure at any step unwinds the earlier ones in reverse,
 * so a refused ATTACH leaves the daemon exactly as it was.
 *
 * A session is reference counted (daemon.h says why): the connection's
 * reference goes at DETACH or disconnect through session_close() (called
 * from dispatch_session_end(), the one teardown path), which cancels what
 * is in flight and releases what is held; each copy job's
 * reference goes when its completion ran. The last one unmaps the memory.
 */
#include <sys/stat.h>

#include <errno.h>
#include <stdarg.h>
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

/*
 * A region must hold whole objects of its pool: a page region one page of
 * tokens x layers x bytes per page, a slot region one checkpoint per slot.
 */
static int
session_check_geometry(const struct proto_attach_view *v, char *err, size_t errlen)
{
	unsigned	i;

	for (i = 0; i < v->fixed.nregions; i++) {
		const struct proto_region	*r = &v->regions[i];
		const struct proto_pool		*p = &v->pools[r->pool];
		uint64_t			 bytes;

		if (!region_is_memory(r))
			continue;

		bytes = (uint64_t)r->page_tokens * r->layers * r->token_bytes;
		if (bytes != p->object_bytes) {
			snprintf(err, errlen, "regions[%u]: a page of %llu bytes does not hold one "
			    "%llu-byte object of pool %s", i, (unsigned long long)bytes,
			    (unsigned long long)p->object_bytes, p->name);
			return -EINVAL;
		}
		if ((p->kind == PROTO_POOL_STATE) != (r->layout == PROTO_LAYOUT_SLOTS)) {
			snprintf(err, errlen, "regions[%u]: pool %s needs a %s region", i, p->name,
			    p->kind == PROTO_POOL_STATE ? "slot" : "page");
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * Whether regions a and b describe the same allocation: one memfd (the
 * same inode, whichever fd index carried it), one cuMem fd (the same fd
 * index: every cuMem export may share one anonymous inode, so the inode
 * says nothing there), or one CUDA IPC handle. fds are the frame's,
 * borrowed.
 */
static int
session_same_memory(const struct proto_region *a, const struct proto_region *b,
    const struct proto_frame *f)
{
	struct stat	sa, sb;

	if (a->kind != b->kind)
		return 0;
	if (a->kind == PROTO_MEM_CUDA_IPC)
		return memcmp(a->handle, b->handle, sizeof(a->handle)) == 0;
	if (a->fd_index >= f->nfds || b->fd_index >= f->nfds)
		return 0;	/* session_map_regions refuses it */
	if (a->fd_index == b->fd_index)
		return 1;
	if (a->kind != PROTO_MEM_MEMFD)
		return 0;
	if (fstat(f->fds[a->fd_index], &sa) != 0 || fstat(f->fds[b->fd_index], &sb) != 0)
		return 0;
	return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/*
 * Live state is sacred (docs/contract.md, item 6): no other region may
 * reach into the state-slot region's bytes, or a KV or sidecar restore
 * would write a live slot. (Distinct slots of the slot region itself never
 * overlap: proto_region_alias refused such a geometry.)
 */
static int
session_check_slot_overlap(const struct proto_attach_view *v, const struct proto_frame *f,
    char *err, size_t errlen)
{
	const struct proto_region	*sr;
	int				 slots = session_slot_region(v);
	uint64_t			 s0, s1;
	unsigned			 i;

	if (slots < 0)
		return 0;
	sr = &v->regions[slots];
	s0 = sr->offset;
	s1 = sr->offset + proto_region_extent(sr);	/* checked: no overflow */
	for (i = 0; i < v->fixed.nregions; i++) {
		const struct proto_region	*r = &v->regions[i];
		uint64_t			 r0 = r->offset, r1;

		if ((int)i == slots || !region_is_memory(r) || !session_same_memory(r, sr, f))
			continue;
		r1 = r->offset + proto_region_extent(r);
		if (r0 < s1 && s0 < r1) {
			snprintf(err, errlen, "regions[%u]: bytes [%llu, %llu) overlap the state slots "
			    "of regions[%d] at [%llu, %llu) in the same memory", i,
			    (unsigned long long)r0, (unsigned long long)r1, slots,
			    (unsigned long long)s0, (unsigned long long)s1);
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * Maps every region; fds are the frame's, borrowed. memfds are mapped
 * here for the host engine, GPU memory is opened by cuda.c; one session's
 * regions are all of one kind, since a copy job runs on one engine.
 */
static int
session_map_regions(struct session *sess, const struct proto_attach_view *v,
    const struct proto_frame *f, char *err, size_t errlen)
{
	struct server	*s = sess->server;
	char		 why[256];
	unsigned	 i, memfds = 0;
	int		 rc, fd;

	for (i = 0; i < v->fixed.nregions; i++)
		memfds += v->regions[i].kind == PROTO_MEM_MEMFD;
	for (i = 0; i < v->fixed.nregions; i++) {
		const struct proto_region *d = &v->regions[i];

		if (memfds > 0 && d->kind != PROTO_MEM_MEMFD) {
			snprintf(err, errlen, "regions[%u]: host (memfd) memory cannot be mixed with GPU "
			    "memory or CUDA events in one session", i);
			return -EINVAL;
		}
		if (d->kind == PROTO_MEM_CUDA_EVENT) {
			rc = cuda_event_open(s->cuda, s->cuda_none, &sess->regions[i], d, why,
			    sizeof(why));
			if (rc != 0) {
				snprintf(err, errlen, "regions[%u]: %s", i, why);
				return rc;
			}
			sess->nregions = i + 1;
			continue;
		}
		fd = -1;
		if (d->kind != PROTO_MEM_CUDA_IPC) {
			if (d->fd_index >= f->nfds) {
				snprintf(err, errlen, "regions[%u].fd_index: %u but the frame carried %d fds",
				    i, d->fd_index, f->nfds);
				return -EBADF;
			}
			fd = f->fds[d->fd_index];
		}
		if (d->kind == PROTO_MEM_MEMFD)
			rc = region_map(&sess->regions[i], d, fd, why, sizeof(why));
		else
			rc = cuda_region_open(s->cuda, s->cuda_none, sess->regions, i, d, fd, why,
			    sizeof(why));
		if (rc != 0) {
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
	if (rc == -EUSERS)
		return PROTO_S_LIMIT;	/* limits.max_namespaces */
	if (rc == -EXDEV)
		return PROTO_S_WRONG_DEVICE;	/* GPU memory not on the device claimed */
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
	sess->refs = 1;
	sess->slot_region = -1;
	sess->server = s;
	sess->conn = c;
	TAILQ_INIT(&sess->leases);
	TAILQ_INIT(&sess->probes);
	sess->group_rank = v.fixed.group_rank;
	sess->tp_rank = v.fixed.tp_rank;
	sess->shard = v.fixed.layout.attention == PROTO_ATTN_MLA ? v.fixed.layout.dcp_rank :
	    v.fixed.tp_rank;
	sess->prefetch = v.fixed.prefetch;
	sess->prefetch_timeout_ms = v.fixed.prefetch_timeout_ms;
	if ((rc = session_check_geometry(&v, err, errlen)) != 0)
		goto fail;
	if ((rc = session_load_live(sess, &v, err, errlen)) != 0)
		goto fail;
	if ((rc = session_check_slot_overlap(&v, f, err, errlen)) != 0)
		goto fail;
	if ((rc = session_map_regions(sess, &v, f, err, errlen)) != 0)
		goto fail;
	sess->slot_region = session_slot_region(&v);
	if (sess->slot_region >= 0 &&
	    (sess->slot_held = calloc(v.regions[sess->slot_region].num_pages, 1)) == NULL) {
		snprintf(err, errlen, "out of memory for the slot table");
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = ns_ref(s, &v.fixed.layout, v.pools, &sess->ns, err, errlen)) == 0)
		sess->m = sess->ns->m;
	if (rc != 0)
		goto fail;
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
	session_close(sess);
	return session_status(rc);
}

void
session_ref(struct session *sess)
{
	sess->refs++;
}

/* Drops a reference; the last one unmaps the regions and frees. */
void
session_unref(struct session *sess)
{
	unsigned	i;

	if (sess == NULL || --sess->refs > 0)
		return;
	for (i = sess->nregions; i > 0; i--)
		region_unmap(&sess->regions[i - 1]);
	free(sess->slot_held);
	free(sess->live);
	free(sess);
}

/*
 * The engine is gone (disconnect) or leaving (DETACH): no more replies,
 * PROBEs waiting for the peer tier are dropped and pending admissions
 * decline (DETACH answered the rank's own of both already), in-flight
 * copies are cancelled (their completions release them), held leases
 * are released, and the rank leaves its group and namespace. Drops the
 * connection's reference.
 */
void
session_close(struct session *sess)
{
	struct server	*s;

	if (sess == NULL)
		return;
	s = sess->server;
	cache_probes_end(sess, 0);
	if (sess->group != NULL)
		admit_session_closing(sess, 0);
	restore_session_closing(sess);
	sess->conn = NULL;
	group_leave(s, sess);
	if (sess->ns != NULL) {
		ns_unref(s, sess->ns);
		sess->ns = NULL;
	}
	session_unref(sess);
}

/* The session's layout: questions the cache and the requests ask of it. */

/* Whether the layout has pools beyond kv: then stop points matter. */
int
session_is_hybrid(const struct session *sess)
{
	unsigned	i;

	for (i = 0; i < sess->ns->layout.npools; i++)
		if (sess->ns->pools[i].kind != PROTO_POOL_KV)
			return 1;
	return 0;
}

/* The first region registered for a pool, or -1. */
int
session_region_of_pool(const struct session *sess, unsigned pool)
{
	unsigned	i;

	for (i = 0; i < sess->nregions; i++)
		if (region_is_memory(&sess->regions[i].desc) && sess->regions[i].desc.pool == pool)
			return (int)i;
	return -1;
}

/* The first pool of a kind, or -1. */
int
session_pool_of(const struct session *sess, unsigned kind)
{
	unsigned	i;

	for (i = 0; i < sess->ns->layout.npools; i++)
		if (sess->ns->pools[i].kind == kind)
			return (int)i;
	return -1;
}

/*
 * The memory region a RESTORE or PUBLISH names: registered, and memory
 * (not an event). PROTO_S_OK with *out set, or a status with err filled.
 */
unsigned
session_memory_region(const struct session *sess, uint32_t idx, const struct region **out,
    char *err, size_t errlen)
{
	if (idx >= sess->nregions) {
		snprintf(err, errlen, "no region %u", idx);
		return PROTO_S_OUT_OF_BOUNDS;
	}
	if (!region_is_memory(&sess->regions[idx].desc)) {
		snprintf(err, errlen, "region %u is an event, not memory", idx);
		return PROTO_S_INVALID;
	}
	*out = &sess->regions[idx];
	return PROTO_S_OK;
}

/*
 * A copy job on this session's memory finished (its completion ran). A
 * DETACH that waited for the drain is answered now.
 */
void
session_job_done(struct session *sess)
{
	struct server	*s = sess->server;
	struct conn	*c = sess->conn;

	sess->jobs--;
	if (sess->jobs == 0 && sess->detach_waiting && c != NULL) {
		sess->detach_waiting = 0;
		dispatch_session_end(c, &sess->detach_req);
	}
	session_unref(sess);
	server_maybe_finish(s);	/* a shutdown drain may have waited for this copy */
}

/* Replies on the session's connection, if the engine is still there. */
int
session_reply(struct session *sess, const struct proto_hdr *req, unsigned status,
    const void *payload, uint32_t len)
{
	if (sess->conn == NULL)
		return -ENOTCONN;
	return conn_reply(sess->conn, req, status, payload, len);
}

int
session_reply_error(struct session *sess, const struct proto_hdr *req, unsigned status,
    const char *fmt, ...)
{
	char	msg[PROTO_ERRMSG_MAX + 1];
	va_list	ap;

	if (sess->conn == NULL)
		return -ENOTCONN;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return conn_reply_error(sess->conn, req, status, "%s", msg);
}
