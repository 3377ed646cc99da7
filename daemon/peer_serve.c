/*
 * The peer tier's serving side: what another member asks on the control
 * connection it dialled. Its HELLO must name a member of this daemon's
 * list (not this daemon) of the same role, and come from the address the
 * list gives that member; with peer.secret set, its PEER_AUTH must prove
 * the secret before anything else is answered, and before anything its
 * HELLO says of the member (incarnation, endpoint, keys) is taken.
 *
 * - PEER_PROBE: which of the keys DRAM holds now, through dram_lookup
 *   alone: nothing is pinned, touched or moved (PROBE is free of side
 *   effects on every node). Neither it nor PEER_LEASE names an object
 *   this daemon pulled for a restore of its own that has not run yet:
 *   those bytes are checked by that restore (dram_unverified), never
 *   before, and are served only once it found them whole.
 * - PEER_LEASE: the objects held are pinned under the asker's lease id,
 *   bound to this connection, for at most min(its max_age_ms,
 *   peer.lease_max_ms); the answer names, per key (echoed), where to read
 *   it (address and key from fabric.c), its length and checksum.
 * - PEER_RELEASE: the pins of a lease go. So do they at its maximum age,
 *   and when the connection closes.
 * - PEER_OFFER: the publisher names objects it pinned; this daemon, their
 *   home, reserves a WRITING DRAM object for each it lacks, pulls it,
 *   verifies its checksum, commits it, and answers with the counts.
 *
 * Every field is checked before it is used: counts against the length
 * (proto.c did that), key padding, lengths against the tier's bound,
 * addresses and keys against the chunks the offerer's HELLO named.
 */
#include <sys/random.h>
#include <sys/socket.h>

#include <netinet/in.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "peer.h"

/* An owner lease: objects pinned here for a peer's pulls. */
struct peer_slease {
	uint64_t		 id;
	struct peer_in		*in;
	uint32_t		*ids;
	uint32_t		 n;
	struct event		*timer;
	TAILQ_ENTRY(peer_slease) entry;
};

/* An offer being pulled here. */
struct peer_offer_in {
	struct peer_in		*in;
	struct proto_hdr	 req;
	uint32_t		 pending;
	struct proto_peer_offer_reply r;
};

struct peer_offer_obj {
	struct peer_offer_in	*oi;
	struct server		*s;
	uint32_t		 did;
	uint64_t		 checksum;
};

/*
 * HMAC-SHA256 with peer.secret over "l3kv-peer-1", the verifier's nonce,
 * the prover's id (its 64-byte field) and incarnation.
 */
void
peer_proof(const struct peer_tier *t, const uint8_t *nonce, const char *id, uint64_t incarnation,
    uint8_t *out)
{
	const char	*secret = t->s->cfg->peer_secret;
	uint8_t		 msg[11 + PROTO_PEER_NONCE + PROTO_PEER_ID_LEN + 8];
	unsigned	 olen = PROTO_PEER_PROOF;

	memset(msg, 0, sizeof(msg));
	memcpy(msg, "l3kv-peer-1", 11);
	memcpy(msg + 11, nonce, PROTO_PEER_NONCE);
	strncpy((char *)msg + 11 + PROTO_PEER_NONCE, id, PROTO_PEER_ID_LEN - 1);
	memcpy(msg + 11 + PROTO_PEER_NONCE + PROTO_PEER_ID_LEN, &incarnation, 8);
	if (HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, sizeof(msg), out, &olen) == NULL)
		memset(out, 0, PROTO_PEER_PROOF);
}

static void
peer_slease_free(struct peer_tier *t, struct peer_slease *sl)
{
	uint32_t	i;

	for (i = 0; i < sl->n; i++)
		dram_unpin(t->s->dram, sl->ids[i]);
	t->pins -= sl->n;
	TAILQ_REMOVE(&sl->in->leases, sl, entry);
	event_free(sl->timer);
	free(sl->ids);
	free(sl);
}

static void
peer_slease_expire_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct peer_slease	*sl = arg;
	struct peer_tier	*t = sl->in->tier;

	(void)fd;
	(void)ev;
	t->leases_expired++;
	log_info("peer", "%s: lease %llu of %u objects reached its maximum age; unpinned",
	    sl->in->p != NULL ? sl->in->p->m.id : "?", (unsigned long long)sl->id, sl->n);
	peer_slease_free(t, sl);
}

/* The connection went: its leases' pins go; its offers finish and are not answered. */
void
peer_serve_closed(struct peer_in *in)
{
	while (!TAILQ_EMPTY(&in->leases))
		peer_slease_free(in->tier, TAILQ_FIRST(&in->leases));
	if (in->p != NULL) {
		peer_unref(in->p);
		in->p = NULL;
	}
}

static void
peer_refuse(struct peer_in *in, const struct proto_hdr *h, unsigned st, const char *why)
{
	in->tier->refused++;
	log_warn("peer", "refused a peer connection: %s", why);
	conn_reply_error(in->c, h, st, "%s", why);
	conn_close(in->c);
}

/* A connection's source IP as text, for the log. */
static const char *
peer_serve_addr(const struct sockaddr_storage *ss, char *buf, size_t len)
{
	const void	*a = ss->ss_family == AF_INET6 ?
	    (const void *)&((const struct sockaddr_in6 *)(const void *)ss)->sin6_addr :
	    (const void *)&((const struct sockaddr_in *)(const void *)ss)->sin_addr;

	if ((ss->ss_family != AF_INET && ss->ss_family != AF_INET6) ||
	    inet_ntop(ss->ss_family, a, buf, (socklen_t)len) == NULL)
		snprintf(buf, len, "an address of family %d", ss->ss_family);
	return buf;
}

/*
 * The member's HELLO is taken (at the HELLO without a secret, at a good
 * PEER_AUTH with one): what it says of reading the member replaces what
 * this daemon knew. Its counts were checked at the HELLO.
 */
static void
peer_serve_remote(struct peer_in *in, const struct proto_peer_hello *h)
{
	if (peer_set_remote(in->p, h) != 0)
		return;
	log_info("peer", "%s connected (incarnation %016llx)", in->p->m.id,
	    (unsigned long long)h->incarnation);
}

static void
peer_serve_hello(struct peer_in *in, struct proto_frame *f)
{
	struct peer_tier	*t = in->tier;
	struct proto_peer_hello	 h, r;
	struct peer		*p;
	char			 why[420], from[INET6_ADDRSTRLEN];

	if (in->p != NULL) {
		conn_reply_error(in->c, &f->hdr, PROTO_S_STATE, "PEER_HELLO was already sent");
		return;
	}
	memcpy(&h, f->payload, sizeof(h));
	switch (proto_peer_hello_check(&h)) {
	case PROTO_S_OK:
		break;
	case PROTO_S_BAD_VERSION:
		peer_refuse(in, &f->hdr, PROTO_S_BAD_VERSION, "PEER_HELLO: no common version");
		return;
	default:
		peer_refuse(in, &f->hdr, PROTO_S_INVALID, "PEER_HELLO: a bad id, role, provider, "
		    "incarnation or chunk");
		return;
	}
	if (strcmp(h.id, t->self.id) == 0 || strcmp(h.role, t->s->cfg->role) != 0) {
		snprintf(why, sizeof(why), "PEER_HELLO from \"%s\" of role \"%s\": this daemon is "
		    "\"%s\" of role \"%s\"", h.id, h.role, t->self.id, t->s->cfg->role);
		peer_refuse(in, &f->hdr, PROTO_S_PEER_ROLE, why);
		return;
	}
	if ((p = peer_by_id(t, h.id)) == NULL) {
		snprintf(why, sizeof(why), "PEER_HELLO from \"%s\": not in this daemon's member "
		    "list", h.id);
		peer_refuse(in, &f->hdr, PROTO_S_PEER_UNKNOWN, why);
		return;
	}
	/* Before anything of p changes: whoever knows an id must also be where p is. */
	if (!peer_source_ok(p, (const struct sockaddr *)&in->from)) {
		snprintf(why, sizeof(why), "PEER_HELLO as \"%s\" from %s, but the member list "
		    "has %s at %s", h.id, peer_serve_addr(&in->from, from, sizeof(from)), h.id,
		    p->m.addr);
		peer_refuse(in, &f->hdr, PROTO_S_PEER_UNKNOWN, why);
		return;
	}
	if (peer_hello_counts_ok(&h) != 0) {
		peer_refuse(in, &f->hdr, PROTO_S_INVALID, "PEER_HELLO: counts out of range");
		return;
	}
	in->p = p;
	peer_ref(p);
	in->authed = t->s->cfg->peer_secret[0] == '\0';
	/*
	 * With a secret, anyone where p is can send p's HELLO: what it says
	 * (a new incarnation dooms p's pulls, its endpoint and keys replace
	 * p's) waits for its PEER_AUTH's proof, and goes with a failed one.
	 */
	if (in->authed)
		peer_serve_remote(in, &h);
	else
		in->hello = h;
	in->c->flags |= CONN_F_HELLO | CONN_F_ATTACHED;
	memset(&r, 0, sizeof(r));
	r.version_min = r.version_max = PROTO_VERSION;
	snprintf(r.id, sizeof(r.id), "%s", t->self.id);
	snprintf(r.role, sizeof(r.role), "%s", t->s->cfg->role);
	r.incarnation = t->incarnation;
	if (getrandom(in->nonce, sizeof(in->nonce), GRND_NONBLOCK) != sizeof(in->nonce))
		memset(in->nonce, 0xa5, sizeof(in->nonce));
	memcpy(r.nonce, in->nonce, sizeof(r.nonce));
	peer_hello_data(t, &r);
	if (t->s->cfg->peer_secret[0] != '\0')
		peer_proof(t, h.nonce, t->self.id, t->incarnation, r.proof);
	conn_reply(in->c, &f->hdr, PROTO_S_OK, &r, sizeof(r));
}

static void
peer_serve_auth(struct peer_in *in, struct proto_frame *f)
{
	struct peer_tier	*t = in->tier;
	struct proto_peer_auth	 a;
	uint8_t			 want[PROTO_PEER_PROOF];

	memcpy(&a, f->payload, sizeof(a));
	if (t->s->cfg->peer_secret[0] != '\0') {
		/* Over the incarnation its HELLO claimed: that HELLO is not applied yet. */
		peer_proof(t, in->nonce, in->p->m.id, in->hello.incarnation, want);
		if (memcmp(want, a.proof, sizeof(want)) != 0) {
			peer_refuse(in, &f->hdr, PROTO_S_PEER_AUTH, "PEER_AUTH: the proof of the "
			    "shared secret is wrong");
			return;
		}
		if (!in->authed)
			peer_serve_remote(in, &in->hello);
	}
	in->authed = 1;
	conn_reply(in->c, &f->hdr, PROTO_S_OK, NULL, 0);
}

static void
peer_serve_probe(struct peer_in *in, struct proto_frame *f)
{
	struct peer_tier	*t = in->tier;
	struct proto_peer_probe	 ph;
	struct proto_peer_key	 w;
	struct obj_key		 k;
	uint8_t			*r;
	uint32_t		 i, id;

	memcpy(&ph, f->payload, sizeof(ph));
	if (ph.flags != 0) {
		conn_reply_error(in->c, &f->hdr, PROTO_S_INVALID, "PEER_PROBE: unknown flags");
		return;
	}
	if ((r = calloc(1, ph.nkeys > 0 ? ph.nkeys : 1)) == NULL) {
		conn_reply_error(in->c, &f->hdr, PROTO_S_NO_MEMORY, "PEER_PROBE: out of memory");
		return;
	}
	t->probes_served++;
	/* Without a data path nothing here can be read: every key is a miss. */
	for (i = 0; i < ph.nkeys && t->fab != NULL; i++) {
		memcpy(&w, f->payload + sizeof(ph) + (size_t)i * sizeof(w), sizeof(w));
		/* A copy this daemon pulled and no restore checked yet is not served. */
		r[i] = peer_key_in(&w, &k) == 0 && dram_lookup(t->s->dram, &k, &id) == 0 &&
		    !dram_unverified(t->s->dram, id);
	}
	conn_reply(in->c, &f->hdr, PROTO_S_OK, r, ph.nkeys);
	free(r);
}

static void
peer_serve_lease(struct peer_in *in, struct proto_frame *f)
{
	struct peer_tier	*t = in->tier;
	struct server		*s = t->s;
	struct proto_peer_lease	 lh;
	struct proto_peer_obj	 o;
	struct proto_peer_key	 w;
	struct peer_slease	*sl, *x;
	struct obj_key		 k;
	struct timeval		 tv;
	const uint8_t		*data;
	uint8_t			*buf;
	uint32_t		 i, id, age;

	memcpy(&lh, f->payload, sizeof(lh));
	TAILQ_FOREACH(x, &in->leases, entry)
		if (x->id == lh.lease) {
			conn_reply_error(in->c, &f->hdr, PROTO_S_INVALID, "PEER_LEASE: lease %llu is "
			    "already held", (unsigned long long)lh.lease);
			return;
		}
	age = lh.max_age_ms == 0 || lh.max_age_ms > s->cfg->peer_lease_max_ms ?
	    s->cfg->peer_lease_max_ms : lh.max_age_ms;
	buf = malloc(sizeof(lh) + (size_t)lh.nkeys * sizeof(o));
	sl = calloc(1, sizeof(*sl));
	if (buf == NULL || sl == NULL || (sl->ids = malloc((lh.nkeys > 0 ? lh.nkeys : 1) *
	    sizeof(*sl->ids))) == NULL || (sl->timer = evtimer_new(s->base, peer_slease_expire_cb,
	    sl)) == NULL) {
		if (sl != NULL)
			free(sl->ids);
		free(sl);
		free(buf);
		conn_reply_error(in->c, &f->hdr, PROTO_S_NO_MEMORY, "PEER_LEASE: out of memory");
		return;
	}
	sl->id = lh.lease;
	sl->in = in;
	for (i = 0; i < lh.nkeys; i++) {
		uint64_t len, csum;

		memcpy(&w, f->payload + sizeof(lh) + (size_t)i * sizeof(w), sizeof(w));
		memset(&o, 0, sizeof(o));
		o.key = w;
		if (t->fab != NULL && peer_key_in(&w, &k) == 0 && dram_lookup(s->dram, &k, &id) == 0 &&
		    !dram_unverified(s->dram, id) &&
		    (data = dram_data(s->dram, id, &len, &csum)) != NULL &&
		    fabric_rkey(t->fab, data, len, &o.raddr, &o.rkey) == 0 &&
		    dram_pin(s->dram, id) == 0) {
			o.present = 1;
			o.len = len;
			o.checksum = csum;
			if (s->cfg->test_peer_bad_key)
				o.rkey ^= 0x10001;
			sl->ids[sl->n++] = id;
		}
		memcpy(buf + sizeof(lh) + (size_t)i * sizeof(o), &o, sizeof(o));
	}
	memcpy(buf, &lh, sizeof(lh));
	t->leases_served++;
	t->objects_leased += sl->n;
	t->pins += sl->n;
	TAILQ_INSERT_TAIL(&in->leases, sl, entry);
	tv.tv_sec = age / 1000;
	tv.tv_usec = (age % 1000) * 1000;
	evtimer_add(sl->timer, &tv);
	conn_reply(in->c, &f->hdr, PROTO_S_OK, buf, (uint32_t)(sizeof(lh) + (size_t)lh.nkeys *
	    sizeof(o)));
	free(buf);
}

static void
peer_serve_release(struct peer_in *in, struct proto_frame *f)
{
	struct proto_peer_release	rel;
	struct peer_slease		*sl;

	memcpy(&rel, f->payload, sizeof(rel));
	TAILQ_FOREACH(sl, &in->leases, entry)
		if (sl->id == rel.lease)
			break;
	if (sl == NULL) {
		/* Its maximum age came first: nothing to do, and the puller verified its bytes. */
		conn_reply_error(in->c, &f->hdr, PROTO_S_NOT_FOUND, "PEER_RELEASE: no lease %llu",
		    (unsigned long long)rel.lease);
		return;
	}
	peer_slease_free(in->tier, sl);
	conn_reply(in->c, &f->hdr, PROTO_S_OK, NULL, 0);
}

static void
peer_offer_settle(struct peer_offer_in *oi)
{
	struct peer_in	*in = oi->in;

	if (--oi->pending > 0)
		return;
	in->tier->offers_stored += oi->r.stored;
	if (in->c != NULL)
		conn_reply(in->c, &oi->req, PROTO_S_OK, &oi->r, sizeof(oi->r));
	if (--in->offers == 0 && in->c == NULL)
		free(in);
	free(oi);
}

static void
peer_offer_landed(void *arg, int err)
{
	struct peer_offer_obj	*ob = arg;

	if (err == 0 && dram_commit(ob->s->dram, ob->did, ob->checksum) == 0)
		ob->oi->r.stored++;
	else {
		dram_abort(ob->s->dram, ob->did);
		ob->oi->r.failed++;
	}
	peer_offer_settle(ob->oi);
	free(ob);
}

static void
peer_serve_offer(struct peer_in *in, struct proto_frame *f)
{
	struct peer_tier	*t = in->tier;
	struct server		*s = t->s;
	struct proto_peer_offer	 oh;
	struct proto_peer_obj	 o;
	struct peer_offer_in	*oi;
	struct peer_offer_obj	*ob;
	struct peer_grant	 g;
	struct obj_key		 k;
	uint8_t			*buf;
	uint32_t		 i, id, near = DRAM_NONE;

	memcpy(&oh, f->payload, sizeof(oh));
	if (oh.flags != 0) {
		conn_reply_error(in->c, &f->hdr, PROTO_S_INVALID, "PEER_OFFER: unknown flags");
		return;
	}
	if ((oi = calloc(1, sizeof(*oi))) == NULL) {
		conn_reply_error(in->c, &f->hdr, PROTO_S_NO_MEMORY, "PEER_OFFER: out of memory");
		return;
	}
	t->offers_served++;
	oi->in = in;
	oi->req = f->hdr;
	oi->pending = 1;
	in->offers++;
	for (i = 0; i < oh.nobjs; i++) {
		memcpy(&o, f->payload + sizeof(oh) + (size_t)i * sizeof(o), sizeof(o));
		if (proto_peer_obj_check(&o) != PROTO_S_OK || o.present != 1 ||
		    peer_key_in(&o.key, &k) != 0 || t->fab == NULL) {
			oi->r.failed++;
			continue;
		}
		if (dram_lookup(s->dram, &k, &id) == 0) {
			oi->r.present++;
			near = id;	/* the next new one follows it */
			continue;
		}
		if ((ob = calloc(1, sizeof(*ob))) == NULL) {
			oi->r.failed++;
			continue;
		}
		/* After the offer's previous object: objects that follow each other there, here too. */
		switch (dram_alloc(s->dram, &k, o.len, near, oh.nobjs - i, &ob->did, &buf)) {
		case 0:
			break;
		case -EEXIST:
			oi->r.present++;
			near = ob->did;
			free(ob);
			continue;
		default:
			oi->r.failed++;
			free(ob);
			continue;
		}
		memset(&g, 0, sizeof(g));
		g.key = k;
		g.len = o.len;
		g.checksum = o.checksum;
		g.raddr = o.raddr;
		g.rkey = o.rkey;
		g.peer = in->p;
		g.incarnation = in->p->incarnation;
		ob->oi = oi;
		ob->s = s;
		ob->checksum = o.checksum;
		if (peer_pull_start(s, &g, buf, 1, peer_offer_landed, ob) != 0) {
			dram_abort(s->dram, ob->did);
			free(ob);
			oi->r.failed++;
			continue;
		}
		near = ob->did;
		oi->pending++;
	}
	peer_offer_settle(oi);
}

/* Frames on a connection another member dialled: its requests. */
void
peer_serve_frame(struct peer_in *in, struct proto_frame *f)
{
	if (f->hdr.flags & PROTO_F_REPLY) {
		conn_reply_error(in->c, NULL, PROTO_S_STATE, "a reply on a connection that answers");
		conn_close(in->c);
		return;
	}
	if (f->hdr.type == PROTO_T_PEER_HELLO) {
		peer_serve_hello(in, f);
		return;
	}
	if (in->p == NULL) {
		peer_refuse(in, &f->hdr, PROTO_S_STATE, "a peer request before PEER_HELLO");
		return;
	}
	if (f->hdr.type == PROTO_T_PEER_AUTH) {
		peer_serve_auth(in, f);
		return;
	}
	if (!in->authed) {
		peer_refuse(in, &f->hdr, PROTO_S_PEER_AUTH, "a peer request before PEER_AUTH");
		return;
	}
	switch (f->hdr.type) {
	case PROTO_T_PEER_PING: {
		struct proto_peer_ping	pg;

		memcpy(&pg, f->payload, sizeof(pg));
		pg.incarnation = in->tier->incarnation;
		conn_reply(in->c, &f->hdr, PROTO_S_OK, &pg, sizeof(pg));
		return;
	}
	case PROTO_T_PEER_PROBE:
		peer_serve_probe(in, f);
		return;
	case PROTO_T_PEER_LEASE:
		peer_serve_lease(in, f);
		return;
	case PROTO_T_PEER_RELEASE:
		peer_serve_release(in, f);
		return;
	case PROTO_T_PEER_OFFER:
		peer_serve_offer(in, f);
		return;
	}
	conn_reply_error(in->c, &f->hdr, PROTO_S_BAD_TYPE, "%s is not served here",
	    proto_type_name(f->hdr.type));
}
