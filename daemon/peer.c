/*
 * The peer tier: the DRAM of the other daemons of this role, read with
 * one-sided libfabric reads (fabric.c) and found by rendezvous placement
 * (peer_view.c), under the same contract as the local tiers.
 *
 * Members come from a list (peer.members at start and on SIGHUP, or
 * etcd's views with peer.etcd.endpoint: etcd.c registers this daemon and
 * watches the role's prefix), all through peer_members_set(); losing etcd
 * keeps the last view. To each other
 * member this daemon dials one TCP control connection (TCP_NODELAY,
 * keepalive, TCP_USER_TIMEOUT) and sends its requests there; the
 * connections the others dialled are answered by peer_serve.c. Both run
 * over conn.c with their own dispatcher, on the peer channel's types
 * (PROTO_CHAN_PEER). The first frame each way is PEER_HELLO: the member
 * id, the role, an incarnation (random per start), a nonce, the
 * provider, the fabric endpoint name and the registered arena chunks
 * (address, key, length). A listener accepts only members of its list,
 * of its role, connecting from the address the list gives them, and with
 * peer.secret set only a dialler whose PEER_AUTH proves the secret
 * (HMAC-SHA256 over the listener's nonce); the reply
 * carries the listener's proof over the dialler's nonce. Pings measure
 * the RTT and find a peer that stopped answering.
 *
 * An ask (peer_ask) puts a question to the homes of a set of keys, one
 * request per home: PEER_PROBE (which they hold; no pin anywhere) or
 * PEER_LEASE (the owner pins them, bound to this control connection, for
 * at most peer.lease_max_ms, and answers where to read each and what it
 * must be). A home that is down, or whose answer does not come within
 * peer.timeout_ms, is a miss for that answer only. The answers fill a
 * view (peer_view.c) that cache.c and staging.c read synchronously.
 *
 * A pull (peer_pull_start) reads a granted object into a WRITING DRAM
 * object that staging.c reserved. It is refused before anything is posted
 * when the owner is not up in the incarnation that granted it, or when
 * the address and key are not inside a chunk the owner's HELLO named (on
 * tcp;ofi_rxm one bad key costs every read to that peer for seconds).
 * A read that fails, a deadline, or an owner that went away or restarted
 * meanwhile fails the pull, and staging.c drops the object and fails the
 * restore `lost`. Whether the landed bytes have the owner's checksum is
 * checked where they are next read: a restore's pull is checked by that
 * restore, in the pass that copies it into the engine's memory (the host
 * copy engine's, or the GPU's checksum kernel), so that no pulled byte
 * is read twice on the host (staging.c, restore.c: a mismatch there is
 * still this peer's, peer_blame); an offer's pull, which this daemon
 * then serves as a home, is hashed on landing by the copy engine's
 * workers, never on the loop. Owner leases are released once nothing
 * pulls under them any more.
 *
 * An offer (peer_offer, after a PUBLISH) pins the new objects here and
 * names them to their homes with PEER_OFFER; a home pulls what it lacks
 * and answers; the pins go with the answer, its timeout, or the
 * connection.
 */
#include <sys/random.h>
#include <sys/socket.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <event2/dns.h>
#include <event2/util.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"

#define PEER_BACKOFF_MIN_MS	100
#define PEER_BACKOFF_MAX_MS	5000
#define PEER_PINGS_MAX		3	/* unanswered pings before the peer is down */
#define PEER_CHUNK		(1ULL << 30)
/*
 * Bytes of one coalesced read. On tcp;ofi_rxm between two namespaces of
 * the 16-core host, 256 KiB stripes (4 MiB contiguous) restored at 0.66x
 * raw fi_read in 4 MiB reads and 1.01x in 1 MiB reads (RESULTS.md); raw
 * itself is slower in 8 MiB reads than in 1 MiB ones.
 */
#define PEER_RUN_MAX		(1ULL << 20)

struct peer_req {
	struct peer		*p;
	uint64_t		 seq;
	unsigned		 type;
	peer_reply_fn		*cb;
	void			*arg;
	struct event		*timer;
	TAILQ_ENTRY(peer_req)	 entry;
};

/* An owner's lease as the puller holds it: released when nothing uses it. */
struct peer_olease {
	struct peer	*p;
	uint64_t	 id;
	uint64_t	 incarnation;
	unsigned	 refs;		/* the ask, and each pull under it */
	int		 granted;	/* the owner answered: it holds pins to release */
};

struct peer_ask_part {
	struct peer_ask		*ask;
	struct peer		*p;
	struct obj_key		*keys;
	uint32_t		 n;
	struct peer_olease	*ol;
	int			 answered;
};

struct peer_ask {
	struct server		*s;
	unsigned		 kind;
	unsigned		 pending;
	int			 cancelled;
	struct peer_view	 view;
	peer_ask_fn		*done;
	void			*arg;
	struct peer_ask_part	*parts;
	unsigned		 nparts;
};

struct peer_pull {
	struct server		*s;
	struct peer		*p;
	struct peer_grant	 g;
	void			*dst;
	peer_pull_done_fn	*done;
	void			*arg;
	int			 doomed;	/* the owner left or restarted: fails on landing */
	int			 verify;	/* hashed on landing (an offer's), else the restore's */
	int			 posted;	/* off the tier's queue, in a read */
	struct peer_run		*run;		/* its read's, while the workers verify it */
	TAILQ_ENTRY(peer_pull)	 entry;		/* the peer's */
	TAILQ_ENTRY(peer_pull)	 qentry;	/* the tier's queue, until posted */
};

/* An offer this daemon made: its pins, until the home answered. */
struct peer_offer_out {
	struct server	*s;
	uint32_t	*ids;
	uint32_t	 n;
};

static void	peer_out_frame(struct conn *, struct proto_frame *, void *);
static void	peer_out_closed(struct conn *, void *);
static void	peer_timer_cb(evutil_socket_t, short, void *);

static uint64_t
peer_now_us(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static const char *
peer_state_name(int st)
{
	switch (st) {
	case PEER_UP:
		return "up";
	case PEER_CONNECTING:
		return "connecting";
	}
	return "down";
}

static const char *peer_fail_names[PEER_FAIL__MAX] = {
	[PEER_FAIL_TIMEOUT] = "timeout",
	[PEER_FAIL_CHECKSUM] = "checksum",
	[PEER_FAIL_STALE] = "stale",
	[PEER_FAIL_IO] = "io",
	[PEER_FAIL_KEY] = "bad_key",
};

void
peer_key_out(const struct obj_key *k, struct proto_peer_key *w)
{
	_Static_assert(sizeof(*k) == sizeof(*w), "obj_key is the wire's peer key");
	memcpy(w, k, sizeof(*w));
}

/* A key off the wire: 0, or -EINVAL for non-zero padding. */
int
peer_key_in(const struct proto_peer_key *w, struct obj_key *k)
{
	if (w->pad != 0)
		return -EINVAL;
	memcpy(k, w, sizeof(*k));
	return 0;
}

void
peer_ref(struct peer *p)
{
	p->refs++;
}

static void
peer_destroy(struct peer *p)
{
	if (p->fabric_ok && p->tier->fab != NULL)
		fabric_peer_remove(p->tier->fab, p->fabric_peer);
	if (p->ev_timer != NULL)
		event_free(p->ev_timer);
	free(p);
}

void
peer_unref(struct peer *p)
{
	if (--p->refs == 0 && p->removed)
		peer_destroy(p);
}

struct peer *
peer_by_id(struct peer_tier *t, const char *id)
{
	size_t	i;

	for (i = 0; i < t->npeers; i++)
		if (strcmp(t->peers[i]->m.id, id) == 0)
			return t->peers[i];
	return NULL;
}

/* Whether [raddr, raddr + len) under rkey is inside one chunk the peer's HELLO named. */
int
peer_mr_ok(const struct peer *p, uint64_t raddr, uint64_t rkey, uint64_t len)
{
	unsigned	i;

	for (i = 0; i < p->nmr; i++) {
		const struct proto_peer_mr *m = &p->mr[i];

		if (m->rkey == rkey && raddr >= m->raddr && len <= m->len &&
		    raddr - m->raddr <= m->len - len)
			return 1;
	}
	return 0;
}

/* ------------------------------------------------------------------ requests */

static void
peer_req_finish(struct peer_req *r, unsigned status, const uint8_t *payload, uint32_t len)
{
	struct peer	*p = r->p;

	TAILQ_REMOVE(&p->reqs, r, entry);
	event_free(r->timer);
	r->cb(r->arg, p, status, payload, len);
	free(r);
	peer_unref(p);
}

static void
peer_req_timeout_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct peer_req	*r = arg;

	(void)fd;
	(void)ev;
	log_debug("peer", "%s: %s not answered in time", r->p->m.id, proto_type_name(r->type));
	r->p->asks_missed++;
	peer_req_finish(r, PROTO_S_TIMEOUT, NULL, 0);
}

/*
 * Sends a request to an up peer: cb runs once, with the reply, at the
 * timeout (PROTO_S_TIMEOUT) or when the connection goes (PROTO_S_PEER_STALE).
 * -ENOTCONN: the peer is not up, and cb never runs.
 */
int
peer_send(struct peer *p, unsigned type, const void *payload, uint32_t len, uint32_t timeout_ms,
    peer_reply_fn *cb, void *arg)
{
	struct peer_req	*r;
	struct timeval	 tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };

	if (p->state != PEER_UP || p->out == NULL)
		return -ENOTCONN;
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return -ENOMEM;
	if ((r->timer = evtimer_new(p->tier->s->base, peer_req_timeout_cb, r)) == NULL) {
		free(r);
		return -ENOMEM;
	}
	r->p = p;
	r->seq = ++p->next_seq;
	r->type = type;
	r->cb = cb;
	r->arg = arg;
	if (conn_request(p->out, type, r->seq, payload, len) != 0) {
		event_free(r->timer);
		free(r);
		return -ENOMEM;
	}
	TAILQ_INSERT_TAIL(&p->reqs, r, entry);
	peer_ref(p);
	evtimer_add(r->timer, &tv);
	return 0;
}

/* ------------------------------------------------------------------ connection */

/* What a HELLO, ours or our answer to one, says about reading us: provider, endpoints, chunks. */
void
peer_hello_data(const struct peer_tier *t, struct proto_peer_hello *h)
{
	snprintf(h->provider, sizeof(h->provider), "%s", t->provider);
	h->fabric_len = t->fabric_len;
	memcpy(h->fabric, t->fabric_name, (size_t)t->fabric_len * t->fabric_lanes);
	h->nmr = t->nmr;
	memcpy(h->mr, t->mr, sizeof(h->mr));
}

static void
peer_hello_fill(struct peer_tier *t, struct proto_peer_hello *h, const uint8_t *nonce)
{
	memset(h, 0, sizeof(*h));
	h->version_min = h->version_max = PROTO_VERSION;
	snprintf(h->id, sizeof(h->id), "%s", t->self.id);
	snprintf(h->role, sizeof(h->role), "%s", t->s->cfg->role);
	h->incarnation = t->incarnation;
	memcpy(h->nonce, nonce, PROTO_PEER_NONCE);
	peer_hello_data(t, h);
}

/* 0 when a HELLO's counts are in range (peer_set_remote would take it), or -EINVAL. */
int
peer_hello_counts_ok(const struct proto_peer_hello *h)
{
	if (h->fabric_len > sizeof(h->fabric) || h->nmr > PROTO_PEER_KEYS_MAX ||
	    h->incarnation == 0)
		return -EINVAL;
	return 0;
}

/*
 * What a peer's HELLO says about reading it: its endpoint, chunks and
 * incarnation. A new incarnation dooms every pull from the old one.
 * Only a HELLO proved to come from p may come here: with peer.secret,
 * one whose proof was checked (the reply to ours, or a HELLO once its
 * PEER_AUTH passed). 0, or -EINVAL for a HELLO whose counts are out of
 * range.
 */
int
peer_set_remote(struct peer *p, const struct proto_peer_hello *h)
{
	struct peer_tier	*t = p->tier;
	struct peer_pull	*pl;
	unsigned		 lanes;
	size_t			 names;

	if (peer_hello_counts_ok(h) != 0)
		return -EINVAL;
	lanes = proto_peer_hello_lanes(h);
	names = (size_t)h->fabric_len * lanes;
	if (p->incarnation == h->incarnation && p->fabric_len == h->fabric_len &&
	    p->fabric_lanes == lanes && memcmp(p->fabric_name, h->fabric, names) == 0)
		return 0;
	if (p->incarnation != 0 && p->incarnation != h->incarnation)
		log_info("peer", "%s restarted (incarnation %016llx, was %016llx): its pulls fail",
		    p->m.id, (unsigned long long)h->incarnation,
		    (unsigned long long)p->incarnation);
	TAILQ_FOREACH(pl, &p->pulls, entry)
		pl->doomed = 1;
	if (p->fabric_ok)
		fabric_peer_remove(t->fab, p->fabric_peer);
	p->fabric_ok = 0;
	p->incarnation = h->incarnation;
	p->fabric_len = h->fabric_len;
	p->fabric_lanes = (uint16_t)lanes;
	memset(p->fabric_name, 0, sizeof(p->fabric_name));
	memcpy(p->fabric_name, h->fabric, names);
	p->nmr = h->nmr;
	memcpy(p->mr, h->mr, sizeof(p->mr));
	p->lanes = 0;
	if (t->fab != NULL && h->fabric_len > 0 && strcmp(h->provider, t->provider) == 0 &&
	    fabric_peer_add(t->fab, h->fabric, names, &p->fabric_peer) == 0) {
		p->fabric_ok = 1;
		p->lanes = lanes < fabric_lanes(t->fab) ? lanes : fabric_lanes(t->fab);
	} else if (t->fab != NULL)
		log_warn("peer", "%s: its data path (provider \"%.31s\", %u name bytes) cannot be "
		    "reached from ours (%s): nothing is pulled from it", p->m.id, h->provider,
		    h->fabric_len, t->provider);
	return 0;
}

static void
peer_timer_arm(struct peer *p, uint64_t ms)
{
	struct timeval	tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };

	evtimer_add(p->ev_timer, &tv);
}

/* The out connection is gone (or never came up): everything sent on it fails. */
static void
peer_down(struct peer *p, const char *why)
{
	struct peer_pull	*pl;

	if (p->state == PEER_UP)
		log_warn("peer", "%s (%s) is down: %s", p->m.id, p->m.addr, why);
	p->state = PEER_DOWN;
	p->out = NULL;
	p->pings_unanswered = 0;
	/* Its owner leases went with the connection: what is read under them is not trusted. */
	TAILQ_FOREACH(pl, &p->pulls, entry)
		pl->doomed = 1;
	while (!TAILQ_EMPTY(&p->reqs))
		peer_req_finish(TAILQ_FIRST(&p->reqs), PROTO_S_PEER_STALE, NULL, 0);
	if (p->removed)
		return;
	p->backoff_ms = p->backoff_ms == 0 ? PEER_BACKOFF_MIN_MS : p->backoff_ms * 2;
	if (p->backoff_ms > PEER_BACKOFF_MAX_MS)
		p->backoff_ms = PEER_BACKOFF_MAX_MS;
	peer_timer_arm(p, p->backoff_ms);
}

static void
peer_out_closed(struct conn *c, void *arg)
{
	struct peer	*p = arg;

	(void)c;
	/* Never answered: the next dial tries the name's next address. */
	if (p->state == PEER_CONNECTING)
		p->addr_next++;
	peer_down(p, "its control connection closed");
	peer_unref(p);
}

static void
peer_sockopts(struct peer_tier *t, int fd)
{
	unsigned	ut = t->s->cfg->peer_user_timeout_ms;
	int		one = 1, idle = 5, intvl = 1, cnt = 3;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
}

/*
 * HOST:PORT ([v6]:PORT) split in buf (PEER_ADDR_LEN bytes): *host and
 * *port point into it. 0, or -EINVAL.
 */
static int
peer_split(const char *hostport, char *buf, char **host, char **port)
{
	char	*colon;
	size_t	 len;

	snprintf(buf, PEER_ADDR_LEN, "%s", hostport);
	if ((colon = strrchr(buf, ':')) == NULL)
		return -EINVAL;
	*colon = '\0';
	*host = buf;
	*port = colon + 1;
	if (buf[0] == '[' && (len = strlen(buf)) >= 2 && buf[len - 1] == ']') {
		buf[len - 1] = '\0';
		*host = buf + 1;
	}
	return 0;
}

/*
 * The addresses of HOST:PORT ([v6]:PORT), as getaddrinfo() gives them
 * (freeaddrinfo them). Names resolve here, on the loop, unless flags has
 * AI_NUMERICHOST: only peer.listen's, once at start, does. 0 or -errno.
 */
static int
peer_getaddrinfo(const char *hostport, int flags, struct addrinfo **res)
{
	struct addrinfo	 hints;
	char		 buf[PEER_ADDR_LEN], *host, *port;

	*res = NULL;
	if (peer_split(hostport, buf, &host, &port) != 0)
		return -EINVAL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | flags;
	if (getaddrinfo(host, port, &hints, res) != 0 || *res == NULL)
		return -EHOSTUNREACH;
	return 0;
}

/* Keeps the IPv4 and IPv6 addresses of res (PEER_ADDRS_MAX at most) as p's. */
static void
peer_addrs_set(struct peer *p, const struct evutil_addrinfo *res)
{
	const struct evutil_addrinfo	*ai;

	p->naddrs = 0;
	for (ai = res; ai != NULL && p->naddrs < PEER_ADDRS_MAX; ai = ai->ai_next)
		if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
		    ai->ai_addrlen <= sizeof(p->addrs[0]))
			memcpy(&p->addrs[p->naddrs++], ai->ai_addr, ai->ai_addrlen);
}

static socklen_t
peer_sslen(const struct sockaddr_storage *ss)
{
	return ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static void	peer_connect(struct peer *);

/* A name's answer (or its failure, or its cancel: p was removed). */
static void
peer_dns_cb(int result, struct evutil_addrinfo *res, void *arg)
{
	struct peer	*p = arg;

	p->resolving = 0;
	p->dns = NULL;
	if (result == EVUTIL_EAI_CANCEL) {
		if (res != NULL)
			evutil_freeaddrinfo(res);
		peer_unref(p);
		return;
	}
	if (result == 0 && res != NULL) {
		peer_addrs_set(p, res);
		p->resolved_ms = peer_now_us() / 1000;
	} else {
		log_warn("peer", "%s: %s does not resolve: %s%s", p->m.id, p->m.addr,
		    evutil_gai_strerror(result), p->naddrs > 0 ? "; its last addresses stay" : "");
		if (p->naddrs > 0)
			p->resolved_ms = peer_now_us() / 1000;	/* try again after the refresh time */
	}
	if (res != NULL)
		evutil_freeaddrinfo(res);
	if (p->dial_waits) {
		p->dial_waits = 0;
		peer_connect(p);
	}
	peer_unref(p);
}

/*
 * Makes p->addrs current, never blocking: a numeric host's address at
 * once; a name through the tier's evdns base, in the background, when it
 * has no answer yet or its answer is older than PEER_DNS_REFRESH_MS (the
 * old addresses serve meanwhile). The answer may come before this returns
 * (evdns answers from /etc/hosts at once).
 */
static void
peer_addr_refresh(struct peer *p)
{
	struct peer_tier		*t = p->tier;
	struct evutil_addrinfo		 hints;
	struct addrinfo			*res;
	struct evdns_getaddrinfo_request *req;
	char				 buf[PEER_ADDR_LEN], *host, *port;

	if (p->resolving || (p->resolved_ms != 0 && (p->numeric ||
	    peer_now_us() / 1000 - p->resolved_ms < PEER_DNS_REFRESH_MS)))
		return;
	if (peer_getaddrinfo(p->m.addr, AI_NUMERICHOST, &res) == 0) {
		peer_addrs_set(p, (const struct evutil_addrinfo *)(const void *)res);
		freeaddrinfo(res);
		p->numeric = 1;
		p->resolved_ms = peer_now_us() / 1000;
		return;
	}
	if (t->dns == NULL || peer_split(p->m.addr, buf, &host, &port) != 0)
		return;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = EVUTIL_AI_NUMERICSERV;
	p->resolving = 1;
	peer_ref(p);	/* the answer's */
	req = evdns_getaddrinfo(t->dns, host, port, &hints, peer_dns_cb, p);
	if (p->resolving)
		p->dns = req;
}

/* A member's address changed (SIGHUP, etcd): what was resolved is forgotten. */
static void
peer_addr_forget(struct peer *p)
{
	if (p->dns != NULL)
		evdns_getaddrinfo_cancel(p->dns);	/* its callback still runs, and unrefs */
	p->dns = NULL;
	p->naddrs = 0;
	p->numeric = 0;
	p->resolved_ms = 0;
	p->dial_waits = 0;
}

/* HOST:PORT ([v6]:PORT) into its first address (peer.listen, at start). */
static int
peer_resolve(const char *hostport, struct sockaddr_storage *ss, socklen_t *sslen)
{
	struct addrinfo	*res;
	int		 rc;

	if ((rc = peer_getaddrinfo(hostport, 0, &res)) != 0)
		return rc;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sslen = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

/*
 * An address's IP into ip (16 bytes; IPv4, and IPv4-mapped IPv6, as
 * ::ffff:a.b.c.d), so that a dual-stack listener compares like with like.
 * 0, or -EAFNOSUPPORT.
 */
static int
peer_ip(const struct sockaddr *sa, uint8_t *ip)
{
	static const uint8_t	v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	if (sa->sa_family == AF_INET) {
		memcpy(ip, v4mapped, sizeof(v4mapped));
		memcpy(ip + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		memcpy(ip, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
		return 0;
	}
	return -EAFNOSUPPORT;
}

/* Whether an IP (peer_ip's form) is 0.0.0.0 or ::, the wildcards. */
static int
peer_ip_is_any(const uint8_t *ip)
{
	static const uint8_t	any[16], any4[16] = { [10] = 0xff, [11] = 0xff };

	return memcmp(ip, any, 16) == 0 || memcmp(ip, any4, 16) == 0;
}

/*
 * Whether a control connection from `from` may be member p's: from's IP
 * is one of those p's listed address gives (a numeric host is itself, a
 * name is what it last resolved to, refreshed in the background, never
 * here; a name with no answer yet lets nobody in, and the member's retry
 * finds the answer). A wildcard host (0.0.0.0, [::]) names no source: any
 * is let in. The id, the role and peer.secret are checked all the same.
 */
int
peer_source_ok(struct peer *p, const struct sockaddr *from)
{
	uint8_t		ip[16], want[16];
	unsigned	i;

	peer_addr_refresh(p);
	if (peer_ip(from, ip) != 0)
		return 0;
	for (i = 0; i < p->naddrs; i++)
		if (peer_ip((const struct sockaddr *)&p->addrs[i], want) == 0 &&
		    (peer_ip_is_any(want) || memcmp(ip, want, sizeof(ip)) == 0))
			return 1;
	return 0;
}

/*
 * A dialled control connection leaves from the host this daemon's own
 * member entry names (peer.listen's with etcd), when that is an address
 * of fd's family and not a wildcard: the listener checks that its source
 * is the member's address (peer_source_ok), and on a host with several
 * the kernel's route could pick another. Where it cannot bind (the entry
 * is a name, or not local, as behind NAT) the kernel chooses.
 */
static void
peer_bind_source(struct peer_tier *t, int fd, int family)
{
	struct addrinfo	*res;
	const char	*addr = t->self.addr;
	uint8_t		 ip[16];
	size_t		 i;
	int		 one = 1;

	for (i = 0; i < t->nmembers; i++)
		if (strcmp(t->members[i].id, t->self.id) == 0)
			addr = t->members[i].addr;
	if (peer_getaddrinfo(addr, AI_NUMERICHOST, &res) != 0)
		return;
	if (res->ai_family == family && peer_ip(res->ai_addr, ip) == 0 && !peer_ip_is_any(ip)) {
		if (res->ai_family == AF_INET)
			((struct sockaddr_in *)(void *)res->ai_addr)->sin_port = 0;
		else
			((struct sockaddr_in6 *)(void *)res->ai_addr)->sin6_port = 0;
		/* The port is picked at connect(), per destination: no ephemeral port is held. */
		(void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
		if (bind(fd, res->ai_addr, res->ai_addrlen) != 0)
			log_debug("peer", "cannot bind the control connection to %s: %s", addr,
			    strerror(errno));
	}
	freeaddrinfo(res);
}

static void
peer_connect(struct peer *p)
{
	struct peer_tier	*t = p->tier;
	struct proto_peer_hello	 h;
	struct sockaddr_storage	 ss;
	socklen_t		 sslen;
	int			 fd;

	if (p->removed || p->state != PEER_DOWN || t->s->stopping)
		return;
	peer_addr_refresh(p);
	if (p->naddrs == 0 && p->resolving) {
		p->dial_waits = 1;	/* the answer dials */
		return;
	}
	if (p->naddrs == 0) {
		peer_down(p, t->dns == NULL ? "its address is a name and no resolver could be set up" :
		    "its address does not resolve");
		return;
	}
	ss = p->addrs[p->addr_next % p->naddrs];
	sslen = peer_sslen(&ss);
	if ((fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
		peer_down(p, strerror(errno));
		return;
	}
	peer_sockopts(t, fd);
	peer_bind_source(t, fd, ss.ss_family);
	if (connect(fd, (struct sockaddr *)&ss, sslen) != 0 && errno != EINPROGRESS) {
		close(fd);
		peer_down(p, "connect failed");
		return;
	}
	if ((p->out = conn_new(t->s, fd, 0, 0, 0, PROTO_CHAN_PEER, peer_out_frame,
	    peer_out_closed, p)) == NULL) {
		close(fd);
		peer_down(p, "out of memory");
		return;
	}
	peer_ref(p);
	p->state = PEER_CONNECTING;
	p->connects++;
	if (getrandom(p->nonce, sizeof(p->nonce), GRND_NONBLOCK) != sizeof(p->nonce))
		memset(p->nonce, 0x5a, sizeof(p->nonce));
	peer_hello_fill(t, &h, p->nonce);
	conn_request(p->out, PROTO_T_PEER_HELLO, 0, &h, sizeof(h));
}

static void
peer_ping_reply(void *arg, struct peer *p, unsigned status, const uint8_t *payload, uint32_t len)
{
	struct proto_peer_ping	pg;

	(void)arg;
	if (status != PROTO_S_OK || len != sizeof(pg))
		return;
	memcpy(&pg, payload, sizeof(pg));
	p->pings_unanswered = 0;
	p->rtt_us = peer_now_us() - pg.sent_us;
	if (pg.incarnation != p->incarnation && p->out != NULL) {
		log_warn("peer", "%s answers a ping as another incarnation: reconnecting", p->m.id);
		conn_close(p->out);
	}
}

static void
peer_timer_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct peer		*p = arg;
	struct proto_peer_ping	 pg;

	(void)fd;
	(void)ev;
	if (p->state == PEER_DOWN) {
		peer_connect(p);
		return;
	}
	if (p->state == PEER_UP) {
		if (p->pings_unanswered >= PEER_PINGS_MAX) {
			log_warn("peer", "%s: %u pings unanswered", p->m.id, p->pings_unanswered);
			conn_close(p->out);
			return;
		}
		memset(&pg, 0, sizeof(pg));
		pg.sent_us = peer_now_us();
		if (peer_send(p, PROTO_T_PEER_PING, &pg, sizeof(pg), p->tier->s->cfg->peer_ping_ms *
		    PEER_PINGS_MAX, peer_ping_reply, NULL) == 0)
			p->pings_unanswered++;
	}
	peer_timer_arm(p, p->tier->s->cfg->peer_ping_ms);
}

/* The listener took our PEER_AUTH (our proof, with a secret): asks and pulls may go. */
static void
peer_out_up(struct peer *p)
{
	p->state = PEER_UP;
	p->backoff_ms = 0;
	log_info("peer", "%s (%s) is up, incarnation %016llx", p->m.id, p->m.addr,
	    (unsigned long long)p->incarnation);
	evtimer_del(p->ev_timer);
	peer_timer_arm(p, 0);
}

/*
 * The listener's HELLO reply: who it is, and its proof when we share a
 * secret. Ours follows in PEER_AUTH; the member is up once the listener
 * took it (a listener that refuses our proof never sees a request).
 */
static void
peer_out_hello(struct peer *p, struct proto_frame *f)
{
	struct peer_tier	*t = p->tier;
	struct proto_peer_hello	 h;
	struct proto_peer_auth	 a;
	uint8_t			 want[PROTO_PEER_PROOF];

	if (f->hdr.status != PROTO_S_OK || f->hdr.length != sizeof(h)) {
		log_warn("peer", "%s refused us: %s: %.*s", p->m.id, proto_status_name(f->hdr.status),
		    (int)(f->hdr.length < PROTO_ERRMSG_MAX ? f->hdr.length : PROTO_ERRMSG_MAX),
		    (const char *)f->payload);
		conn_close(p->out);
		return;
	}
	memcpy(&h, f->payload, sizeof(h));
	if (proto_peer_hello_check(&h) != PROTO_S_OK || strcmp(h.id, p->m.id) != 0 ||
	    strcmp(h.role, t->s->cfg->role) != 0) {
		t->refused++;
		log_warn("peer", "%s (%s) answered as another member or role: closed", p->m.id,
		    p->m.addr);
		conn_close(p->out);
		return;
	}
	if (t->s->cfg->peer_secret[0] != '\0') {
		peer_proof(t, p->nonce, h.id, h.incarnation, want);
		if (memcmp(want, h.proof, sizeof(want)) != 0) {
			t->refused++;
			log_warn("peer", "%s: its proof of the shared secret is wrong: closed", p->m.id);
			conn_close(p->out);
			return;
		}
	}
	if (peer_set_remote(p, &h) != 0) {
		conn_close(p->out);
		return;
	}
	memset(&a, 0, sizeof(a));
	if (t->s->cfg->peer_secret[0] != '\0')
		peer_proof(t, h.nonce, t->self.id, t->incarnation, a.proof);
	conn_request(p->out, PROTO_T_PEER_AUTH, 0, &a, sizeof(a));
	p->out->flags |= CONN_F_HELLO | CONN_F_ATTACHED;
}

/* Frames on a connection this daemon dialled: replies to its requests only. */
static void
peer_out_frame(struct conn *c, struct proto_frame *f, void *arg)
{
	struct peer	*p = arg;
	struct peer_req	*r;

	if (!(f->hdr.flags & PROTO_F_REPLY)) {
		conn_reply_error(c, &f->hdr, PROTO_S_STATE, "%s on a connection that asks, not "
		    "answers", proto_type_name(f->hdr.type));
		return;
	}
	if (f->hdr.type == PROTO_T_PEER_HELLO && p->state == PEER_CONNECTING) {
		peer_out_hello(p, f);
		return;
	}
	if (f->hdr.type == PROTO_T_PEER_AUTH) {
		if (f->hdr.status != PROTO_S_OK) {
			log_warn("peer", "%s refused our proof: %s", p->m.id,
			    proto_status_name(f->hdr.status));
			conn_close(c);
		} else if (p->state == PEER_CONNECTING && (c->flags & CONN_F_HELLO))
			peer_out_up(p);
		return;
	}
	TAILQ_FOREACH(r, &p->reqs, entry)
		if (r->seq == f->hdr.seq)
			break;
	if (r == NULL || r->type != f->hdr.type) {
		log_debug("peer", "%s: a late or unknown %s reply (seq %llu)", p->m.id,
		    proto_type_name(f->hdr.type), (unsigned long long)f->hdr.seq);
		return;
	}
	peer_req_finish(r, f->hdr.status, f->payload, f->hdr.length);
}

/* ------------------------------------------------------------------ members */

static struct peer *
peer_new(struct peer_tier *t, const struct peer_member *m)
{
	struct peer	*p;

	if ((p = calloc(1, sizeof(*p))) == NULL)
		return NULL;
	p->m = *m;
	p->tier = t;
	p->refs = 1;		/* the member list's */
	if (++t->next_serial == 0)
		t->next_serial = 1;
	p->serial = t->next_serial;
	TAILQ_INIT(&p->reqs);
	TAILQ_INIT(&p->pulls);
	if ((p->ev_timer = evtimer_new(t->s->base, peer_timer_cb, p)) == NULL) {
		free(p);
		return NULL;
	}
	return p;
}

static void
peer_remove(struct peer *p)
{
	struct peer_in	*in;

	p->removed = 1;
	evtimer_del(p->ev_timer);
	peer_addr_forget(p);
	if (p->out != NULL)
		conn_close(p->out);
	TAILQ_FOREACH(in, &p->tier->ins, entry)
		if (in->p == p)
			conn_close(in->c);
	peer_unref(p);
}

/*
 * Replaces the member view: the static list at start and on SIGHUP, or
 * etcd's. Members kept keep their connections (a changed address
 * reconnects); members gone are disconnected and their pulls fail; new
 * ones are dialled. Placement follows the new list at once: keys whose
 * home moved are misses until they are offered again.
 */
void
peer_members_set(struct server *s, const struct peer_member *m, size_t n)
{
	struct peer_tier	*t = s->peer;
	struct peer_member	*nm;
	struct peer		**np, *p;
	size_t			 i, j, nn = 0;
	int			 self = 0;

	if (t == NULL)
		return;
	nm = calloc(n > 0 ? n : 1, sizeof(*nm));
	np = calloc(n > 0 ? n : 1, sizeof(*np));
	if (nm == NULL || np == NULL) {
		free(nm);
		free(np);
		log_error("peer", "out of memory for a member list of %zu; the old one stays", n);
		return;
	}
	for (i = 0; i < n; i++) {
		nm[i] = m[i];
		nm[i].id[sizeof(nm[i].id) - 1] = nm[i].addr[sizeof(nm[i].addr) - 1] = '\0';
		if (strcmp(nm[i].id, t->self.id) == 0) {
			self = 1;
			continue;
		}
		if ((p = peer_by_id(t, nm[i].id)) != NULL && strcmp(p->m.addr, nm[i].addr) != 0) {
			log_info("peer", "%s moved from %s to %s", p->m.id, p->m.addr, nm[i].addr);
			snprintf(p->m.addr, sizeof(p->m.addr), "%s", nm[i].addr);
			peer_addr_forget(p);
			if (p->out != NULL)
				conn_close(p->out);
		}
		if (p == NULL && (p = peer_new(t, &nm[i])) == NULL)
			continue;
		np[nn++] = p;
	}
	if (!self)
		log_warn("peer", "the member list does not name this daemon (%s): it is no home",
		    t->self.id);
	for (i = 0; i < t->npeers; i++) {
		for (j = 0; j < nn && np[j] != t->peers[i]; j++)
			;
		if (j == nn) {
			log_info("peer", "%s left the member list", t->peers[i]->m.id);
			peer_remove(t->peers[i]);
		}
	}
	free(t->peers);
	free(t->members);
	t->peers = np;
	t->npeers = nn;
	t->members = nm;
	t->nmembers = n;
	log_info("peer", "%zu members, %zu others", n, nn);
	for (i = 0; i < nn; i++)
		if (np[i]->state == PEER_DOWN && !evtimer_pending(np[i]->ev_timer, NULL))
			peer_timer_arm(np[i], 0);
}

/* Whether asking the peers can find anything: a data path and a member up. */
int
peer_enabled(const struct server *s)
{
	const struct peer_tier	*t = s->peer;
	size_t			 i;

	if (t == NULL || t->fab == NULL)
		return 0;
	for (i = 0; i < t->npeers; i++)
		if (t->peers[i]->state == PEER_UP && t->peers[i]->fabric_ok)
			return 1;
	return 0;
}

/* ------------------------------------------------------------------ asks */

static void
peer_olease_unref(struct peer_olease *ol)
{
	struct proto_peer_release	rel;

	if (ol == NULL || --ol->refs > 0)
		return;
	if (ol->granted && ol->p->state == PEER_UP && ol->p->incarnation == ol->incarnation) {
		rel.lease = ol->id;
		(void)conn_request(ol->p->out, PROTO_T_PEER_RELEASE, 0, &rel, sizeof(rel));
	}
	peer_unref(ol->p);
	free(ol);
}

static void
peer_ask_free(struct peer_ask *a)
{
	unsigned	i;

	for (i = 0; i < a->nparts; i++) {
		free(a->parts[i].keys);
		peer_olease_unref(a->parts[i].ol);
	}
	free(a->parts);
	peer_view_fini(&a->view, NULL);
	free(a);
}

static void
peer_ask_settle(struct peer_ask *a)
{
	if (--a->pending > 0)
		return;
	if (!a->cancelled)
		a->done(a->s, a->arg, &a->view);
	peer_ask_free(a);
}

/* A PEER_PROBE answer: nkeys bytes, 1 where the home holds the key. */
static void
peer_probe_reply(void *arg, struct peer *p, unsigned status, const uint8_t *payload, uint32_t len)
{
	struct peer_ask_part	*pt = arg;
	struct peer_grant	 g;
	uint32_t		 i;

	if (status == PROTO_S_OK && len == pt->n && !pt->ask->cancelled) {
		for (i = 0; i < pt->n; i++) {
			if (payload[i] != 1)
				continue;
			memset(&g, 0, sizeof(g));
			g.key = pt->keys[i];
			g.len = UINT64_MAX;	/* a probe does not say: any length counts */
			g.peer = p;
			g.incarnation = p->incarnation;
			(void)peer_view_add(&pt->ask->view, &g);
		}
	} else if (status == PROTO_S_OK)
		log_warn("peer", "%s: a PEER_PROBE answer of %u bytes for %u keys: ignored", p->m.id,
		    len, pt->n);
	peer_ask_settle(pt->ask);
}

/*
 * A PEER_LEASE answer: the lease header and one proto_peer_obj per key
 * asked, each echoing its key. Anything malformed is a miss for the whole
 * answer (the owner's pins go with the RELEASE).
 */
static void
peer_lease_reply(void *arg, struct peer *p, unsigned status, const uint8_t *payload, uint32_t len)
{
	struct peer_ask_part	*pt = arg;
	struct proto_peer_lease	 lh;
	struct proto_peer_obj	 o;

	struct proto_peer_key	 w;
	struct peer_grant	 g;
	uint32_t		 i;

	if (status != PROTO_S_OK)
		goto out;
	pt->ol->granted = 1;	/* whatever it pinned is released, even for a bad answer */
	if (proto_peer_lease_reply_check(payload, len, pt->ol->id, pt->n) != PROTO_S_OK) {
		log_warn("peer", "%s: a malformed PEER_LEASE answer (%u bytes for %u keys)",
		    p->m.id, len, pt->n);
		goto out;
	}
	for (i = 0; i < pt->n && !pt->ask->cancelled; i++) {
		memcpy(&o, payload + sizeof(lh) + (size_t)i * sizeof(o), sizeof(o));
		peer_key_out(&pt->keys[i], &w);
		if (memcmp(&o.key, &w, sizeof(w)) != 0) {
			log_warn("peer", "%s: a PEER_LEASE answer names another key at %u: ignored",
			    p->m.id, i);
			p->failures[PEER_FAIL_KEY]++;
			goto out;
		}
		if (o.present != 1)
			continue;
		if (!peer_mr_ok(p, o.raddr, o.rkey, o.len)) {
			p->failures[PEER_FAIL_KEY]++;
			continue;
		}
		memset(&g, 0, sizeof(g));
		g.key = pt->keys[i];
		g.len = o.len;
		g.checksum = o.checksum;
		g.raddr = o.raddr;
		g.rkey = o.rkey;
		g.peer = p;
		g.incarnation = pt->ol->incarnation;
		g.ol = pt->ol;
		(void)peer_view_add(&pt->ask->view, &g);
	}
out:
	peer_ask_settle(pt->ask);
}

/*
 * Asks the homes of n keys (heads: the stripe head's hash of each, for
 * placement) what they hold (PEER_ASK_PROBE) or to lease it
 * (PEER_ASK_LEASE). Returns 1 with *askp set when questions went out and
 * done(s, arg, view) will run once every answer came or timed out; 0 when
 * no home but this daemon, or none up, can be asked (nothing will run).
 */
int
peer_ask(struct server *s, unsigned kind, const struct obj_key *keys, const uint8_t *heads,
    size_t n, peer_ask_fn *done, void *arg, struct peer_ask **askp)
{
	struct peer_tier	*t = s->peer;
	struct peer_ask		*a;
	struct obj_key		 pk;
	unsigned		 homes[PEER_REPLICAS_MAX], nh, h, i;
	uint32_t		*count = NULL, *which = NULL, lim, nparts;
	size_t			 k;
	uint8_t			*buf;
	size_t			 blen;
	int			 sent = 0;

	*askp = NULL;
	if (!peer_enabled(s) || n == 0)
		return 0;
	count = calloc(t->npeers, sizeof(*count));
	which = malloc(n * sizeof(*which));
	a = calloc(1, sizeof(*a));
	if (count == NULL || which == NULL || a == NULL || peer_view_init(&a->view, n) != 0)
		goto fail;
	a->view.pull = peer_pull_start;
	a->s = s;
	a->kind = kind;
	a->done = done;
	a->arg = arg;
	/* Each key to the first of its homes that is another daemon, up, with a data path. */
	for (k = 0; k < n; k++) {
		which[k] = UINT32_MAX;
		peer_place_key(&keys[k], heads + k * PROTO_HASH_LEN, &pk);
		nh = peer_homes(t->members, t->nmembers, &pk, s->cfg->peer_replicas, homes);
		for (h = 0; h < nh; h++) {
			struct peer *p = peer_by_id(t, t->members[homes[h]].id);

			if (p != NULL && p->state == PEER_UP && p->fabric_ok) {
				for (i = 0; i < t->npeers && t->peers[i] != p; i++)
					;
				which[k] = i;
				count[i]++;
				break;
			}
		}
	}
	/*
	 * One request per home, cut so that its answer fits a frame of
	 * limits.max_frame (a lease answer is 88 bytes a key).
	 */
	lim = (s->cfg->max_frame - sizeof(struct proto_hdr) - sizeof(struct proto_peer_lease)) /
	    sizeof(struct proto_peer_obj);
	if (lim > PROTO_PEER_OBJS_MAX)
		lim = PROTO_PEER_OBJS_MAX;
	for (i = 0, nparts = 0; i < t->npeers; i++)
		nparts += (count[i] + lim - 1) / lim;
	if ((a->parts = calloc(nparts > 0 ? nparts : 1, sizeof(*a->parts))) == NULL)
		goto fail;
	for (i = 0; i < t->npeers; i++) {
		struct peer_ask_part *pt = NULL;

		for (k = 0; k < n; k++) {
			if (which[k] != i)
				continue;
			if (pt == NULL || pt->n == lim) {
				pt = &a->parts[a->nparts++];
				pt->ask = a;
				pt->p = t->peers[i];
				if ((pt->keys = malloc((count[i] < lim ? count[i] : lim) *
				    sizeof(*pt->keys))) == NULL)
					goto fail;
			}
			pt->keys[pt->n++] = keys[k];
		}
	}
	a->pending = 1;		/* this function's, until every part is sent */
	for (i = 0; i < a->nparts; i++) {
		struct peer_ask_part *pt = &a->parts[i];
		size_t hl = kind == PEER_ASK_LEASE ? sizeof(struct proto_peer_lease) :
		    sizeof(struct proto_peer_probe);
		peer_reply_fn *cb = kind == PEER_ASK_LEASE ? peer_lease_reply : peer_probe_reply;

		blen = hl + (size_t)pt->n * sizeof(struct proto_peer_key);
		if ((buf = malloc(blen)) == NULL)
			continue;
		if (kind == PEER_ASK_LEASE) {
			struct proto_peer_lease lh = { 0, pt->n, s->cfg->peer_lease_max_ms };

			if ((pt->ol = calloc(1, sizeof(*pt->ol))) == NULL) {
				free(buf);
				continue;
			}
			pt->ol->p = pt->p;
			peer_ref(pt->p);
			pt->ol->id = lh.lease = ++t->next_lease;
			pt->ol->incarnation = pt->p->incarnation;
			pt->ol->refs = 1;
			memcpy(buf, &lh, sizeof(lh));
			pt->p->leases_sent++;
		} else {
			struct proto_peer_probe ph = { pt->n, 0 };

			memcpy(buf, &ph, sizeof(ph));
			pt->p->probes_sent++;
		}
		for (k = 0; k < pt->n; k++)
			peer_key_out(&pt->keys[k], (struct proto_peer_key *)(void *)(buf + hl +
			    k * sizeof(struct proto_peer_key)));
		if (peer_send(pt->p, kind == PEER_ASK_LEASE ? PROTO_T_PEER_LEASE :
		    PROTO_T_PEER_PROBE, buf, (uint32_t)blen, s->cfg->peer_timeout_ms, cb, pt) == 0) {
			a->pending++;
			sent++;
		}
		free(buf);
	}
	free(count);
	free(which);
	if (sent == 0) {
		a->cancelled = 1;
		peer_ask_settle(a);
		return 0;
	}
	*askp = a;
	a->pending--;		/* answers come from the loop, never from inside this call */
	return 1;

fail:
	free(count);
	free(which);
	if (a != NULL) {
		if (a->parts != NULL)
			for (i = 0; i < a->nparts; i++)
				free(a->parts[i].keys);
		free(a->parts);
		peer_view_fini(&a->view, NULL);
		free(a);
	}
	return 0;
}

/* The asker no longer wants the answer: done() never runs; the owners' pins go. */
void
peer_ask_cancel(struct peer_ask *a)
{
	if (a != NULL)
		a->cancelled = 1;
}

/* ------------------------------------------------------------------ pulls */

static void	peer_run_forget(struct peer_run *, const struct peer_pull *);

static void
peer_pull_free(struct peer_pull *pl)
{
	if (pl->run != NULL)
		peer_run_forget(pl->run, pl);
	TAILQ_REMOVE(&pl->p->pulls, pl, entry);
	if (!pl->posted)
		TAILQ_REMOVE(&pl->p->tier->queued, pl, qentry);
	peer_olease_unref(pl->g.ol);
	peer_unref(pl->p);
	free(pl);
}

/*
 * A pull's read ended (err), and when it landed and was to be verified,
 * its bytes' checksum is sum (the workers computed it: peer_run_verified).
 */
static void
peer_pull_landed(struct peer_pull *pl, int err, uint64_t sum)
{
	struct peer		*p = pl->p;
	peer_pull_done_fn	*done = pl->done;
	void			*darg = pl->arg;
	enum peer_fail		 why = PEER_FAIL__MAX;

	if (err == 0 && (pl->doomed || p->incarnation != pl->g.incarnation)) {
		err = -ESTALE;
		why = PEER_FAIL_STALE;
	} else if (err == 0 && pl->verify && sum != pl->g.checksum) {
		err = -EBADMSG;
		why = PEER_FAIL_CHECKSUM;
	} else if (err == -ETIMEDOUT)
		why = PEER_FAIL_TIMEOUT;
	else if (err != 0)
		why = pl->doomed ? PEER_FAIL_STALE : PEER_FAIL_IO;
	if (err == 0) {
		p->pulls_done++;
		p->pull_bytes += pl->g.len;
	} else {
		p->failures[why]++;
		log_warn("peer", "%s: a pull of %llu bytes failed (%s): the object is dropped",
		    p->m.id, (unsigned long long)pl->g.len, peer_fail_names[why]);
	}
	peer_pull_free(pl);
	done(darg, err);
	server_maybe_finish(p->tier->s);
}

/*
 * One read for pulls whose source and destination are both contiguous;
 * once it landed, one digest job of the host copy engine (a page per
 * pull), so that the loop never hashes the pulled bytes: at one core's
 * XXH3 rate it would cap the tier below a fast NIC, and it would stop
 * the loop's progress of the reads still on the wire meanwhile. Until
 * its completion runs, the run is on the tier's verifying list (peer_free
 * frees those whose completion never ran: the workers stopped first).
 */
struct peer_run {
	unsigned		 n;
	struct peer_tier	*t;		/* set while on its verifying list */
	struct copy_job		 job;
	struct copy_page	*pages;
	TAILQ_ENTRY(peer_run)	 entry;		/* the tier's verifying list */
	struct peer_pull	*pl[];
};

/* A pull goes while its run's digests are on the workers: they stay, it is forgotten. */
static void
peer_run_forget(struct peer_run *run, const struct peer_pull *pl)
{
	unsigned	i;

	for (i = 0; i < run->n; i++)
		if (run->pl[i] == pl)
			run->pl[i] = NULL;
}

static void
peer_run_free(struct peer_run *run)
{
	free(run->pages);
	free(run);
}

/* The digests are in: each object is verified on its own (a bad one fails only itself). */
static void
peer_run_verified(struct copy_job *job)
{
	struct peer_run		*run = job->arg;
	struct peer_pull	*pl;
	unsigned		 i;

	TAILQ_REMOVE(&run->t->verifying, run, entry);
	for (i = 0; i < run->n; i++) {
		if ((pl = run->pl[i]) == NULL)
			continue;
		pl->run = NULL;
		peer_pull_landed(pl, job->status == PROTO_S_OK ? 0 : -EIO, run->pages[i].checksum);
	}
	peer_run_free(run);
}

static void
peer_run_done(void *arg, int err)
{
	struct peer_run		*run = arg;
	struct server		*s = run->pl[0]->s;
	unsigned		 i, verify = 0;

	for (i = 0; i < run->n; i++)
		verify += run->pl[i]->verify;
	if (err == 0 && verify == 0) {
		/* A restore's pulls: its copy checks them (peer_pull_start). */
		for (i = 0; i < run->n; i++)
			peer_pull_landed(run->pl[i], 0, 0);
		free(run);
		return;
	}
	if (err == 0 && s->copy != NULL && (run->pages = calloc(run->n, sizeof(*run->pages))) != NULL) {
		for (i = 0; i < run->n; i++) {
			run->pages[i].obj = run->pl[i]->dst;
			run->pages[i].len = run->pl[i]->g.len;
			run->pl[i]->run = run;
		}
		run->t = s->peer;
		TAILQ_INSERT_TAIL(&run->t->verifying, run, entry);
		run->job.kind = COPY_DIGEST;
		run->job.pages = run->pages;
		run->job.npages = run->n;
		run->job.done = peer_run_verified;
		run->job.arg = run;
		copy_host_submit(s->copy, &run->job);
		return;
	}
	/* A failed read, or no memory for the job: as it is, on the loop. */
	for (i = 0; i < run->n; i++)
		peer_pull_landed(run->pl[i], err, err == 0 ?
		    checksum_obj(run->pl[i]->dst, run->pl[i]->g.len) : 0);
	free(run);
}

/* Whether b continues a's read: same owner and key, contiguous there and here. */
static int
peer_pull_follows(const struct peer_pull *a, const struct peer_pull *b, uint64_t runlen)
{
	return a->p == b->p && a->g.rkey == b->g.rkey && a->g.raddr + a->g.len == b->g.raddr &&
	    (const uint8_t *)a->dst + a->g.len == (const uint8_t *)b->dst &&
	    runlen + b->g.len <= PEER_RUN_MAX;
}

/*
 * The pulls queued on this loop turn (or, with testing.peer_pull_delay_ms,
 * since the delay began) go out, coalesced: a run of pulls from one owner
 * whose objects follow each other there and whose staging objects follow
 * each other here (a prefix published in one PUBLISH, staged by one ADMIT)
 * is one read of up to PEER_RUN_MAX bytes.
 */
static void
peer_flush_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct peer_tier	*t = arg;
	struct peer_pull	*first, *pl, *next;
	struct peer_run		*run;
	uint64_t		 len;
	unsigned		 n, i;
	int			 rc;

	(void)fd;
	(void)ev;
	while ((first = TAILQ_FIRST(&t->queued)) != NULL) {
		len = first->g.len;
		for (n = 1, pl = first; (next = TAILQ_NEXT(pl, qentry)) != NULL &&
		    peer_pull_follows(pl, next, len); pl = next, n++)
			len += next->g.len;
		if ((run = calloc(1, sizeof(*run) + n * sizeof(run->pl[0]))) == NULL) {
			/* Out of memory: the first fails, the rest wait for the next turn. */
			TAILQ_REMOVE(&t->queued, first, qentry);
			first->posted = 1;
			peer_pull_landed(first, -ENOMEM, 0);
			continue;
		}
		for (i = 0, pl = first; i < n; i++, pl = next) {
			next = TAILQ_NEXT(pl, qentry);
			TAILQ_REMOVE(&t->queued, pl, qentry);
			pl->posted = 1;
			run->pl[i] = pl;
		}
		run->n = n;
		rc = -ESTALE;
		if (!first->doomed && first->p->fabric_ok) {
			first->p->reads++;
			rc = fabric_read(t->fab, first->p->fabric_peer, first->dst, len, first->g.raddr,
			    first->g.rkey, t->s->cfg->peer_pull_timeout_ms, peer_run_done, run);
		}
		if (rc != 0)
			peer_run_done(run, rc);
	}
}

/*
 * Starts a pull of g into dst (g->len bytes, inside the exposed arena).
 * 0: done(arg, err) runs on the loop once the bytes landed (err 0; with
 * verify, only once they were also found to have g's checksum) or the
 * pull failed; never from inside this call. Without verify the caller
 * checks the checksum where it reads the bytes next (peer_blame).
 * -errno: refused before anything was posted (owner not up in the
 * granting incarnation, address or key outside its chunks); done never
 * runs. The read is posted when the loop comes back (peer_flush_cb).
 */
int
peer_pull_start(struct server *s, const struct peer_grant *g, void *dst, int verify,
    peer_pull_done_fn *done, void *arg)
{
	struct peer_tier	*t = s->peer;
	struct peer		*p = g->peer;
	struct peer_pull	*pl;
	struct timeval		 tv = { 0, 0 };

	if (t == NULL || t->fab == NULL || p->removed || p->state != PEER_UP || !p->fabric_ok ||
	    p->incarnation != g->incarnation)
		return -ESTALE;
	/* A PROBE's answer (no length, no key) is never pulled from. */
	if (g->len == 0 || g->len > FILETIER_OBJ_MAX || !peer_mr_ok(p, g->raddr, g->rkey, g->len)) {
		p->failures[PEER_FAIL_KEY]++;
		return -EINVAL;
	}
	if ((pl = calloc(1, sizeof(*pl))) == NULL)
		return -ENOMEM;
	pl->s = s;
	pl->p = p;
	pl->g = *g;
	pl->g.next = NULL;
	pl->dst = dst;
	pl->verify = verify != 0;
	pl->done = done;
	pl->arg = arg;
	if (g->ol != NULL)
		g->ol->refs++;
	peer_ref(p);
	TAILQ_INSERT_TAIL(&p->pulls, pl, entry);
	TAILQ_INSERT_TAIL(&t->queued, pl, qentry);
	if (!evtimer_pending(t->ev_flush, NULL)) {
		tv.tv_sec = s->cfg->test_peer_pull_delay_ms / 1000;
		tv.tv_usec = (s->cfg->test_peer_pull_delay_ms % 1000) * 1000;
		evtimer_add(t->ev_flush, &tv);
	}
	return 0;
}

/* The serial of the peer that granted a pull (0: none): peer_blame's name for it. */
uint32_t
peer_serial(const struct peer *p)
{
	return p != NULL ? p->serial : 0;
}

/*
 * A restore found that an object pulled from peer `serial` unverified
 * (peer_pull_start) does not have the checksum its owner said: the pull's
 * checksum failure, counted against that peer (if still a member) as if
 * it had been found on landing.
 */
void
peer_blame(struct server *s, uint32_t serial, uint64_t len)
{
	struct peer_tier	*t = s->peer;
	size_t			 i;

	if (t == NULL || serial == 0)
		return;
	for (i = 0; i < t->npeers; i++) {
		if (t->peers[i]->serial != serial)
			continue;
		t->peers[i]->failures[PEER_FAIL_CHECKSUM]++;
		log_warn("peer", "%s: a pulled object of %llu bytes failed its checksum at its "
		    "restore: the object is dropped", t->peers[i]->m.id, (unsigned long long)len);
		return;
	}
}

/* Pulls in flight: a drain waits for them (their bytes land in the arena). */
unsigned
peer_inflight(const struct server *s)
{
	const struct peer_tier	*t = s->peer;
	const struct peer_pull	*pl;
	unsigned		 n = 0;
	size_t			 i;

	if (t == NULL)
		return 0;
	for (i = 0; i < t->npeers; i++)
		TAILQ_FOREACH(pl, &t->peers[i]->pulls, entry)
			n++;
	return n;
}

/* ------------------------------------------------------------------ offers */

static void
peer_offer_reply(void *arg, struct peer *p, unsigned status, const uint8_t *payload, uint32_t len)
{
	struct peer_offer_out		*o = arg;
	struct proto_peer_offer_reply	 r;
	uint32_t			 i;

	if (status == PROTO_S_OK && len == sizeof(r)) {
		memcpy(&r, payload, sizeof(r));
		log_debug("peer", "%s took an offer of %u: %u stored, %u present, %u failed",
		    p->m.id, o->n, r.stored, r.present, r.failed);
	}
	for (i = 0; i < o->n; i++)
		dram_unpin(o->s->dram, o->ids[i]);
	free(o->ids);
	free(o);
}

/*
 * Offers new objects (n keys, their DRAM ids, heads for placement) to
 * their homes: each home that is another daemon and up gets the objects
 * it is home of, pinned here until it answered (it pulls them).
 */
void
peer_offer(struct server *s, const struct obj_key *keys, const uint8_t *heads,
    const uint32_t *ids, size_t n)
{
	struct peer_tier	*t = s->peer;
	struct peer_offer_out	*o;
	struct proto_peer_offer	 oh;
	struct proto_peer_obj	*objs;
	struct obj_key		 pk;
	unsigned		 homes[PEER_REPLICAS_MAX], nh, h;
	size_t			 i, k, m;
	const uint8_t		*data;
	uint64_t		 len, csum;
	uint8_t			*buf;

	if (!peer_enabled(s) || n == 0)
		return;
	if ((buf = malloc(sizeof(oh) + n * sizeof(*objs))) == NULL)
		return;
	objs = (struct proto_peer_obj *)(void *)(buf + sizeof(oh));
	for (i = 0; i < t->npeers; i++) {
		struct peer *p = t->peers[i];

		if (p->state != PEER_UP || !p->fabric_ok)
			continue;
		if ((o = calloc(1, sizeof(*o))) == NULL || (o->ids = malloc(n * sizeof(*ids))) ==
		    NULL) {
			free(o);
			break;
		}
		o->s = s;
		for (k = 0, m = 0; k < n; k++) {
			peer_place_key(&keys[k], heads + k * PROTO_HASH_LEN, &pk);
			nh = peer_homes(t->members, t->nmembers, &pk, s->cfg->peer_replicas, homes);
			for (h = 0; h < nh && strcmp(t->members[homes[h]].id, p->m.id) != 0; h++)
				;
			if (h == nh || (data = dram_data(s->dram, ids[k], &len, &csum)) == NULL)
				continue;
			memset(&objs[m], 0, sizeof(objs[m]));
			if (fabric_rkey(t->fab, data, len, &objs[m].raddr, &objs[m].rkey) != 0 ||
			    dram_pin(s->dram, ids[k]) != 0)
				continue;
			peer_key_out(&keys[k], &objs[m].key);
			objs[m].present = 1;
			objs[m].len = len;
			objs[m].checksum = csum;
			o->ids[o->n++] = ids[k];
			m++;
		}
		if (m == 0) {
			free(o->ids);
			free(o);
			continue;
		}
		memset(&oh, 0, sizeof(oh));
		oh.offer = ++t->next_offer;
		oh.nobjs = (uint32_t)m;
		memcpy(buf, &oh, sizeof(oh));
		p->offers_sent++;
		if (peer_send(p, PROTO_T_PEER_OFFER, buf, (uint32_t)(sizeof(oh) + m * sizeof(*objs)),
		    s->cfg->peer_timeout_ms + s->cfg->peer_pull_timeout_ms, peer_offer_reply,
		    o) != 0)
			peer_offer_reply(o, p, PROTO_S_INTERNAL, NULL, 0);
	}
	free(buf);
}

/* ------------------------------------------------------------------ listener */

static void
peer_in_frame(struct conn *c, struct proto_frame *f, void *arg)
{
	(void)c;
	peer_serve_frame(arg, f);
}

static void
peer_in_closed(struct conn *c, void *arg)
{
	struct peer_in	*in = arg;

	(void)c;
	peer_serve_closed(in);
	TAILQ_REMOVE(&in->tier->ins, in, entry);
	in->c = NULL;
	if (in->offers == 0)
		free(in);
}

static void
peer_accept_cb(evutil_socket_t lfd, short ev, void *arg)
{
	struct peer_tier	*t = arg;
	struct sockaddr_storage	 from;
	struct peer_in		*in;
	socklen_t		 fromlen;
	int			 fd;

	(void)ev;
	for (;;) {
		fromlen = sizeof(from);
		if ((fd = accept4(lfd, (struct sockaddr *)&from, &fromlen,
		    SOCK_NONBLOCK | SOCK_CLOEXEC)) < 0)
			break;
		if (t->s->stopping || (in = calloc(1, sizeof(*in))) == NULL) {
			close(fd);
			continue;
		}
		peer_sockopts(t, fd);
		in->from = from;	/* its HELLO must name a member listed at this address */
		in->tier = t;
		TAILQ_INIT(&in->leases);
		if ((in->c = conn_new(t->s, fd, 0, 0, 0, PROTO_CHAN_PEER, peer_in_frame,
		    peer_in_closed, in)) == NULL) {
			close(fd);
			free(in);
			continue;
		}
		TAILQ_INSERT_TAIL(&t->ins, in, entry);
	}
}

/*
 * The resolver of members' and etcd's names: libevent's evdns, on the
 * loop, from resolv.conf (testing.resolv_conf in tests) and /etc/hosts.
 * Without one (no memory) names do not resolve; numeric addresses work.
 */
static void
peer_dns_open(struct peer_tier *t)
{
	const char	*conf = t->s->cfg->test_resolv_conf[0] != '\0' ?
			    t->s->cfg->test_resolv_conf : "/etc/resolv.conf";
	int		 rc;

	if ((t->dns = evdns_base_new(t->s->base, EVDNS_BASE_DISABLE_WHEN_INACTIVE)) == NULL) {
		log_warn("peer", "no resolver (out of memory): members named by a host name "
		    "cannot be dialled");
		return;
	}
	/* 1: no file (evdns then asks 127.0.0.1); 2, 6: a nameserver line it could not use. */
	if ((rc = evdns_base_resolv_conf_parse(t->dns, DNS_OPTIONS_ALL, conf)) != 0)
		log_info("peer", "resolver: %s: %s (evdns error %d)", conf, rc == 1 ?
		    "cannot be read; names are asked of 127.0.0.1" : "not wholly usable", rc);
}

static int
peer_listen(struct peer_tier *t, char *err, size_t errlen)
{
	struct sockaddr_storage	ss;
	socklen_t		sslen;
	int			one = 1, rc;

	if ((rc = peer_resolve(t->s->cfg->peer_listen, &ss, &sslen)) != 0) {
		snprintf(err, errlen, "peer.listen %s: cannot resolve", t->s->cfg->peer_listen);
		return rc;
	}
	if ((t->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
	    0)) < 0 || setsockopt(t->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(t->listen_fd, (struct sockaddr *)&ss, sslen) != 0 || listen(t->listen_fd, 64) != 0) {
		rc = -errno;
		snprintf(err, errlen, "peer.listen %s: %s", t->s->cfg->peer_listen, strerror(errno));
		return rc;
	}
	t->ev_listen = event_new(t->s->base, t->listen_fd, EV_READ | EV_PERSIST, peer_accept_cb, t);
	if (t->ev_listen == NULL || event_add(t->ev_listen, NULL) != 0) {
		snprintf(err, errlen, "cannot register events");
		return -ENOMEM;
	}
	return 0;
}

/* The data path: the arena exposed, its chunks named for the HELLO. */
static void
peer_fabric_open(struct peer_tier *t)
{
	struct server	*s = t->s;
	char		 err[256];
	uint8_t		*arena, names[FABRIC_LANES_MAX * FABRIC_ADDR_MAX];
	size_t		 alen, off, len, nlen = sizeof(names);
	int		 rc;

	rc = fabric_open(s->base, s->cfg->peer_provider, s->cfg->peer_fabric_addr[0] != '\0' ?
	    s->cfg->peer_fabric_addr : NULL, s->cfg->peer_lanes, &t->fab, err, sizeof(err));
	if (rc != 0) {
		log_warn("peer", "provider %s: %s; the peer tier runs without a data path: "
		    "nothing is served or pulled", s->cfg->peer_provider, err);
		t->fab = NULL;
		return;
	}
	arena = dram_arena(s->dram, &alen);
	if ((rc = fabric_expose(t->fab, arena, alen, PEER_CHUNK)) != 0 ||
	    fabric_name(t->fab, names, &nlen) != 0 ||
	    nlen / fabric_lanes(t->fab) > sizeof(t->fabric_name)) {
		log_warn("peer", "provider %s: cannot expose the arena (%s); no data path",
		    s->cfg->peer_provider, strerror(rc < 0 ? -rc : EINVAL));
		fabric_close(t->fab);
		t->fab = NULL;
		return;
	}
	/* As many lanes' names as the HELLO's field holds (8 of IPv4's 16 bytes, 4 of IPv6's 28). */
	t->fabric_len = (uint16_t)(nlen / fabric_lanes(t->fab));
	t->fabric_lanes = (uint16_t)(fabric_lanes(t->fab) < sizeof(t->fabric_name) / t->fabric_len ?
	    fabric_lanes(t->fab) : sizeof(t->fabric_name) / t->fabric_len);
	if (t->fabric_lanes < fabric_lanes(t->fab))
		log_warn("peer", "peer.lanes is %u, but the HELLO holds %u endpoint names of %u "
		    "bytes: peers read us over %u lanes", fabric_lanes(t->fab), t->fabric_lanes,
		    t->fabric_len, t->fabric_lanes);
	memcpy(t->fabric_name, names, (size_t)t->fabric_len * t->fabric_lanes);
	for (off = 0; off < alen && t->nmr < PROTO_PEER_KEYS_MAX; off += len) {
		struct proto_peer_mr *m = &t->mr[t->nmr];

		len = alen - off < PEER_CHUNK ? alen - off : PEER_CHUNK;
		if (fabric_rkey(t->fab, arena + off, len, &m->raddr, &m->rkey) != 0)
			break;
		m->len = len;
		t->nmr++;
	}
	snprintf(t->provider, sizeof(t->provider), "%s", s->cfg->peer_provider);
	log_info("peer", "data path: %s, %u lane%s, arena of %zu bytes in %u chunks",
	    fabric_provider(t->fab), t->fabric_lanes, t->fabric_lanes == 1 ? "" : "s", alen, t->nmr);
}

/*
 * reload.c's hook for the peer.* keys: a reload changed peer.members (the
 * one live peer key), and the new list applies, unless etcd gave a view
 * already (then etcd's stands). Without the tier, nothing.
 */
int
peer_reload(struct server *s, const struct config *prev, char *err, size_t errlen)
{
	(void)prev;
	(void)err;
	(void)errlen;
	if (s->peer == NULL)
		return 0;
	if (s->peer->etcd_answered) {
		log_info("peer", "peer.members reloaded, but etcd's view stands");
		return 0;
	}
	peer_members_set(s, s->cfg->peer_members, s->cfg->npeer_members);
	return 0;
}

/* etcd.c's callback: a new view of the role's members (this daemon among them). */
static void
peer_etcd_view(void *arg, const struct peer_member *m, size_t n)
{
	struct peer_tier	*t = arg;

	t->etcd_answered = 1;
	t->etcd_views++;
	log_info("peer", "etcd: a view of %zu members", n);
	peer_members_set(t->s, m, n);
}

/*
 * Membership from etcd (peer.etcd.endpoint): this daemon registered under
 * the prefix, each view to peer_members_set. etcd.c retries on its own;
 * only bad arguments fail here.
 */
static int
peer_etcd_open(struct peer_tier *t, char *err, size_t errlen)
{
	const struct config	*cfg = t->s->cfg;
	char			 prefix[256];
	int			 rc;

	if (cfg->peer_etcd_endpoint[0] == '\0')
		return 0;
	if (cfg->peer_etcd_prefix[0] != '\0')
		snprintf(prefix, sizeof(prefix), "%s", cfg->peer_etcd_prefix);
	else
		snprintf(prefix, sizeof(prefix), "/l3kv/%s/", cfg->role);
	if ((rc = etcd_open(t->s->base, t->dns, cfg->peer_etcd_endpoint, prefix, &t->self,
	    cfg->peer_etcd_ttl_s, peer_etcd_view, t, &t->etcd, err, errlen)) != 0)
		return rc;
	log_info("peer", "membership from etcd %s under %s (lease %u s)", cfg->peer_etcd_endpoint,
	    prefix, cfg->peer_etcd_ttl_s);
	return 0;
}

int
peer_init(struct server *s, char *err, size_t errlen)
{
	struct peer_tier	*t;
	int			 rc;

	if (s->cfg->peer_id[0] == '\0')
		return 0;
	if ((t = calloc(1, sizeof(*t))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->peer = t;
	t->s = s;
	t->listen_fd = -1;
	TAILQ_INIT(&t->ins);
	TAILQ_INIT(&t->queued);
	TAILQ_INIT(&t->verifying);
	if ((t->ev_flush = evtimer_new(s->base, peer_flush_cb, t)) == NULL) {
		snprintf(err, errlen, "cannot register events");
		return -ENOMEM;
	}
	snprintf(t->self.id, sizeof(t->self.id), "%s", s->cfg->peer_id);
	snprintf(t->self.addr, sizeof(t->self.addr), "%s", s->cfg->peer_listen);
	while (t->incarnation == 0)
		if (getrandom(&t->incarnation, sizeof(t->incarnation), 0) != sizeof(t->incarnation))
			t->incarnation = (uint64_t)peer_now_us() ^ ((uint64_t)getpid() << 32);
	peer_dns_open(t);
	peer_fabric_open(t);
	if ((rc = peer_listen(t, err, errlen)) != 0)
		return rc;
	log_info("peer", "member %s, control channel on %s, incarnation %016llx", t->self.id,
	    s->cfg->peer_listen, (unsigned long long)t->incarnation);
	/* With etcd and no static list, the view is etcd's first one. */
	if (s->cfg->npeer_members > 0 || s->cfg->peer_etcd_endpoint[0] == '\0')
		peer_members_set(s, s->cfg->peer_members, s->cfg->npeer_members);
	return peer_etcd_open(t, err, errlen);
}

/* SIGTERM: no new peer connections, the ones there close; pulls in flight finish. */
void
peer_stop(struct server *s)
{
	struct peer_tier	*t = s->peer;
	struct peer_in		*in;
	size_t			 i;

	if (t == NULL)
		return;
	/* Our key goes now (the lease revoked), not at its TTL. */
	if (t->etcd != NULL) {
		etcd_close(t->etcd);
		t->etcd = NULL;
	}
	if (t->ev_listen != NULL)
		event_del(t->ev_listen);
	for (i = 0; i < t->npeers; i++) {
		evtimer_del(t->peers[i]->ev_timer);
		t->peers[i]->removed = 1;	/* no reconnect */
		if (t->peers[i]->out != NULL)
			conn_close(t->peers[i]->out);
	}
	TAILQ_FOREACH(in, &t->ins, entry)
		conn_close(in->c);
}

void
peer_free(struct server *s)
{
	struct peer_tier	*t = s->peer;
	struct peer_run		*run;
	size_t			 i;

	if (t == NULL)
		return;
	/* The connections went with server_free's; what is left is memory. */
	while (!TAILQ_EMPTY(&t->ins))
		conn_free(TAILQ_FIRST(&t->ins)->c);
	for (i = 0; i < t->npeers; i++) {
		struct peer *p = t->peers[i];

		/* Held here: the closes below drop references, and p goes last. */
		peer_ref(p);
		p->removed = 1;
		if (p->out != NULL)
			conn_free(p->out);
		while (!TAILQ_EMPTY(&p->pulls)) {
			/* Never posted, or a stub: nothing writes into the arena after this. */
			struct peer_pull *pl = TAILQ_FIRST(&p->pulls);

			pl->done(pl->arg, -ECANCELED);
			peer_pull_free(pl);
		}
		peer_destroy(p);
	}
	/* The workers stopped before (server_free): these completions never run. */
	while ((run = TAILQ_FIRST(&t->verifying)) != NULL) {
		TAILQ_REMOVE(&t->verifying, run, entry);
		peer_run_free(run);
	}
	if (t->etcd != NULL)
		etcd_close(t->etcd);
	/* After etcd's connections, which use it; answers still owed are never given. */
	if (t->dns != NULL)
		evdns_base_free(t->dns, 0);
	if (t->fab != NULL)
		fabric_close(t->fab);
	if (t->ev_flush != NULL)
		event_free(t->ev_flush);
	if (t->ev_listen != NULL)
		event_free(t->ev_listen);
	if (t->listen_fd >= 0)
		close(t->listen_fd);
	free(t->peers);
	free(t->members);
	free(t);
	s->peer = NULL;
}

/* ------------------------------------------------------------------ STATS */

struct json_t *
peer_stats_json(struct server *s)
{
	struct peer_tier	*t = s->peer;
	json_t			*o, *a, *po, *fo;
	size_t			 i;
	unsigned		 f, pulling;
	struct peer_pull	*pl;
	struct fabric_stats	 fst;
	json_t			*lr;
	char			 inc[24];

	if (t == NULL)
		return json_null();	/* the tier is off (peer.id is "") */
	a = json_array();
	for (i = 0; i < t->npeers; i++) {
		struct peer *p = t->peers[i];

		fo = json_object();
		for (f = 0; f < PEER_FAIL__MAX; f++)
			json_object_set_new(fo, peer_fail_names[f], json_integer((json_int_t)
			    p->failures[f]));
		pulling = 0;
		TAILQ_FOREACH(pl, &p->pulls, entry)
			pulling++;
		po = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		    "id", p->m.id, "addr", p->m.addr, "state", peer_state_name(p->state),
		    "data_path", p->fabric_ok ? "yes" : "no", "rtt_us", (json_int_t)p->rtt_us,
		    "connects", (json_int_t)p->connects, "pulls", (json_int_t)p->pulls_done,
		    "pulls_inflight", (json_int_t)pulling, "pull_bytes", (json_int_t)p->pull_bytes,
		    "reads", (json_int_t)p->reads,
		    "probes_sent", (json_int_t)p->probes_sent, "leases_sent",
		    (json_int_t)p->leases_sent, "offers_sent", (json_int_t)p->offers_sent,
		    "asks_missed", (json_int_t)p->asks_missed);
		snprintf(inc, sizeof(inc), "%016llx", (unsigned long long)p->incarnation);
		json_object_set_new(po, "incarnation", json_string(inc));
		json_object_set_new(po, "lanes", json_integer((json_int_t)p->lanes));
		json_object_set_new(po, "failures", fo);
		json_array_append_new(a, po);
	}
	o = json_pack("{s:b, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	    "enabled", 1, "id", t->self.id, "listen", s->cfg->peer_listen, "provider",
	    t->fab != NULL ? fabric_provider(t->fab) : "none", "members", (json_int_t)t->nmembers,
	    "refused", (json_int_t)t->refused, "probes_served", (json_int_t)t->probes_served,
	    "leases_served", (json_int_t)t->leases_served, "objects_leased",
	    (json_int_t)t->objects_leased, "leases_expired", (json_int_t)t->leases_expired,
	    "offers_served", (json_int_t)t->offers_served, "offers_stored",
	    (json_int_t)t->offers_stored, "pins", (json_int_t)t->pins);
	json_object_set_new(o, "membership", json_string(t->etcd == NULL ? "static" :
	    t->etcd_answered ? "etcd" : "static, etcd not answered yet"));
	json_object_set_new(o, "etcd_views", json_integer((json_int_t)t->etcd_views));
	json_object_set_new(o, "lanes", json_integer((json_int_t)(t->fab != NULL ?
	    fabric_lanes(t->fab) : 0)));
	lr = json_array();
	if (t->fab != NULL) {
		fabric_get_stats(t->fab, &fst);
		for (f = 0; f < fabric_lanes(t->fab); f++)
			json_array_append_new(lr, json_integer((json_int_t)fst.lane_reads[f]));
	}
	json_object_set_new(o, "lane_reads", lr);
	json_object_set_new(o, "peers", a);
	return o;
}
