/*
 * Encoding, validation and debug dumps of l3kv protocol frames.
 *
 * Everything here works on bytes the caller already holds; nothing does
 * I/O or allocates. Validation functions return a PROTO_S_* status (0 for
 * a good frame) so that the daemon can answer with it directly; the
 * client library turns statuses into -errno with proto_status_errno().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"

struct proto_status_info {
	const char	*name;
	const char	*text;
	int		 err;
};

static const struct proto_status_info proto_statuses[PROTO_S__MAX] = {
	[PROTO_S_OK] = { "ok", "success", 0 },
	[PROTO_S_BAD_MAGIC] = { "bad_magic", "bad frame magic", EPROTO },
	[PROTO_S_BAD_VERSION] = { "bad_version", "unsupported protocol version", EPROTONOSUPPORT },
	[PROTO_S_TOO_BIG] = { "too_big", "frame longer than the daemon's limit", EMSGSIZE },
	[PROTO_S_BAD_TYPE] = { "bad_type", "unknown message type", EOPNOTSUPP },
	[PROTO_S_BAD_LENGTH] = { "bad_length", "payload length wrong for its type", EBADMSG },
	[PROTO_S_SHORT_HEADER] = { "short_header", "stream ended inside a frame header", EPROTO },
	[PROTO_S_TRUNCATED] = { "truncated", "stream ended inside a frame payload", EPROTO },
	[PROTO_S_UNEXPECTED_FDS] = { "unexpected_fds", "file descriptors on a frame that takes none",
	    EBADMSG },
	[PROTO_S_DENIED] = { "denied", "peer credentials not allowed", EACCES },
	[PROTO_S_LIMIT] = { "limit", "a connection, namespace or waiting-ADMIT limit is reached", EUSERS },
	[PROTO_S_INVALID] = { "invalid", "invalid field value", EINVAL },
	[PROTO_S_STATE] = { "state", "not allowed in this connection state", EISCONN },
	[PROTO_S_GUARD] = { "guard", "refused by a policy guard", EPERM },
	[PROTO_S_NO_MEMORY] = { "no_memory", "daemon out of memory", ENOMEM },
	[PROTO_S_INTERNAL] = { "internal", "internal daemon error", EIO },
	[PROTO_S_BAD_REGION] = { "bad_region", "memory registration unusable", EFAULT },
	[PROTO_S_BAD_FLAGS] = { "bad_flags", "unknown header flags", EBADMSG },
	[PROTO_S_SHUTTING_DOWN] = { "shutting_down", "daemon is shutting down", ESHUTDOWN },
	[PROTO_S_OUT_OF_BOUNDS] = { "out_of_bounds", "destination outside registered memory", ERANGE },
	[PROTO_S_NOT_FOUND] = { "not_found", "no such lease or object", ENOENT },
	[PROTO_S_EXPIRED] = { "expired", "lease expired", ETIME },
	[PROTO_S_LOST] = { "lost", "promised data was lost or corrupt", ENODATA },
	[PROTO_S_CANCELLED] = { "cancelled", "cancelled", ECANCELED },
	[PROTO_S_NO_SPACE] = { "no_space", "no space in the tier", ENOSPC },
	[PROTO_S_BUSY] = { "busy", "busy", EBUSY },
	[PROTO_S_TIMEOUT] = { "timeout", "timed out", ETIMEDOUT },
	[PROTO_S_GROUP_MISMATCH] = { "group_mismatch", "attach disagrees with its group", EXDEV },
	[PROTO_S_SLOT] = { "slot", "state slot is live or held by another lease", EADDRINUSE },
	[PROTO_S_PEER_UNKNOWN] = { "peer_unknown", "not a member of this daemon's role", EACCES },
	[PROTO_S_PEER_AUTH] = { "peer_auth", "peer authentication failed", EKEYREJECTED },
	[PROTO_S_PEER_ROLE] = { "peer_role", "peer of another role, or this daemon itself", EPROTOTYPE },
	[PROTO_S_PEER_STALE] = { "peer_stale", "owner lease of another incarnation", ESTALE },
	[PROTO_S_WRONG_DEVICE] = { "wrong_device", "GPU memory is not on the device claimed",
	    ENXIO },
};

const char *
proto_status_name(unsigned s)
{
	if (s >= PROTO_S__MAX || proto_statuses[s].name == NULL)
		return "unknown";
	return proto_statuses[s].name;
}

/* A decline reason's name (STATS, /metrics): "no_hit", ...; "unknown" past the list. */
const char *
proto_decline_name(unsigned d)
{
	static const char *const names[PROTO_DECLINE__MAX] = {
		[PROTO_DECLINE_NONE] = "none",
		[PROTO_DECLINE_NO_HIT] = "no_hit",
		[PROTO_DECLINE_NO_RESERVATION] = "no_reservation",
		[PROTO_DECLINE_GROUP_TIMEOUT] = "group_timeout",
		[PROTO_DECLINE_GROUP_MISMATCH] = "group_mismatch",
		[PROTO_DECLINE_SHUTTING_DOWN] = "shutting_down",
		[PROTO_DECLINE_RANK_LEFT] = "rank_left",
		[PROTO_DECLINE_NO_SLOT] = "no_slot",
		[PROTO_DECLINE_SLOT_BUSY] = "slot_busy",
	};

	if (d >= PROTO_DECLINE__MAX || names[d] == NULL)
		return "unknown";
	return names[d];
}

const char *
proto_status_text(unsigned s)
{
	if (s >= PROTO_S__MAX || proto_statuses[s].text == NULL)
		return "unknown status";
	return proto_statuses[s].text;
}

/* The negative errno libl3kv returns for a reply status. */
int
proto_status_errno(unsigned s)
{
	if (s >= PROTO_S__MAX || proto_statuses[s].name == NULL)
		return -EPROTO;
	return -proto_statuses[s].err;
}

/*
 * The message types: the one list of them. A type a client may send is
 * marked PROTO_TYPE_REQUEST (proto_hdr_check() lets through nothing
 * else; the daemon's dispatcher must serve each, and checks so at
 * start); its payload length follows one rule, checked before any field
 * is read: a fixed size, or a fixed part and count * elem bytes where
 * the count is a uint32 at count_at, or ATTACH's own.
 */
struct proto_type_info {
	const char	*name;
	uint8_t		 flags;
#define PROTO_TYPE_REQUEST	0x01	/* a client may send it: served */
#define PROTO_TYPE_FDS		0x02	/* may carry SCM_RIGHTS fds (PROTO_F_FDS) */
#define PROTO_TYPE_PEER		0x04	/* the peer channel's, both ways (PROTO_CHAN_PEER) */
	uint8_t		 rule;
#define PROTO_LEN_FIXED		0
#define PROTO_LEN_COUNTED	1
#define PROTO_LEN_ATTACH	2
	uint8_t		 count_at;
	uint32_t	 fixed;
	uint32_t	 elem;
};

#define PROTO_REQ(n, len)	{ n, PROTO_TYPE_REQUEST, PROTO_LEN_FIXED, 0, len, 0 }
#define PROTO_REQ_COUNTED(n, fixed, at, elem) \
	{ n, PROTO_TYPE_REQUEST, PROTO_LEN_COUNTED, at, fixed, elem }
#define PROTO_PEER(n, len)	{ n, PROTO_TYPE_PEER, PROTO_LEN_FIXED, 0, len, 0 }
#define PROTO_PEER_COUNTED(n, fixed, at, elem) \
	{ n, PROTO_TYPE_PEER, PROTO_LEN_COUNTED, at, fixed, elem }

static const struct proto_type_info proto_types[PROTO_TYPES_MAX] = {
	[PROTO_T_HELLO] =	PROTO_REQ("HELLO", sizeof(struct proto_hello)),
	[PROTO_T_ATTACH] =	{ "ATTACH", PROTO_TYPE_REQUEST | PROTO_TYPE_FDS, PROTO_LEN_ATTACH,
				  0, 0, 0 },
	[PROTO_T_DETACH] =	PROTO_REQ("DETACH", 0),
	[PROTO_T_STATS] =	PROTO_REQ("STATS", 0),
	[PROTO_T_HEALTH] =	PROTO_REQ("HEALTH", 0),
	[PROTO_T_PROBE] =	PROTO_REQ_COUNTED("PROBE", sizeof(struct proto_probe), 0,
				    PROTO_HASH_LEN),
	[PROTO_T_ADMIT] =	PROTO_REQ_COUNTED("ADMIT", sizeof(struct proto_admit), 8,
				    PROTO_HASH_LEN),
	[PROTO_T_RESTORE] =	PROTO_REQ_COUNTED("RESTORE", sizeof(struct proto_restore), 8, 4),
	[PROTO_T_CANCEL] =	PROTO_REQ("CANCEL", sizeof(struct proto_lease_op)),
	[PROTO_T_RELEASE] =	PROTO_REQ("RELEASE", sizeof(struct proto_lease_op)),
	[PROTO_T_PUBLISH] =	PROTO_REQ_COUNTED("PUBLISH", sizeof(struct proto_publish), 0,
				    sizeof(struct proto_publish_page)),
	[PROTO_T_SET_POLICY] =	PROTO_REQ("SET_POLICY", sizeof(struct proto_set_policy)),
	[PROTO_T_RELOAD] =	PROTO_REQ("RELOAD", 0),
	[PROTO_T_LIST] =	PROTO_REQ("LIST", sizeof(struct proto_list)),
	[PROTO_T_DEBUG] =	PROTO_REQ("DEBUG", sizeof(struct proto_debug)),
	[PROTO_T_PEER_HELLO] =	PROTO_PEER("PEER_HELLO", sizeof(struct proto_peer_hello)),
	[PROTO_T_PEER_AUTH] =	PROTO_PEER("PEER_AUTH", sizeof(struct proto_peer_auth)),
	[PROTO_T_PEER_PING] =	PROTO_PEER("PEER_PING", sizeof(struct proto_peer_ping)),
	[PROTO_T_PEER_PROBE] =	PROTO_PEER_COUNTED("PEER_PROBE", sizeof(struct proto_peer_probe), 0,
				    sizeof(struct proto_peer_key)),
	[PROTO_T_PEER_LEASE] =	PROTO_PEER_COUNTED("PEER_LEASE", sizeof(struct proto_peer_lease), 8,
				    sizeof(struct proto_peer_key)),
	[PROTO_T_PEER_RELEASE] = PROTO_PEER("PEER_RELEASE", sizeof(struct proto_peer_release)),
	[PROTO_T_PEER_OFFER] =	PROTO_PEER_COUNTED("PEER_OFFER", sizeof(struct proto_peer_offer), 8,
				    sizeof(struct proto_peer_obj)),
	[PROTO_T_ERROR] =	{ "ERROR", 0, PROTO_LEN_FIXED, 0, 0, 0 },
};

const char *
proto_type_name(unsigned t)
{
	if (t >= PROTO_TYPES_MAX || proto_types[t].name == NULL)
		return "UNKNOWN";
	return proto_types[t].name;
}

/* Types a client may send and that this version of the daemon serves. */
int
proto_type_is_request(unsigned t)
{
	return t < PROTO_TYPES_MAX && (proto_types[t].flags & PROTO_TYPE_REQUEST);
}

/*
 * The types a channel's dispatcher serves: the engines' requests on the
 * engine socket, the peer types (requests and replies) on the peer
 * channel. Each dispatcher checks its table against its own channel's.
 */
int
proto_type_served(unsigned t, unsigned chan)
{
	if (t >= PROTO_TYPES_MAX)
		return 0;
	switch (chan) {
	case PROTO_CHAN_ENGINE:
		return (proto_types[t].flags & PROTO_TYPE_REQUEST) != 0;
	case PROTO_CHAN_PEER:
		return (proto_types[t].flags & PROTO_TYPE_PEER) != 0;
	}
	return 0;
}

/* Requests whose first byte may bring fds (ATTACH's memory registrations). */
int
proto_type_takes_fds(unsigned t)
{
	return t < PROTO_TYPES_MAX && (proto_types[t].flags & PROTO_TYPE_FDS);
}

void
proto_hdr_init(struct proto_hdr *h, unsigned type, uint32_t length, uint64_t seq)
{
	memset(h, 0, sizeof(*h));
	h->magic = PROTO_MAGIC;
	h->version = PROTO_VERSION;
	h->type = (uint16_t)type;
	h->length = length;
	h->seq = seq;
}

/*
 * Checks a request header before anything is allocated for its payload.
 * The order matters: magic first (is this l3kv at all), then version,
 * then the length bound, so that a garbage stream is never allocated for.
 */
int
proto_hdr_check(const struct proto_hdr *h, uint32_t max_frame)
{
	return proto_hdr_check_chan(h, max_frame, PROTO_CHAN_ENGINE);
}

/*
 * The same for a channel. On the peer channel both ends send requests
 * and replies: a reply (PROTO_F_REPLY, any status) of a peer type passes,
 * and its payload is the handler's to check; fds never come there.
 */
int
proto_hdr_check_chan(const struct proto_hdr *h, uint32_t max_frame, unsigned chan)
{
	uint16_t	known = chan == PROTO_CHAN_PEER ? PROTO_F_REPLY : PROTO_F_KNOWN;

	if (h->magic != PROTO_MAGIC)
		return PROTO_S_BAD_MAGIC;
	if (h->version != PROTO_VERSION)
		return PROTO_S_BAD_VERSION;
	if (h->length > max_frame)
		return PROTO_S_TOO_BIG;
	if (h->flags & ~known || (chan != PROTO_CHAN_PEER && (h->flags & PROTO_F_REPLY)))
		return PROTO_S_BAD_FLAGS;
	if (h->status != 0 && !(h->flags & PROTO_F_REPLY))
		return PROTO_S_BAD_FLAGS;
	if (!proto_type_served(h->type, chan))
		return PROTO_S_BAD_TYPE;
	return PROTO_S_OK;
}

/* A fixed string field holds a NUL and only printable ASCII before it. */
int
proto_string_ok(const char *s, size_t cap, int allow_empty)
{
	size_t	i;

	for (i = 0; i < cap; i++) {
		if (s[i] == '\0')
			break;
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
			return 0;
	}
	if (i == cap)
		return 0;
	return allow_empty || i > 0;
}

uint32_t
proto_attach_length(uint8_t npools, uint16_t nregions, uint32_t nlive)
{
	uint64_t	n;

	n = sizeof(struct proto_attach) + (uint64_t)npools * sizeof(struct proto_pool) +
	    (uint64_t)nregions * sizeof(struct proto_region) + (uint64_t)nlive * 4;
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static int	proto_payload_rule(unsigned, uint32_t, const void *);

/* Fixed part plus count * elem bytes, where count is a uint32 at offset 0 or 8. */
static int
proto_counted(uint32_t length, const void *payload, size_t fixed, size_t count_at, size_t elem)
{
	uint32_t	n;

	if (length < fixed)
		return PROTO_S_BAD_LENGTH;
	memcpy(&n, (const uint8_t *)payload + count_at, sizeof(n));
	if (n > PROTO_PAGES_MAX || (uint64_t)length != fixed + (uint64_t)n * elem)
		return PROTO_S_BAD_LENGTH;
	return 0;
}

/* Checks a payload's length against its type; fields are checked later. */
int
proto_payload_check(unsigned type, uint32_t length, const void *payload)
{
	if (!proto_type_is_request(type))
		return PROTO_S_BAD_TYPE;
	return proto_payload_rule(type, length, payload);
}

/* The same for a frame of a channel; a peer reply's payload is its handler's to check. */
int
proto_payload_check_chan(const struct proto_hdr *h, const void *payload, unsigned chan)
{
	if (!proto_type_served(h->type, chan))
		return PROTO_S_BAD_TYPE;
	if (h->flags & PROTO_F_REPLY)
		return 0;
	return proto_payload_rule(h->type, h->length, payload);
}

static int
proto_payload_rule(unsigned type, uint32_t length, const void *payload)
{
	const struct proto_type_info	*ti;
	struct proto_attach		 a;

	ti = &proto_types[type];
	switch (ti->rule) {
	case PROTO_LEN_FIXED:
		return length == ti->fixed ? 0 : PROTO_S_BAD_LENGTH;
	case PROTO_LEN_COUNTED:
		return proto_counted(length, payload, ti->fixed, ti->count_at, ti->elem);
	case PROTO_LEN_ATTACH:
		if (length < sizeof(a))
			return PROTO_S_BAD_LENGTH;
		memcpy(&a, payload, sizeof(a));
		if (length != proto_attach_length(a.layout.npools, a.nregions, a.nlive))
			return PROTO_S_BAD_LENGTH;
		return 0;
	}
	return PROTO_S_BAD_TYPE;
}

/* Picks the connection's version from a HELLO; fails if none overlaps. */
int
proto_hello_check(const struct proto_hello *h, uint16_t *version)
{
	if (h->flags != 0)
		return PROTO_S_INVALID;
	if (!proto_string_ok(h->client, sizeof(h->client), 1))
		return PROTO_S_INVALID;
	if (h->version_min > h->version_max)
		return PROTO_S_BAD_VERSION;
	if (h->version_max < PROTO_VERSION_MIN || h->version_min > PROTO_VERSION_MAX)
		return PROTO_S_BAD_VERSION;
	*version = h->version_max < PROTO_VERSION_MAX ? h->version_max : PROTO_VERSION_MAX;
	return PROTO_S_OK;
}

/* LIST's fields, once its length passed: a known `what`, no flags. */
int
proto_list_check(const struct proto_list *l)
{
	if (proto_list_name(l->what) == NULL || l->flags != 0)
		return PROTO_S_INVALID;
	return PROTO_S_OK;
}

/* "namespaces", "groups", "leases": LIST's reply member; NULL for an unknown what. */
const char *
proto_list_name(unsigned what)
{
	switch (what) {
	case PROTO_LIST_NAMESPACES:	return "namespaces";
	case PROTO_LIST_GROUPS:		return "groups";
	case PROTO_LIST_LEASES:		return "leases";
	}
	return NULL;
}

/*
 * A PEER_HELLO's fields (request or reply): 0 or PROTO_S_INVALID /
 * PROTO_S_BAD_VERSION. Whether the id is a member, the role this one's, is
 * the daemon's to say.
 */
int
proto_peer_hello_check(const struct proto_peer_hello *h)
{
	unsigned	i;
	uint64_t	end;

	if (h->version_min > h->version_max || h->version_max < PROTO_VERSION_MIN ||
	    h->version_min > PROTO_VERSION_MAX)
		return PROTO_S_BAD_VERSION;
	if (h->flags != 0 || h->incarnation == 0 || h->pad != 0 ||
	    !proto_string_ok(h->id, sizeof(h->id), 0) ||
	    !proto_string_ok(h->role, sizeof(h->role), 0) ||
	    !proto_string_ok(h->provider, sizeof(h->provider), 1) ||
	    h->fabric_len > sizeof(h->fabric) || h->nmr > PROTO_PEER_KEYS_MAX)
		return PROTO_S_INVALID;
	for (i = 0; i < h->nmr; i++)
		if (h->mr[i].len == 0 || __builtin_add_overflow(h->mr[i].raddr, h->mr[i].len, &end))
			return PROTO_S_INVALID;
	return PROTO_S_OK;
}

/*
 * The endpoint names a PEER_HELLO carries, one per lane of the sender:
 * slots of fabric_len bytes in fabric, lane 0's first, up to the first
 * slot of zeros or the field's end. A sender from before lanes zeroes
 * what follows its one name: one lane. 0 without a name.
 */
unsigned
proto_peer_hello_lanes(const struct proto_peer_hello *h)
{
	static const uint8_t	zeros[PROTO_PEER_ADDR_MAX];
	unsigned		n;

	if (h->fabric_len == 0 || h->fabric_len > sizeof(h->fabric))
		return 0;
	for (n = 1; (n + 1) * (size_t)h->fabric_len <= sizeof(h->fabric); n++)
		if (memcmp(h->fabric + n * (size_t)h->fabric_len, zeros, h->fabric_len) == 0)
			break;
	return n;
}

/*
 * One object of a PEER_LEASE answer or a PEER_OFFER: 0 or
 * PROTO_S_INVALID. A present object has a length of 1 byte to 1 GiB
 * and a span that does not wrap; an absent one is zeros.
 */
int
proto_peer_obj_check(const struct proto_peer_obj *o)
{
	uint64_t	end;

	if (o->key.pad != 0 || o->pad[0] != 0 || o->pad[1] != 0 || o->pad[2] != 0)
		return PROTO_S_INVALID;
	if (o->present == 0)
		return o->len == 0 && o->checksum == 0 && o->raddr == 0 && o->rkey == 0 ?
		    PROTO_S_OK : PROTO_S_INVALID;
	if (o->present != 1 || o->len == 0 || o->len > (1ULL << 30) ||
	    __builtin_add_overflow(o->raddr, o->len, &end))
		return PROTO_S_INVALID;
	return PROTO_S_OK;
}

/*
 * A PEER_LEASE answer for lease `lease` of nkeys keys: its length, header
 * and every object. 0 or PROTO_S_BAD_LENGTH / PROTO_S_INVALID; the keys'
 * echo is the asker's to compare.
 */
int
proto_peer_lease_reply_check(const void *payload, uint32_t len, uint64_t lease, uint32_t nkeys)
{
	struct proto_peer_lease	lh;
	struct proto_peer_obj	o;
	uint32_t		i;

	if (nkeys > PROTO_PEER_OBJS_MAX ||
	    (uint64_t)len != sizeof(lh) + (uint64_t)nkeys * sizeof(o))
		return PROTO_S_BAD_LENGTH;
	memcpy(&lh, payload, sizeof(lh));
	if (lh.lease != lease || lh.nkeys != nkeys)
		return PROTO_S_INVALID;
	for (i = 0; i < nkeys; i++) {
		memcpy(&o, (const uint8_t *)payload + sizeof(lh) + (size_t)i * sizeof(o), sizeof(o));
		if (proto_peer_obj_check(&o) != PROTO_S_OK)
			return PROTO_S_INVALID;
	}
	return PROTO_S_OK;
}

#define ATTACH_ERR(...) do {						\
	if (err != NULL)						\
		snprintf(err, errlen, __VA_ARGS__);			\
	return PROTO_S_INVALID;						\
} while (0)

static int
proto_layout_check(const struct proto_layout *l, char *err, size_t errlen)
{
	if (!proto_string_ok(l->model, sizeof(l->model), 0))
		ATTACH_ERR("layout.model: empty, unterminated or not printable");
	if (!proto_string_ok(l->kv_dtype, sizeof(l->kv_dtype), 0))
		ATTACH_ERR("layout.kv_dtype: empty, unterminated or not printable");
	if (!proto_string_ok(l->hash_scheme, sizeof(l->hash_scheme), 0))
		ATTACH_ERR("layout.hash_scheme: empty, unterminated or not printable");
	if (l->tp_size == 0 || l->tp_size > PROTO_RANK_MAX)
		ATTACH_ERR("layout.tp_size: %u is out of range [1, %u]", l->tp_size,
		    (unsigned)PROTO_RANK_MAX);
	if (l->dcp_size == 0 || l->dcp_size > PROTO_RANK_MAX)
		ATTACH_ERR("layout.dcp_size: %u is out of range [1, %u]", l->dcp_size,
		    (unsigned)PROTO_RANK_MAX);
	if (l->pp_size == 0 || l->pp_size > PROTO_RANK_MAX)
		ATTACH_ERR("layout.pp_size: %u is out of range [1, %u]", l->pp_size,
		    (unsigned)PROTO_RANK_MAX);
	if (l->cp_size == 0 || l->cp_size > PROTO_RANK_MAX)
		ATTACH_ERR("layout.cp_size: %u is out of range [1, %u]", l->cp_size,
		    (unsigned)PROTO_RANK_MAX);
	if (l->dcp_rank >= l->dcp_size)
		ATTACH_ERR("layout.dcp_rank: %u is not below dcp_size %u", l->dcp_rank, l->dcp_size);
	if (l->pp_rank >= l->pp_size)
		ATTACH_ERR("layout.pp_rank: %u is not below pp_size %u", l->pp_rank, l->pp_size);
	if (l->host_layout < PROTO_LAYOUT_PAGE_FIRST || l->host_layout > PROTO_LAYOUT_PAGE_FIRST_DIRECT)
		ATTACH_ERR("layout.host_layout: %u is not a host layout", l->host_layout);
	if (l->attention < PROTO_ATTN_MLA || l->attention > PROTO_ATTN_GQA)
		ATTACH_ERR("layout.attention: %u is not an attention kind", l->attention);
	if (l->hash_len == 0 || l->hash_len > PROTO_HASH_LEN)
		ATTACH_ERR("layout.hash_len: %u is out of range [1, %u]", l->hash_len,
		    (unsigned)PROTO_HASH_LEN);
	if (l->npools == 0 || l->npools > PROTO_POOLS_MAX)
		ATTACH_ERR("layout.npools: %u is out of range [1, %u]", l->npools,
		    (unsigned)PROTO_POOLS_MAX);
	if (l->page_tokens == 0 || l->page_tokens > 65536)
		ATTACH_ERR("layout.page_tokens: %u is out of range [1, 65536]", l->page_tokens);
	if (l->logical_page_tokens == 0 || l->logical_page_tokens % l->page_tokens != 0)
		ATTACH_ERR("layout.logical_page_tokens: %u is not a multiple of page_tokens %u",
		    l->logical_page_tokens, l->page_tokens);
	return 0;
}

static int
proto_pool_check(const struct proto_pool *p, unsigned i, const struct proto_pool *pools,
    char *err, size_t errlen)
{
	unsigned	j;

	if (!proto_string_ok(p->name, sizeof(p->name), 0))
		ATTACH_ERR("pools[%u].name: empty, unterminated or not printable", i);
	for (j = 0; j < i; j++)
		if (strcmp(pools[j].name, p->name) == 0)
			ATTACH_ERR("pools[%u].name: \"%s\" declared twice", i, p->name);
	if (p->kind < PROTO_POOL_KV || p->kind > PROTO_POOL_SIDECAR)
		ATTACH_ERR("pools[%u].kind: %u is not a pool kind", i, p->kind);
	if (p->hit_policy < PROTO_HIT_ALL_PAGES || p->hit_policy > PROTO_HIT_TRAILING)
		ATTACH_ERR("pools[%u].hit_policy: %u is not a hit policy", i, p->hit_policy);
	if (p->hit_policy == PROTO_HIT_TRAILING && p->trailing == 0)
		ATTACH_ERR("pools[%u].trailing: trailing_pages needs n >= 1", i);
	if (p->object_bytes == 0 || p->object_bytes > (1ULL << 30))
		ATTACH_ERR("pools[%u].object_bytes: %llu is out of range [1, 1 GiB]", i,
		    (unsigned long long)p->object_bytes);
	if (!proto_string_ok(p->schema, sizeof(p->schema), 1))
		ATTACH_ERR("pools[%u].schema: unterminated or not printable", i);
	return 0;
}

/* a*b+c with overflow detection; returns 0 on overflow. */
static int
proto_muladd(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
	uint64_t	m;

	if (__builtin_mul_overflow(a, b, &m) || __builtin_add_overflow(m, c, out))
		return 0;
	return 1;
}

/*
 * The extent of a region's described bytes: the highest byte any page,
 * layer and token can reach, plus one. 0 on overflow.
 */
uint64_t
proto_region_extent(const struct proto_region *r)
{
	uint64_t	end = r->token_bytes;

	if (!proto_muladd(r->num_pages - 1ULL, r->page_stride, end, &end) ||
	    !proto_muladd(r->layers - 1ULL, r->layer_stride, end, &end) ||
	    !proto_muladd(r->page_tokens - 1ULL, r->token_stride, end, &end))
		return 0;
	return end;
}

/*
 * Whether two distinct (page, layer, token) indices of a region can reach
 * a common byte. Dimensions of one index are dropped (their stride is
 * never used); the others, innermost (smallest stride) first, must each
 * step at least over everything inside them: token_bytes, then the whole
 * extent of the smaller dimensions. That nesting is what every real host
 * and device layout is, and it is what proves the cells disjoint; a
 * geometry outside it (a stride of 0, a slot stride under a slot, two
 * dimensions interleaved) is refused, since a restore into one index would
 * write another one's bytes: canonical slot 1 over live slot 0. Returns
 * the offending dimension, or -1 when the cells are disjoint; call it only
 * on a region whose extent did not overflow.
 */
int
proto_region_alias(const struct proto_region *r, uint64_t *stride, uint64_t *span)
{
	uint64_t	count[3] = { r->num_pages, r->layers, r->page_tokens };
	uint64_t	step[3] = { r->page_stride, r->layer_stride, r->token_stride };
	uint64_t	extent = r->token_bytes;
	int		order[3] = { 0, 1, 2 }, i, j, t;

	for (i = 1; i < 3; i++)		/* three elements: insertion sort by stride */
		for (j = i; j > 0 && step[order[j]] < step[order[j - 1]]; j--) {
			t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	for (i = 0; i < 3; i++) {
		int	d = order[i];

		if (count[d] <= 1)
			continue;
		if (step[d] < extent) {
			*stride = step[d];
			*span = extent;
			return d;
		}
		extent += (count[d] - 1) * step[d];	/* <= the region's extent: no overflow */
	}
	return -1;
}

static int
proto_region_check(const struct proto_region *r, unsigned i, uint8_t npools,
    char *err, size_t errlen)
{
	static const char	*dim[3] = { "page", "layer", "token" };
	uint64_t		 stride, span;
	int			 d;

	uint64_t	extent, end;

	static const uint8_t	zero[offsetof(struct proto_region, handle)];

	if (r->kind < PROTO_MEM_MEMFD || r->kind > PROTO_MEM_CUDA_EVENT)
		ATTACH_ERR("regions[%u].kind: %u is not a memory kind", i, r->kind);
	if (r->kind == PROTO_MEM_CUDA_EVENT) {
		/* An event is not memory: everything but its kind and handle is 0. */
		struct proto_region	c = *r;

		c.kind = 0;
		if (memcmp(&c, zero, sizeof(zero)) != 0)
			ATTACH_ERR("regions[%u]: an event registration has only a kind and a "
			    "handle; every other field must be 0", i);
		return 0;
	}
	if (r->pool >= npools)
		ATTACH_ERR("regions[%u].pool: %u is not a declared pool", i, r->pool);
	if (r->kind == PROTO_MEM_MEMFD && r->device != 0)
		ATTACH_ERR("regions[%u].device: %u, but only GPU memory is on a device", i,
		    r->device);
	if (r->layout < PROTO_LAYOUT_PAGE_FIRST || r->layout > PROTO_LAYOUT_SLOTS)
		ATTACH_ERR("regions[%u].layout: %u is not a layout", i, r->layout);
	if (r->fd_index >= PROTO_FDS_MAX)
		ATTACH_ERR("regions[%u].fd_index: %u is out of range [0, %u)", i, r->fd_index,
		    (unsigned)PROTO_FDS_MAX);
	if (r->num_pages == 0 || r->layers == 0 || r->page_tokens == 0 || r->token_bytes == 0)
		ATTACH_ERR("regions[%u]: num_pages, layers, page_tokens and token_bytes must be >= 1", i);
	if (r->layout == PROTO_LAYOUT_SLOTS && (r->layers != 1 || r->page_tokens != 1))
		ATTACH_ERR("regions[%u]: a slot region has one layer and one token per slot", i);
	extent = proto_region_extent(r);
	if (extent == 0 || extent > r->size)
		ATTACH_ERR("regions[%u]: geometry reaches past size %llu", i,
		    (unsigned long long)r->size);
	if (__builtin_add_overflow(r->offset, r->size, &end))
		ATTACH_ERR("regions[%u]: offset + size overflows", i);
	if ((d = proto_region_alias(r, &stride, &span)) >= 0) {
		const char	*what = r->layout == PROTO_LAYOUT_SLOTS ? "slot" : dim[d];

		ATTACH_ERR("regions[%u]: %s_stride %llu is under the %llu bytes one %s spans, so two "
		    "%ss would overlap", i, dim[d], (unsigned long long)stride,
		    (unsigned long long)span, what, what);
	}
	return 0;
}

/*
 * Decodes and validates an ATTACH payload whose length already passed
 * proto_payload_check(). Memory-level checks (fd sizes) are the daemon's.
 */
int
proto_attach_decode(const void *payload, uint32_t length, struct proto_attach_view *v,
    char *err, size_t errlen)
{
	const uint8_t	*p = payload;
	unsigned	 i;
	int		 s;

	if (length < sizeof(v->fixed))
		return PROTO_S_BAD_LENGTH;
	memcpy(&v->fixed, p, sizeof(v->fixed));
	if (length != proto_attach_length(v->fixed.layout.npools, v->fixed.nregions, v->fixed.nlive))
		return PROTO_S_BAD_LENGTH;
	if ((s = proto_layout_check(&v->fixed.layout, err, errlen)) != 0)
		return s;
	if (v->fixed.nregions > PROTO_REGIONS_MAX)
		ATTACH_ERR("nregions: %u is out of range [0, %u]", v->fixed.nregions,
		    (unsigned)PROTO_REGIONS_MAX);
	if (v->fixed.nlive > PROTO_LIVE_MAX)
		ATTACH_ERR("nlive: %u is out of range [0, %u]", v->fixed.nlive,
		    (unsigned)PROTO_LIVE_MAX);
	if (!proto_string_ok(v->fixed.group, sizeof(v->fixed.group), 0))
		ATTACH_ERR("group: empty, unterminated or not printable");
	if (v->fixed.group_size == 0 || v->fixed.group_size > PROTO_GROUP_SIZE_MAX)
		ATTACH_ERR("group_size: %u is out of range [1, %u]", v->fixed.group_size,
		    (unsigned)PROTO_GROUP_SIZE_MAX);
	if (v->fixed.group_rank >= v->fixed.group_size)
		ATTACH_ERR("group_rank: %u is not below group_size %u", v->fixed.group_rank,
		    v->fixed.group_size);
	if (v->fixed.tp_rank >= v->fixed.layout.tp_size)
		ATTACH_ERR("tp_rank: %u is not below tp_size %u", v->fixed.tp_rank,
		    v->fixed.layout.tp_size);
	if (v->fixed.prefetch < PROTO_PREFETCH_WAIT_COMPLETE ||
	    v->fixed.prefetch > PROTO_PREFETCH_TIMEOUT)
		ATTACH_ERR("prefetch: %u is not a prefetch policy", v->fixed.prefetch);
	if (v->fixed.write < PROTO_WRITE_THROUGH || v->fixed.write > PROTO_WRITE_OFFLOAD)
		ATTACH_ERR("write: %u is not a write policy", v->fixed.write);
	if (v->fixed.prefetch == PROTO_PREFETCH_TIMEOUT && v->fixed.prefetch_timeout_ms == 0)
		ATTACH_ERR("prefetch_timeout_ms: the timeout policy needs a timeout");
	p += sizeof(v->fixed);
	for (i = 0; i < v->fixed.layout.npools; i++, p += sizeof(struct proto_pool)) {
		memcpy(&v->pools[i], p, sizeof(struct proto_pool));
		if ((s = proto_pool_check(&v->pools[i], i, v->pools, err, errlen)) != 0)
			return s;
	}
	for (i = 0; i < v->fixed.nregions; i++, p += sizeof(struct proto_region)) {
		memcpy(&v->regions[i], p, sizeof(struct proto_region));
		s = proto_region_check(&v->regions[i], i, v->fixed.layout.npools, err, errlen);
		if (s != 0)
			return s;
	}
	v->live = p;
	return PROTO_S_OK;
}

uint32_t
proto_attach_live(const struct proto_attach_view *v, uint32_t i)
{
	uint32_t	x;

	memcpy(&x, v->live + (size_t)i * 4, 4);
	return x;
}

/*
 * Copies at most max bytes of s, up to a NUL, with anything but printable
 * ASCII (and '"') replaced: the fields dumped are the client's, not yet
 * validated, and must not be able to break or forge a log line.
 */
static const char *
proto_dump_str(char *dst, const char *s, size_t max)
{
	size_t	i;

	for (i = 0; i < max && s[i] != '\0'; i++)
		dst[i] = (unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e || s[i] == '"' ?
		    '?' : s[i];
	dst[i] = '\0';
	return dst;
}

/* One line describing a frame, for debug logs; returns snprintf's count. */
size_t
proto_dump(const struct proto_hdr *h, const void *payload, char *buf, size_t len)
{
	struct proto_hello		 hello;
	struct proto_attach		 a;
	struct proto_peer_hello		 ph;
	struct proto_list		 l;
	const char			*what;
	char				 s1[PROTO_MODEL_LEN + 1], s2[PROTO_ERRMSG_MAX + 1];
	char				 s3[PROTO_PEER_PROV_LEN + 1];
	int				 n;

	/* snprintf(NULL, 0, ...) is defined: it only counts. */
	/* cppcheck-suppress ctunullpointer */
	n = snprintf(buf, len, "%s%s seq=%llu len=%u flags=0x%x status=%s",
	    proto_type_name(h->type), h->flags & PROTO_F_REPLY ? " reply" : "",
	    (unsigned long long)h->seq, h->length, h->flags, proto_status_name(h->status));
	if (n < 0 || (size_t)n >= len || payload == NULL)
		return n < 0 ? 0 : (size_t)n;
	if (h->status != PROTO_S_OK && h->flags & PROTO_F_REPLY) {
		n += snprintf(buf + n, len - n, " msg=\"%s\"", proto_dump_str(s2, payload,
		    h->length < PROTO_ERRMSG_MAX ? h->length : PROTO_ERRMSG_MAX));
	} else if (h->type == PROTO_T_HELLO && !(h->flags & PROTO_F_REPLY) &&
	    h->length == sizeof(hello)) {
		/* Copied: the payload need not be aligned for the struct. */
		memcpy(&hello, payload, sizeof(hello));
		n += snprintf(buf + n, len - n, " versions=%u..%u client=\"%s\"",
		    hello.version_min, hello.version_max,
		    proto_dump_str(s1, hello.client, sizeof(hello.client)));
	} else if (h->type == PROTO_T_LIST && !(h->flags & PROTO_F_REPLY) &&
	    h->length == sizeof(l)) {
		memcpy(&l, payload, sizeof(l));
		what = proto_list_name(l.what);
		n += snprintf(buf + n, len - n, " what=%s(%u) max=%u flags=0x%x",
		    what != NULL ? what : "?", l.what, l.max, l.flags);
	} else if (h->type == PROTO_T_PEER_HELLO && h->length == sizeof(ph)) {
		memcpy(&ph, payload, sizeof(ph));
		n += snprintf(buf + n, len - n, " id=\"%s\" role=\"%s\" incarnation=%016llx "
		    "provider=\"%s\" chunks=%u",
		    proto_dump_str(s1, ph.id, sizeof(ph.id)),
		    proto_dump_str(s2, ph.role, sizeof(ph.role)), (unsigned long long)ph.incarnation,
		    proto_dump_str(s3, ph.provider, sizeof(ph.provider)), ph.nmr);
	} else if (h->type == PROTO_T_ATTACH && !(h->flags & PROTO_F_REPLY) &&
	    h->length >= sizeof(a)) {
		memcpy(&a, payload, sizeof(a));
		n += snprintf(buf + n, len - n,
		    " model=\"%s\" group=\"%s\" rank=%u/%u tp=%u dcp=%u/%u pools=%u regions=%u live=%u",
		    proto_dump_str(s1, a.layout.model, sizeof(a.layout.model)),
		    proto_dump_str(s2, a.group, sizeof(a.group)),
		    a.group_rank, a.group_size, a.layout.tp_size, a.layout.dcp_rank,
		    a.layout.dcp_size, a.layout.npools, a.nregions, a.nlive);
	}
	return n < 0 ? 0 : (size_t)n;
}
