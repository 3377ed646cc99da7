/*
 * libFuzzer harness for the protocol's parsers. The input is one frame
 * as a client could send it: a header (zero-padded when short), then
 * payload bytes. It goes through what l3kvd runs on every frame, in the
 * same order (header check against a max frame, payload length, HELLO or
 * ATTACH validation, the cache operations' counted arrays, LIST's
 * fields), then
 * proto_dump() into a small and a large buffer,
 * with the payload at an odd address too. ATTACH decoding also runs on
 * whatever follows the header, so that the fuzzer need not keep the
 * header's length in step to reach the field checks.
 *
 * Crashes, sanitizer reports and the invariants below are findings; an
 * accepted region's geometry is checked cell by cell (no two indices
 * alias, none reaches past its size).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int	LLVMFuzzerTestOneInput(const uint8_t *, size_t);

/* A dump must be one NUL-terminated line within its buffer. */
static void
fuzz_check_dump(const char *buf, size_t len, size_t n)
{
	size_t	l = strnlen(buf, len);

	if (l == len || strchr(buf, '\n') != NULL || strchr(buf, '\r') != NULL)
		__builtin_trap();
	if (n < len && l != n)
		__builtin_trap();
}

static void
fuzz_dump(const struct proto_hdr *h, const void *payload)
{
	char	small[64], big[512];

	fuzz_check_dump(small, sizeof(small), proto_dump(h, payload, small, sizeof(small)));
	fuzz_check_dump(big, sizeof(big), proto_dump(h, payload, big, sizeof(big)));
}

static int
fuzz_cmp_u64(const void *a, const void *b)
{
	uint64_t	x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * An accepted memory region's cells are disjoint and inside its size:
 * checked by brute force where the region has few enough cells.
 */
static void
fuzz_region_geometry(const struct proto_region *r)
{
	static uint64_t	cell[4096];
	uint64_t	n = (uint64_t)r->num_pages * r->layers * r->page_tokens, i = 0;
	uint32_t	p, l, t;

	if (r->kind == PROTO_MEM_CUDA_EVENT || n > 4096)
		return;
	for (p = 0; p < r->num_pages; p++)
		for (l = 0; l < r->layers; l++)
			for (t = 0; t < r->page_tokens; t++)
				cell[i++] = p * r->page_stride + l * r->layer_stride +
				    t * r->token_stride;
	qsort(cell, n, sizeof(cell[0]), fuzz_cmp_u64);
	for (i = 0; i < n; i++) {
		if (cell[i] + r->token_bytes > r->size)
			__builtin_trap();
		if (i > 0 && cell[i] - cell[i - 1] < r->token_bytes)
			__builtin_trap();	/* two indices alias */
	}
}

static void
fuzz_attach(const uint8_t *payload, uint32_t len)
{
	static struct proto_attach_view	v;
	char				err[256];
	uint32_t			i, sum = 0;

	err[0] = '\0';
	if (proto_attach_decode(payload, len, &v, err, sizeof(err)) != PROTO_S_OK) {
		if (strnlen(err, sizeof(err)) == sizeof(err))
			__builtin_trap();
		return;
	}
	if (v.fixed.layout.npools == 0 || v.fixed.layout.npools > PROTO_POOLS_MAX ||
	    v.fixed.nregions > PROTO_REGIONS_MAX || v.fixed.nlive > PROTO_LIVE_MAX)
		__builtin_trap();
	for (i = 0; i < v.fixed.nregions; i++)
		if (v.regions[i].pool >= v.fixed.layout.npools ||
		    v.regions[i].fd_index >= PROTO_FDS_MAX)
			__builtin_trap();
	for (i = 0; i < v.fixed.nregions; i++)
		fuzz_region_geometry(&v.regions[i]);
	/* Every live index must be readable inside the payload. */
	for (i = 0; i < v.fixed.nlive; i++)
		sum += proto_attach_live(&v, i);
	(void)sum;
}

/* LIST whose length passed: 8 bytes; accepted only with a named what and no flags. */
static void
fuzz_list(const uint8_t *payload, uint32_t len)
{
	struct proto_list	l;

	if (len != sizeof(l))
		__builtin_trap();
	memcpy(&l, payload, sizeof(l));
	if ((proto_list_check(&l) == PROTO_S_OK) !=
	    (proto_list_name(l.what) != NULL && l.flags == 0))
		__builtin_trap();
}

/*
 * A cache operation whose length passed: its count is within
 * PROTO_PAGES_MAX and its array ends exactly at the payload's end (the
 * last element is read, for ASan to check).
 */
static void
fuzz_cache(unsigned type, const uint8_t *payload, uint32_t len)
{
	size_t		fixed, count_at, elem;
	uint32_t	n;
	uint8_t		last;

	count_at = 0;
	switch (type) {
	case PROTO_T_PROBE:
		fixed = sizeof(struct proto_probe);
		elem = PROTO_HASH_LEN;
		break;
	case PROTO_T_ADMIT:
		fixed = sizeof(struct proto_admit);
		count_at = offsetof(struct proto_admit, npages);
		elem = PROTO_HASH_LEN;
		break;
	case PROTO_T_RESTORE:
		fixed = sizeof(struct proto_restore);
		count_at = offsetof(struct proto_restore, npages);
		elem = sizeof(uint32_t);
		break;
	case PROTO_T_PUBLISH:
		fixed = sizeof(struct proto_publish);
		elem = sizeof(struct proto_publish_page);
		break;
	case PROTO_T_CANCEL:
	case PROTO_T_RELEASE:
		if (len != sizeof(struct proto_lease_op))
			__builtin_trap();
		return;
	case PROTO_T_DEBUG:
		if (len != sizeof(struct proto_debug))
			__builtin_trap();
		return;
	case PROTO_T_RELOAD:
		if (len != 0)
			__builtin_trap();
		return;
	case PROTO_T_LIST:
		fuzz_list(payload, len);
		return;
	default:
		return;
	}
	if (len < fixed)
		__builtin_trap();
	memcpy(&n, payload + count_at, sizeof(n));
	if (n > PROTO_PAGES_MAX || len != fixed + (size_t)n * elem)
		__builtin_trap();
	if (n > 0) {
		memcpy(&last, payload + len - 1, 1);
		(void)last;
	}
}

/*
 * The peer channel: the same header as the engines' but its own types,
 * replies both ways; a request that passes has the length of its rule,
 * and HELLO and lease answers go through the checks the daemon runs.
 */
static void
fuzz_peer(const struct proto_hdr *h, const uint8_t *payload, size_t avail)
{
	struct proto_peer_hello	hello;
	struct proto_peer_obj	o;
	uint32_t		n, i;
	int			st;

	st = proto_hdr_check_chan(h, PROTO_FRAME_MIN, PROTO_CHAN_PEER);
	if (st == PROTO_S_OK && proto_type_is_request(h->type))
		__builtin_trap();	/* an engine type on the peer channel */
	if (st != PROTO_S_OK || h->length > avail)
		return;
	st = proto_payload_check_chan(h, payload, PROTO_CHAN_PEER);
	if (st == PROTO_S_OK && !(h->flags & PROTO_F_REPLY) && h->type == PROTO_T_PEER_OFFER) {
		memcpy(&n, payload + 8, sizeof(n));
		if ((uint64_t)h->length != 16 + (uint64_t)n * sizeof(o))
			__builtin_trap();
		for (i = 0; i < n; i++) {
			memcpy(&o, payload + 16 + (size_t)i * sizeof(o), sizeof(o));
			if (proto_peer_obj_check(&o) == PROTO_S_OK && o.present == 1 &&
			    (o.len == 0 || o.raddr + o.len < o.raddr))
				__builtin_trap();
		}
	}
	if (h->type == PROTO_T_PEER_HELLO && h->length == sizeof(hello)) {
		memcpy(&hello, payload, sizeof(hello));
		if (proto_peer_hello_check(&hello) == PROTO_S_OK && (hello.nmr > PROTO_PEER_KEYS_MAX ||
		    hello.fabric_len > sizeof(hello.fabric) || hello.incarnation == 0))
			__builtin_trap();
		/* The lanes' names never run past the field. */
		if ((size_t)proto_peer_hello_lanes(&hello) * hello.fabric_len > sizeof(hello.fabric))
			__builtin_trap();
	}
	if (h->type == PROTO_T_PEER_LEASE && (h->flags & PROTO_F_REPLY) && h->length >= 16) {
		struct proto_peer_lease lh;

		memcpy(&lh, payload, sizeof(lh));
		if (proto_peer_lease_reply_check(payload, h->length, lh.lease, lh.nkeys) ==
		    PROTO_S_OK && (uint64_t)h->length != 16 + (uint64_t)lh.nkeys * sizeof(o))
			__builtin_trap();
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_hello	 hello;
	struct proto_hdr	 h;
	const uint8_t		*payload = NULL;
	uint8_t			*odd;
	size_t			 avail = 0;
	uint16_t		 version = 0;
	int			 st;

	memset(&h, 0, sizeof(h));
	memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
	if (size > sizeof(h)) {
		payload = data + sizeof(h);
		avail = size - sizeof(h);
	}

	/* The daemon's order: nothing is looked at past a bad header. */
	st = proto_hdr_check(&h, PROTO_FRAME_MIN);
	if (st == PROTO_S_OK && h.length <= avail) {
		st = proto_payload_check(h.type, h.length, payload);
		if (st == PROTO_S_OK && h.type == PROTO_T_HELLO) {
			memcpy(&hello, payload, sizeof(hello));
			if (proto_hello_check(&hello, &version) == PROTO_S_OK &&
			    (version < PROTO_VERSION_MIN || version > PROTO_VERSION_MAX))
				__builtin_trap();
		}
		if (st == PROTO_S_OK && h.type == PROTO_T_ATTACH)
			fuzz_attach(payload, h.length);
		if (st == PROTO_S_OK)
			fuzz_cache(h.type, payload, h.length);
	}
	if (avail >= sizeof(struct proto_attach) && avail <= PROTO_FRAME_MAX)
		fuzz_attach(payload, (uint32_t)avail);
	fuzz_peer(&h, payload, avail);

	/* proto_dump() trusts the header's length: give it the payload only when whole. */
	fuzz_dump(&h, NULL);
	if (h.length <= avail) {
		fuzz_dump(&h, payload);
		if ((odd = malloc((size_t)h.length + 1)) != NULL) {
			if (h.length > 0)
				memcpy(odd + 1, payload, h.length);
			fuzz_dump(&h, odd + 1);
			free(odd);
		}
	}
	return 0;
}
