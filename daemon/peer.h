/*
 * The peer tier's private header: what peer.c (members, the control
 * channel, asks and pulls) and peer_serve.c (the owner's and the home's
 * side: PROBE, LEASE, RELEASE, OFFER) share. Everything else reaches the
 * tier through the peer.c and peer_view.c sections of daemon.h.
 */
#ifndef L3KV_PEER_H
#define L3KV_PEER_H

#include <sys/socket.h>

#include "daemon.h"

enum peer_state {
	PEER_DOWN = 0,		/* no control connection; a reconnect is timed */
	PEER_CONNECTING,	/* dialled, HELLO sent, not answered */
	PEER_UP,		/* HELLO answered: asks and pulls go to it */
};

/* Why a pull failed, for STATS. */
enum peer_fail {
	PEER_FAIL_TIMEOUT = 0,	/* the read's deadline */
	PEER_FAIL_CHECKSUM,	/* landed bytes are not what the owner said */
	PEER_FAIL_STALE,	/* the owner went away or restarted (incarnation) meanwhile */
	PEER_FAIL_IO,		/* the provider failed the read */
	PEER_FAIL_KEY,		/* an owner's address or key outside what its HELLO named */
	PEER_FAIL__MAX
};

#define PEER_ADDRS_MAX		8	/* of a member's name, kept */
#define PEER_DNS_REFRESH_MS	30000	/* a name's addresses, re-resolved after */

struct evdns_base;
struct evdns_getaddrinfo_request;
struct peer_req;
TAILQ_HEAD(peer_req_list, peer_req);
struct peer_pull;
TAILQ_HEAD(peer_pull_list, peer_pull);
struct peer_run;
TAILQ_HEAD(peer_run_list, peer_run);
struct peer_slease;
TAILQ_HEAD(peer_slease_list, peer_slease);

/* Another member of the role, as this daemon sees it. */
struct peer {
	struct peer_member	 m;
	struct peer_tier	*tier;
	int			 state;		/* PEER_* */
	int			 removed;	/* out of the member list; freed once unused */
	uint32_t		 serial;	/* never 0, never reused: peer_blame's name for it */
	unsigned		 refs;		/* owner leases and pulls that name it */
	struct conn		*out;		/* the connection this daemon dialled */
	uint8_t			 nonce[PROTO_PEER_NONCE];	/* ours, in our HELLO on out */
	uint64_t		 incarnation;	/* its, from the last HELLO; 0: none yet */
	uint64_t		 fabric_peer;
	int			 fabric_ok;	/* fabric_peer is its current endpoint */
	uint8_t			 fabric_name[PROTO_PEER_ADDR_MAX];	/* its lanes' names */
	uint16_t		 fabric_len;	/* of one name */
	uint16_t		 fabric_lanes;	/* names in its HELLO */
	unsigned		 lanes;		/* read over: min(ours, its) */
	struct proto_peer_mr	 mr[PROTO_PEER_KEYS_MAX];
	uint16_t		 nmr;
	/*
	 * m.addr's addresses (peer_addr_refresh): a numeric host's at once, a
	 * name's from evdns, refreshed in the background (the old ones serve
	 * meanwhile). Dialling tries them in turn; a HELLO must come from one.
	 */
	struct sockaddr_storage	 addrs[PEER_ADDRS_MAX];
	unsigned		 naddrs;
	unsigned		 addr_next;	/* the one to dial: the next after one that failed */
	int			 numeric;	/* m.addr's host is an address */
	int64_t			 resolved_ms;	/* the last answer; 0: none */
	int			 resolving;	/* an evdns request in flight (dns, when not done) */
	int			 dial_waits;	/* peer_connect waits for its answer */
	struct evdns_getaddrinfo_request *dns;
	struct event		*ev_timer;	/* reconnect, then pings */
	uint64_t		 next_seq;
	struct peer_req_list	 reqs;		/* sent on out, not answered */
	struct peer_pull_list	 pulls;		/* reads from it in flight */
	unsigned		 pings_unanswered;
	uint64_t		 backoff_ms;
	/* STATS. */
	uint64_t		 rtt_us;
	uint64_t		 connects;
	uint64_t		 pulls_done;
	uint64_t		 reads;		/* fabric reads posted: pulls coalesced */
	uint64_t		 pull_bytes;
	uint64_t		 failures[PEER_FAIL__MAX];
	uint64_t		 probes_sent;
	uint64_t		 leases_sent;
	uint64_t		 offers_sent;
	uint64_t		 asks_missed;	/* an answer that did not come in time, or refused */
};

/* A connection a member dialled: its requests, answered here. */
struct peer_in {
	struct conn		*c;
	struct peer_tier	*tier;
	struct peer		*p;		/* after its HELLO */
	struct sockaddr_storage	 from;		/* where it connected from (accept) */
	int			 authed;	/* PEER_AUTH checked (or no secret) */
	uint8_t			 nonce[PROTO_PEER_NONCE];	/* ours, in the HELLO reply */
	struct proto_peer_hello	 hello;		/* with a secret: its HELLO, until its AUTH */
	struct peer_slease_list	 leases;	/* what it pinned here */
	unsigned		 offers;	/* its offers being pulled */
	TAILQ_ENTRY(peer_in)	 entry;
};
TAILQ_HEAD(peer_in_list, peer_in);

struct peer_tier {
	struct server		*s;
	struct peer_member	 self;
	uint64_t		 incarnation;
	struct peer_member	*members;	/* the whole list, self included: placement */
	size_t			 nmembers;
	struct peer		**peers;	/* the others */
	size_t			 npeers;
	int			 listen_fd;
	struct event		*ev_listen;
	struct peer_in_list	 ins;
	struct fabric		*fab;		/* NULL: no data path (nothing served, nothing pulled) */
	struct evdns_base	*dns;		/* members' and etcd's names; NULL: none resolve */
	char			 provider[PROTO_PEER_PROV_LEN];
	uint8_t			 fabric_name[PROTO_PEER_ADDR_MAX];	/* fabric_lanes names */
	uint16_t		 fabric_len;	/* of one name */
	uint16_t		 fabric_lanes;
	struct proto_peer_mr	 mr[PROTO_PEER_KEYS_MAX];
	uint16_t		 nmr;
	uint64_t		 next_lease;
	uint64_t		 next_offer;
	uint32_t		 next_serial;
	struct peer_pull_list	 queued;	/* pulls to post when the loop comes back */
	struct peer_run_list	 verifying;	/* landed reads, their digests on the workers */
	struct event		*ev_flush;
	struct etcd		*etcd;		/* NULL: the static list alone */
	int			 etcd_answered;	/* etcd gave a view: a reload's list waits */
	uint64_t		 etcd_views;	/* STATS: views etcd gave */
	/* STATS. */
	uint64_t		 refused;	/* connections refused at HELLO or AUTH */
	uint64_t		 probes_served;
	uint64_t		 leases_served;
	uint64_t		 objects_leased;
	uint64_t		 leases_expired;
	uint64_t		 offers_served;
	uint64_t		 offers_stored;
	uint64_t		 pins;		/* objects pinned for peers now */
};

/* A request sent on a peer's out connection, answered once (reply, timeout or close). */
typedef void peer_reply_fn(void *arg, struct peer *, unsigned status, const uint8_t *payload,
    uint32_t len);

/* peer.c */
int	 peer_send(struct peer *, unsigned type, const void *payload, uint32_t len,
	    uint32_t timeout_ms, peer_reply_fn *, void *arg);
struct peer *peer_by_id(struct peer_tier *, const char *id);
int	 peer_hello_counts_ok(const struct proto_peer_hello *);
void	 peer_hello_data(const struct peer_tier *, struct proto_peer_hello *);
int	 peer_set_remote(struct peer *, const struct proto_peer_hello *);
int	 peer_mr_ok(const struct peer *, uint64_t raddr, uint64_t rkey, uint64_t len);
int	 peer_source_ok(struct peer *, const struct sockaddr *from);
int	 peer_pull_start(struct server *, const struct peer_grant *, void *dst, int verify,
	    peer_pull_done_fn *, void *arg);
void	 peer_ref(struct peer *);
void	 peer_unref(struct peer *);
void	 peer_key_out(const struct obj_key *, struct proto_peer_key *);
int	 peer_key_in(const struct proto_peer_key *, struct obj_key *);

/* peer_serve.c */
void	 peer_serve_frame(struct peer_in *, struct proto_frame *);
void	 peer_serve_closed(struct peer_in *);
void	 peer_proof(const struct peer_tier *, const uint8_t *nonce, const char *id,
	    uint64_t incarnation, uint8_t *out);

#endif /* L3KV_PEER_H */
