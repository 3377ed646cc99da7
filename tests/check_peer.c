/*
 * The peer tier (issue 14): placement, the control channel between
 * daemons, and restores of objects another daemon published, under the
 * local tiers' contract: what ADMIT promises is restored byte for byte or
 * the restore fails `lost`; nothing is ever a false hit.
 *
 * The daemons run on loopback in this test's network namespace, each on
 * its own control port; with tests/netns.sh they run in three network
 * namespaces joined by a bridge (the netns tcases).
 */
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <netinet/in.h>

#include <arpa/inet.h>
#include <poll.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "daemon.h"
#include "l3kv.h"
#include "tests.h"

#define PT_N		3		/* daemons of the role */
#define PT_PAGES	64
#define PT_LAYERS	4
#define PT_TOKENS	8
#define PT_TB		128
#define PT_BYTES	(PT_TOKENS * PT_LAYERS * PT_TB)	/* 4096 */

static struct test_daemon	pt_d[PT_N + 1];
static int			pt_up[PT_N + 1];
static unsigned			pt_port;	/* the first control port of this run */
static const char		*pt_provider = "tcp";	/* peer.provider of the daemons */
static char			pt_ns[TEST_NETNS_PREFIX_MAX];	/* "": all on loopback here */
static struct test_etcd		pt_etcd;	/* the etcd tcase's */
static int			pt_use_etcd;	/* members from pt_etcd, no static list */
static int			pt_etcd_static;	/* with pt_use_etcd: the static list too */
static int			pt_metrics;	/* metrics.listen on 127.0.0.1, port pt_port + 4 + i */

static const struct test_rank_kv	pt_kv = { "peer-model", "latent:128:fp8_e4m3", L3KV_ATTN_MLA,
    PT_PAGES, PT_TOKENS, PT_LAYERS, PT_TB };

/* ------------------------------------------------------------------ placement */

static void
pt_key(uint32_t prefix, uint32_t i, uint16_t shard, struct obj_key *k)
{
	memset(k, 0, sizeof(*k));
	memset(k->fingerprint, 0x42, sizeof(k->fingerprint));
	k->shard = shard;
	test_page_hash(prefix, i, k->hash);
}

static void
pt_members(struct peer_member *m, unsigned n)
{
	unsigned	i;

	for (i = 0; i < n; i++) {
		snprintf(m[i].id, sizeof(m[i].id), "node-%c", 'a' + i);
		snprintf(m[i].addr, sizeof(m[i].addr), "10.0.0.%u:7400", i + 1);
	}
}

static const char *
pt_home(const struct peer_member *m, unsigned n, const struct obj_key *k)
{
	unsigned	h;

	ck_assert_uint_eq(peer_homes(m, n, k, 1, &h), 1);
	return m[h].id;
}

/* The same homes on every call and whatever the list's order; two distinct replicas. */
START_TEST(test_hrw_is_stable_and_order_free)
{
	struct peer_member	m[4], r[4];
	struct obj_key		k;
	unsigned		i, h1[2], h2[2];

	pt_members(m, 4);
	for (i = 0; i < 4; i++)
		r[i] = m[3 - i];
	for (i = 0; i < 500; i++) {
		pt_key(7, i, 0, &k);
		ck_assert_str_eq(pt_home(m, 4, &k), pt_home(m, 4, &k));
		ck_assert_str_eq(pt_home(m, 4, &k), pt_home(r, 4, &k));
		ck_assert_uint_eq(peer_homes(m, 4, &k, 2, h1), 2);
		ck_assert_uint_eq(peer_homes(r, 4, &k, 2, h2), 2);
		ck_assert_uint_ne(h1[0], h1[1]);
		ck_assert_str_eq(m[h1[0]].id, r[h2[0]].id);
		ck_assert_str_eq(m[h1[1]].id, r[h2[1]].id);
		ck_assert_str_eq(m[h1[0]].id, pt_home(m, 4, &k));
	}
	/* One member: it is every key's home; none: no home. */
	ck_assert_uint_eq(peer_homes(m, 1, &k, 2, h1), 1);
	ck_assert_uint_eq(peer_homes(m, 0, &k, 1, h1), 0);
}
END_TEST

/* 3000 keys over 3 members: each gets a fair share; shards of one page spread too. */
START_TEST(test_hrw_spreads_keys)
{
	struct peer_member	m[3];
	struct obj_key		k;
	unsigned		count[3] = { 0 }, i, h, diff = 0;

	pt_members(m, 3);
	for (i = 0; i < 3000; i++) {
		pt_key(1, i, 0, &k);
		ck_assert_uint_eq(peer_homes(m, 3, &k, 1, &h), 1);
		count[h]++;
	}
	for (i = 0; i < 3; i++)
		ck_assert_msg(count[i] > 800 && count[i] < 1200, "member %u got %u of 3000", i,
		    count[i]);
	for (i = 0; i < 300; i++) {
		struct obj_key k2;

		pt_key(2, i, 0, &k);
		pt_key(2, i, 1, &k2);
		diff += strcmp(pt_home(m, 3, &k), pt_home(m, 3, &k2)) != 0;
	}
	/* Two shards land apart about 2/3 of the time. */
	ck_assert_msg(diff > 150 && diff < 250, "shards 0 and 1 apart for %u of 300 pages", diff);
}
END_TEST

/* A member joining takes only keys for itself; one leaving moves only its own. */
START_TEST(test_hrw_remaps_minimally)
{
	struct peer_member	m[4];
	struct obj_key		k;
	unsigned		i, moved = 0, lost = 0;
	const char		*before, *after;

	pt_members(m, 4);
	for (i = 0; i < 4000; i++) {
		pt_key(3, i, 0, &k);
		before = pt_home(m, 3, &k);
		after = pt_home(m, 4, &k);
		if (strcmp(before, after) != 0) {
			ck_assert_str_eq(after, "node-d");
			moved++;
		}
		/* node-b leaves (the list without it, in the same order). */
		{
			struct peer_member	w[3] = { m[0], m[2], m[3] };

			after = pt_home(w, 3, &k);
			before = pt_home(m, 4, &k);
			if (strcmp(before, after) != 0) {
				ck_assert_str_eq(before, "node-b");
				lost++;
			}
		}
	}
	ck_assert_msg(moved > 700 && moved < 1300, "%u of 4000 keys moved to the new member", moved);
	ck_assert_msg(lost > 700 && lost < 1300, "%u of 4000 keys moved off the leaver", lost);
}
END_TEST

/* A stripe's pages share a placement key: the head's hash in place of their own. */
START_TEST(test_stripe_pages_share_a_home)
{
	struct peer_member	m[3];
	struct obj_key		k, pk, head;
	unsigned		i, homes[3] = { 0 }, h;

	pt_members(m, 3);
	pt_key(5, 0, 0, &head);
	for (i = 0; i < 16; i++) {
		pt_key(5, i, 0, &k);
		peer_place_key(&k, head.hash, &pk);
		ck_assert_mem_eq(&pk, &head, sizeof(pk));
		ck_assert_str_eq(pt_home(m, 3, &pk), pt_home(m, 3, &head));
	}
	/* Stripes of a prefix go to different homes. */
	for (i = 0; i < 64; i++) {
		pt_key(5, i * 16, 0, &head);
		ck_assert_uint_eq(peer_homes(m, 3, &head, 1, &h), 1);
		homes[h]++;
	}
	ck_assert(homes[0] > 0 && homes[1] > 0 && homes[2] > 0);
}
END_TEST

/* ------------------------------------------------------------------ daemons */

/*
 * Eight ports per run, all below Linux's ephemeral range (32768 up by
 * default): one up there may be any outgoing connection's source port,
 * and the daemon's peer.listen then fails with EADDRINUSE (it did,
 * 36152 and 36170, a daemon "exited" at the start).
 */
static void
pt_pick_port(void)
{
	pt_port = 21000 + (unsigned)(getpid() % 1400) * 8;
}

/* Daemon i's host: loopback, or node i + 1 of the netns set (10.77.0.K). */
static const char *
pt_host(unsigned i, char *buf, size_t len)
{
	if (pt_ns[0] == '\0')
		snprintf(buf, len, "127.0.0.1");
	else
		snprintf(buf, len, "10.77.0.%u", i + 1);
	return buf;
}

static unsigned
pt_port_of(unsigned i)
{
	return pt_ns[0] == '\0' ? pt_port + i : 7400;
}

/*
 * Daemon i's config: the role's n members, itself among them (or, for a
 * stranger, not); extra peer.* and testing.* members.
 */
static char *
pt_config(unsigned i, unsigned n, const char *extra_peer, const char *extra_test)
{
	char	members[1024] = "", etcd[160] = "", mlisten[96] = "", *out;
	size_t	off = 0;
	unsigned j;

	char	host[32];

	for (j = 0; j < n; j++)
		off += (size_t)snprintf(members + off, sizeof(members) - off,
		    "%s{\"id\": \"n%u\", \"addr\": \"%s:%u\"}", j > 0 ? ", " : "", j,
		    pt_host(j, host, sizeof(host)), pt_port_of(j));
	if (i >= n)
		off += (size_t)snprintf(members + off, sizeof(members) - off,
		    ", {\"id\": \"n%u\", \"addr\": \"%s:%u\"}", i, pt_host(i, host, sizeof(host)),
		    pt_port_of(i));
	/* With etcd, no static list: each daemon registers itself and learns the others. */
	if (pt_use_etcd) {
		if (!pt_etcd_static)
			members[0] = '\0';
		snprintf(etcd, sizeof(etcd), ", \"etcd\": {\"endpoint\": \"%s\", "
		    "\"prefix\": \"/l3kv/check-peer/\", \"ttl_s\": 2}", pt_etcd.endpoint);
	}
	/* The four ports after the daemons' control ports are this run's too. */
	if (pt_metrics)
		snprintf(mlisten, sizeof(mlisten), "\"metrics\": {\"listen\": \"127.0.0.1:%u\"}, ",
		    pt_port + PT_N + 1 + i);
	pt_host(i, host, sizeof(host));
	ck_assert(asprintf(&out, "{%s\"peer\": {\"id\": \"n%u\", \"listen\": \"%s:%u\", "
	    "\"fabric_addr\": \"%s\", \"provider\": \"%s\", \"members\": [%s]%s, \"ping_ms\": 100, "
	    "\"timeout_ms\": 3000%s%s}, \"testing\": {\"debug_ops\": true%s%s}}", mlisten, i, host,
	    pt_port_of(i), host, pt_provider, members, etcd, extra_peer != NULL ? ", " : "",
	    extra_peer != NULL ? extra_peer : "", extra_test != NULL ? ", " : "",
	    extra_test != NULL ? extra_test : "") > 0);
	return out;
}

static void
pt_start(unsigned i, unsigned n, const char *extra_peer, const char *extra_test)
{
	char	*cfg = pt_config(i, n, extra_peer, extra_test);
	int	 rc, home = -1;

	/* In a netns set, the daemon starts inside its node; its Unix socket is reached from here. */
	if (pt_ns[0] != '\0') {
		ck_assert_int_ge(home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC), 0);
		ck_assert_int_eq(test_netns_enter(pt_ns, i + 1), 0);
	}
	rc = test_daemon_start(&pt_d[i], cfg);
	if (home >= 0) {
		ck_assert_int_eq(setns(home, CLONE_NEWNET), 0);
		close(home);
	}
	ck_assert_msg(rc == 0, "daemon n%u: %s", i, strerror(-rc));
	pt_up[i] = 1;
	free(cfg);
}

static void
pt_stop(unsigned i)
{
	int	status;

	if (!pt_up[i])
		return;
	pt_up[i] = 0;
	kill(pt_d[i].pid, SIGCONT);	/* a test that failed may have left it stopped */
	ck_assert_int_eq(test_daemon_stop(&pt_d[i], SIGTERM, &status), 0);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "daemon %s exited 0x%x",
	    pt_d[i].dir, status);
}

static void
pt_teardown(void)
{
	unsigned	i;

	for (i = 0; i <= PT_N; i++)
		pt_stop(i);
	pt_metrics = 0;
}

/* The peers section's entry for member id in daemon i's STATS, or NULL (a new reference). */
static json_t *
pt_peer(unsigned i, const char *id)
{
	json_t	*j = test_stats(pt_d[i].sock), *a, *e, *out = NULL;
	size_t	 k;

	ck_assert_ptr_nonnull(j);
	a = json_object_get(json_object_get(j, "peers"), "peers");
	json_array_foreach(a, k, e)
		if (strcmp(json_string_value(json_object_get(e, "id")), id) == 0)
			out = json_incref(e);
	json_decref(j);
	return out;
}

static const char *
pt_state(unsigned i, unsigned of, char *buf, size_t len)
{
	char	id[16];
	json_t	*e;

	snprintf(id, sizeof(id), "n%u", of);
	if ((e = pt_peer(i, id)) == NULL)
		return "absent";
	snprintf(buf, len, "%s", json_string_value(json_object_get(e, "state")));
	json_decref(e);
	return buf;
}

static long long
pt_peer_stat(unsigned i, unsigned of, const char *key)
{
	char		id[16];
	json_t		*e;
	long long	v;

	snprintf(id, sizeof(id), "n%u", of);
	ck_assert_ptr_nonnull(e = pt_peer(i, id));
	v = json_integer_value(json_object_get(e, key));
	json_decref(e);
	return v;
}

/* Waits (15 s at most: an etcd lease expires a little late) until daemon i sees `of` in state want. */
static int
pt_wait_state(unsigned i, unsigned of, const char *want)
{
	char	buf[32];
	int	t;

	for (t = 0; t < 1500; t++) {
		if (strcmp(pt_state(i, of, buf, sizeof(buf)), want) == 0)
			return 1;
		usleep(10000);
	}
	return 0;
}

/* Daemon i's config file rewritten with a list of its first n members, and SIGHUP. */
static void
pt_reload(unsigned i, unsigned n)
{
	char	*cfg = pt_config(i, n, NULL, NULL);
	FILE	*f;

	ck_assert_ptr_nonnull(f = fopen(pt_d[i].config, "w"));
	fputs(cfg, f);
	fclose(f);
	free(cfg);
	ck_assert_int_eq(kill(pt_d[i].pid, SIGHUP), 0);
}

/* Every daemon of n sees every other up. */
static void
pt_wait_mesh(unsigned n)
{
	unsigned	i, j;

	for (i = 0; i < n; i++)
		for (j = 0; j < n; j++)
			if (i != j)
				ck_assert_msg(pt_wait_state(i, j, "up"), "n%u does not see n%u up", i,
				    j);
}

/* The role on n daemons, fully connected. */
static void
pt_role(unsigned n, const char *extra_peer, const char *extra_top)
{
	unsigned	i;

	pt_pick_port();
	for (i = 0; i < n; i++)
		pt_start(i, n, extra_peer, extra_top);
	pt_wait_mesh(n);
}

static void
pt_rank(struct test_rank *r, unsigned i)
{
	test_rank_init(r, &pt_kv, "g", 1, 0);
	test_rank_attach(r, pt_d[i].sock);
}

/* 32 KV pages of prefix published on daemon from, then admitted and restored whole on to. */
static void
pt_restores_across(unsigned from, unsigned to, uint32_t prefix)
{
	struct test_rank	pub, r;
	struct l3kv_admit_result a;
	struct l3kv_restore_result res;

	pt_rank(&pub, from);
	test_rank_publish_kv(&pub, prefix, 0, 32, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[from].sock, "dram", "pins", 0), 0);
	pt_rank(&r, to);
	a = test_rank_admit(&r, 1, prefix, 32, 32, PROTO_SLOT_NONE);
	ck_assert_uint_eq(a.admitted_pages, 32);
	ck_assert_int_eq(test_rank_restore(&r, a.lease, 0, 32, &res), 0);
	ck_assert(test_rank_page_is(&r, TEST_RANK_KV, 31, prefix, 31));
	test_rank_fini(&r);
	test_rank_fini(&pub);
}

/* The control channel comes up between three daemons, with RTTs. */
START_TEST(test_three_daemons_connect)
{
	unsigned	i, j;

	pt_role(PT_N, NULL, NULL);
	for (i = 0; i < PT_N; i++) {
		json_t *doc = test_stats(pt_d[i].sock);

		/* The data path is libfabric's tcp provider (tcp;ofi_rxm on 1.17). */
		ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(json_object_get(doc,
		    "peers"), "provider")), "tcp"));
		json_decref(doc);
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "members"), PT_N);
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "refused"), 0);
		/* Named for top -H and perf: one fabric thread, copy_workers (2) copy workers. */
		ck_assert_int_eq(test_threads_named(pt_d[i].pid, "l3kv-fabric"), 1);
		ck_assert_int_eq(test_threads_named(pt_d[i].pid, "l3kv-copy"), 2);
		for (j = 0; j < PT_N; j++) {
			if (i == j)
				continue;
			/* Pings every 100 ms: an RTT is measured within a second. */
			for (int t = 0; t < 100 && pt_peer_stat(i, j, "rtt_us") == 0; t++)
				usleep(10000);
			ck_assert_int_gt(pt_peer_stat(i, j, "rtt_us"), 0);
		}
	}
}
END_TEST

/*
 * Daemons of one role with 3, 2 and 1 lanes (peer.lanes; 1 sends the
 * HELLO of a daemon from before lanes): each reads each other over as
 * many lanes as both have, a fabric thread per lane of its own, and
 * what it restores from the others is byte-exact whichever lanes the
 * reads went over.
 */
START_TEST(test_lanes_between_daemons)
{
	static const unsigned	lanes[PT_N] = { 3, 2, 1 };
	char			extra[32];
	json_t			*doc, *lr;
	unsigned		i, j;
	long long		used;

	pt_pick_port();
	for (i = 0; i < PT_N; i++) {
		snprintf(extra, sizeof(extra), "\"lanes\": %u", lanes[i]);
		pt_start(i, PT_N, extra, NULL);
	}
	pt_wait_mesh(PT_N);
	for (i = 0; i < PT_N; i++) {
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "lanes"), lanes[i]);
		ck_assert_int_eq(test_threads_named(pt_d[i].pid, "l3kv-fabric"), (int)lanes[i]);
		for (j = 0; j < PT_N; j++)
			if (j != i)
				ck_assert_int_eq(pt_peer_stat(i, j, "lanes"),
				    lanes[i] < lanes[j] ? lanes[i] : lanes[j]);
	}
	for (i = 0; i < PT_N; i++)
		for (j = 0; j < PT_N; j++)
			if (j != i)
				pt_restores_across(i, j, 300 + 10 * i + j);
	/* n0 pulled from n1 over two lanes: both carried reads. */
	doc = test_stats(pt_d[0].sock);
	lr = json_object_get(json_object_get(doc, "peers"), "lane_reads");
	ck_assert_uint_eq(json_array_size(lr), 3);
	for (i = 0, used = 0; i < 3; i++)
		used += json_integer_value(json_array_get(lr, i)) > 0;
	ck_assert_int_ge(used, 2);
	json_decref(doc);
	for (i = 0; i < PT_N; i++)
		ck_assert_int_eq(test_stat(pt_d[i].sock, "cache", "objects_lost"), 0);
}
END_TEST

/* `l3kvctl stats -H` prints a line per member: its state, RTT, pulls, failures. */
START_TEST(test_l3kvctl_shows_the_peers)
{
	char	bin[PATH_MAX], cmd[PATH_MAX * 2], line[512], *all = NULL, *grown;
	size_t	len = 0;
	FILE	*p;
	int	lines = 0, tries = 0;

	pt_role(PT_N, NULL, NULL);
	test_path("l3kvctl", bin, sizeof(bin));
	snprintf(cmd, sizeof(cmd), "%s -s %s stats -H", bin, pt_d[0].sock);
	/* On a loaded machine a member's channel may come up a moment after the role's start. */
again:
	ck_assert_ptr_nonnull(p = popen(cmd, "r"));
	while (fgets(line, sizeof(line), p) != NULL) {
		if ((strncmp(line, "  n1 ", 5) == 0 || strncmp(line, "  n2 ", 5) == 0) &&
		    strstr(line, " up ") != NULL && strstr(line, "rtt") != NULL &&
		    strstr(line, "pulls") != NULL && strstr(line, "failures none") != NULL)
			lines++;
		ck_assert_ptr_nonnull(grown = realloc(all, len + strlen(line) + 1));
		all = grown;
		memcpy(all + len, line, strlen(line) + 1);
		len += strlen(line);
	}
	ck_assert_int_eq(WEXITSTATUS(pclose(p)), 0);
	ck_assert_ptr_nonnull(all);
	if (lines != 2 && tries++ < 50) {
		free(all);
		all = NULL;
		len = 0;
		lines = 0;
		usleep(100000);
		goto again;
	}
	ck_assert_msg(lines == 2, "no line per member in:\n%s", all);
	ck_assert_ptr_nonnull(strstr(all, "\npeers\n"));
	free(all);
}
END_TEST

/*
 * Sends len bytes to daemon i's peer port as a stranger would, from the
 * loopback address src (127.0.0.1 when NULL), and returns the status of
 * the first frame back (-1: none; the connection closed without one);
 * unless that status is ok, expects the daemon to close the connection.
 */
static int
pt_raw_from(unsigned i, const char *src, const void *buf, size_t len)
{
	struct sockaddr_in	sin;
	struct proto_hdr	h;
	struct pollfd		pfd;
	uint8_t			junk[4096];
	ssize_t			n;
	size_t			got = 0;
	int			fd, st = -1;

	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM, 0), 0);
	if (src != NULL) {
		memset(&sin, 0, sizeof(sin));
		sin.sin_family = AF_INET;
		ck_assert_int_eq(inet_pton(AF_INET, src, &sin.sin_addr), 1);
		ck_assert_msg(bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0, "bind %s: %s", src,
		    strerror(errno));
	}
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)(pt_port + i));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
	pfd.fd = fd;
	pfd.events = POLLIN;
	while (got < sizeof(h) && poll(&pfd, 1, 5000) == 1 &&
	    (n = read(fd, (uint8_t *)&h + got, sizeof(h) - got)) > 0)
		got += (size_t)n;
	if (got == sizeof(h))
		st = h.status;
	/* Then the daemon closes it: EOF within 5 s. */
	while (st != PROTO_S_OK && poll(&pfd, 1, 5000) == 1 &&
	    (n = read(fd, junk, sizeof(junk))) > 0)
		;
	if (st != PROTO_S_OK)
		ck_assert_int_eq(poll(&pfd, 1, 0), 1);
	close(fd);
	return st;
}

static int
pt_raw(unsigned i, const void *buf, size_t len)
{
	return pt_raw_from(i, NULL, buf, len);
}

/* Hostile bytes on the peer port: each answered and closed; the role keeps working. */
START_TEST(test_hostile_peer_bytes_are_refused)
{
	struct {
		struct proto_hdr	h;
		union {
			struct proto_peer_hello	hello;
			struct proto_peer_lease	lease;
			uint8_t			raw[1024];
		} u;
	} f;

	pt_role(2, NULL, NULL);
	memset(&f, 0x5a, sizeof(f));
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h)), PROTO_S_BAD_MAGIC);	/* an ERROR frame */
	memset(&f, 0, sizeof(f));
	proto_hdr_init(&f.h, PROTO_T_HELLO, sizeof(struct proto_hello), 1);
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h) + sizeof(struct proto_hello)), PROTO_S_BAD_TYPE);
	proto_hdr_init(&f.h, PROTO_T_PEER_LEASE, sizeof(f.u.lease), 2);
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h) + sizeof(f.u.lease)), PROTO_S_STATE);
	proto_hdr_init(&f.h, PROTO_T_PEER_HELLO, sizeof(f.u.hello), 3);
	f.u.hello.version_min = f.u.hello.version_max = 1;
	snprintf(f.u.hello.id, sizeof(f.u.hello.id), "mallory");
	snprintf(f.u.hello.role, sizeof(f.u.hello.role), "decode");
	f.u.hello.incarnation = 1;
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h) + sizeof(f.u.hello)), PROTO_S_PEER_UNKNOWN);
	snprintf(f.u.hello.id, sizeof(f.u.hello.id), "n0");	/* the daemon itself */
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h) + sizeof(f.u.hello)), PROTO_S_PEER_ROLE);
	snprintf(f.u.hello.id, sizeof(f.u.hello.id), "n1");
	snprintf(f.u.hello.role, sizeof(f.u.hello.role), "prefill");
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h) + sizeof(f.u.hello)), PROTO_S_PEER_ROLE);
	snprintf(f.u.hello.role, sizeof(f.u.hello.role), "decode");
	f.u.hello.nmr = 200;
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h) + sizeof(f.u.hello)), PROTO_S_INVALID);
	/* A header promising more than max_frame is refused before anything is read for it. */
	proto_hdr_init(&f.h, PROTO_T_PEER_OFFER, 64U << 20, 4);
	ck_assert_int_eq(pt_raw(0, &f, sizeof(f.h)), PROTO_S_TOO_BIG);
	ck_assert_int_ge(test_stat(pt_d[0].sock, "peers", "refused"), 4);
	/* The real members still restore from each other. */
	ck_assert(pt_wait_state(1, 0, "up"));
	pt_restores_across(0, 1, 14);
}
END_TEST

/* A daemon the members do not list is refused by each, and sees none of them up. */
START_TEST(test_stranger_is_refused)
{
	char		buf[32];
	unsigned	i;

	pt_role(PT_N, NULL, NULL);
	pt_start(PT_N, PT_N, NULL, NULL);	/* lists the role and itself */
	for (i = 0; i < PT_N; i++)
		ck_assert_int_ge(test_stat_wait(pt_d[i].sock, "peers", "refused", 1), 1);
	usleep(300000);
	for (i = 0; i < PT_N; i++) {
		ck_assert_str_ne(pt_state(PT_N, i, buf, sizeof(buf)), "up");
		ck_assert_str_eq(pt_state(i, PT_N, buf, sizeof(buf)), "absent");
	}
	ck_assert(test_daemon_log_has(&pt_d[0], "not in this daemon's member list"));
}
END_TEST

/* Member `of`'s incarnation as daemon i's STATS has it (hex). */
static const char *
pt_incarnation(unsigned i, unsigned of, char *buf, size_t len)
{
	char	id[16];
	json_t	*e;

	snprintf(id, sizeof(id), "n%u", of);
	ck_assert_ptr_nonnull(e = pt_peer(i, id));
	snprintf(buf, len, "%s", json_string_value(json_object_get(e, "incarnation")));
	json_decref(e);
	return buf;
}

/* A PEER_HELLO of member id, role decode, no data path, from src to daemon i: the status. */
static int
pt_hello_from(unsigned i, const char *src, const char *id)
{
	struct {
		struct proto_hdr	h;
		struct proto_peer_hello	hello;
	} f;

	memset(&f, 0, sizeof(f));
	proto_hdr_init(&f.h, PROTO_T_PEER_HELLO, sizeof(f.hello), 1);
	f.hello.version_min = f.hello.version_max = 1;
	snprintf(f.hello.id, sizeof(f.hello.id), "%s", id);
	snprintf(f.hello.role, sizeof(f.hello.role), "decode");
	f.hello.incarnation = 1;
	return pt_raw_from(i, src, &f, sizeof(f));
}

/*
 * A stranger that knows a member's id but connects from another address
 * (127.0.0.2 for n1 of 127.0.0.1) is refused, logged with both, counted;
 * the member itself stays up.
 */
START_TEST(test_member_id_from_another_address_is_refused)
{
	long long	refused;
	char		buf[32], inc[32];

	pt_role(2, NULL, NULL);
	pt_incarnation(0, 1, inc, sizeof(inc));
	refused = test_stat(pt_d[0].sock, "peers", "refused");
	ck_assert_int_eq(pt_hello_from(0, "127.0.0.2", "n1"), PROTO_S_PEER_UNKNOWN);
	ck_assert_int_eq(test_stat(pt_d[0].sock, "peers", "refused"), refused + 1);
	ck_assert(test_daemon_log_has(&pt_d[0], "PEER_HELLO as \"n1\" from 127.0.0.2, but the "
	    "member list has n1 at 127.0.0.1:"));
	/* Nothing of n1 changed: its channel is up and its incarnation what it was. */
	ck_assert_str_eq(pt_state(0, 1, buf, sizeof(buf)), "up");
	ck_assert_str_eq(pt_state(1, 0, buf, sizeof(buf)), "up");
	ck_assert_str_eq(pt_incarnation(0, 1, buf, sizeof(buf)), inc);
	ck_assert_str_ne(inc, "0000000000000001");
}
END_TEST

/*
 * A member listed by a name is let in from what the name resolves to
 * (localhost: 127.0.0.1), and one listed at a wildcard address (0.0.0.0)
 * from anywhere.
 */
START_TEST(test_member_by_name_or_wildcard_is_checked_so)
{
	char	*cfg;
	int	 rc;

	pt_pick_port();
	ck_assert(asprintf(&cfg, "{\"peer\": {\"id\": \"n0\", \"listen\": \"127.0.0.1:%u\", "
	    "\"provider\": \"%s\", \"fabric_addr\": \"127.0.0.1\", \"members\": ["
	    "{\"id\": \"n0\", \"addr\": \"127.0.0.1:%u\"}, "
	    "{\"id\": \"named\", \"addr\": \"localhost:%u\"}, "
	    "{\"id\": \"anywhere\", \"addr\": \"0.0.0.0:%u\"}]}}", pt_port, pt_provider,
	    pt_port, pt_port + 1, pt_port + 2) > 0);
	rc = test_daemon_start(&pt_d[0], cfg);
	free(cfg);
	ck_assert_msg(rc == 0, "daemon n0: %s", strerror(-rc));
	pt_up[0] = 1;
	ck_assert_int_eq(pt_hello_from(0, "127.0.0.1", "named"), PROTO_S_OK);
	ck_assert_int_eq(pt_hello_from(0, "127.0.0.2", "named"), PROTO_S_PEER_UNKNOWN);
	ck_assert_int_eq(pt_hello_from(0, "127.0.0.2", "anywhere"), PROTO_S_OK);
	ck_assert_int_eq(pt_hello_from(0, "127.0.0.3", "anywhere"), PROTO_S_OK);
	ck_assert_int_eq(test_stat(pt_d[0].sock, "peers", "refused"), 1);
}
END_TEST

static int	pt_raw_read(int, struct proto_hdr *);

/*
 * A nameserver for tests on 127.0.0.1 (UDP): it counts the queries for
 * name and, once `answer` is set, answers A queries for it with 127.0.0.2
 * (where nobody listens) then 127.0.0.1, and AAAA ones with nothing;
 * before that it says nothing at all, as a nameserver that is down.
 */
struct pt_dns {
	int		 fd;
	unsigned	 port;
	const char	*name;
	volatile int	 answer, stop, queries;
	pthread_t	 th;
};

/* The dotted name of a query's question at q (n bytes), or -1. */
static int
pt_dns_qname(const uint8_t *q, size_t n, char *out, size_t outlen, size_t *end)
{
	size_t	i = 12, o = 0;

	while (i < n && q[i] != 0) {
		if (q[i] > 63 || i + 1 + q[i] > n || o + q[i] + 2 > outlen)
			return -1;
		if (o > 0)
			out[o++] = '.';
		memcpy(out + o, q + i + 1, q[i]);
		o += q[i];
		i += 1 + (size_t)q[i];
	}
	if (i + 5 > n)
		return -1;
	out[o] = '\0';
	*end = i + 5;	/* the root label, QTYPE, QCLASS */
	return 0;
}

static void *
pt_dns_main(void *arg)
{
	struct pt_dns		*d = arg;
	struct sockaddr_in	 from;
	socklen_t		 fl;
	struct pollfd		 pfd = { d->fd, POLLIN, 0 };
	uint8_t			 q[512], r[600];
	char			 name[256];
	size_t			 end, k;
	ssize_t			 n;
	int			 a;

	while (!d->stop) {
		if (poll(&pfd, 1, 50) != 1)
			continue;
		fl = sizeof(from);
		if ((n = recvfrom(d->fd, q, sizeof(q), 0, (struct sockaddr *)&from, &fl)) < 17 ||
		    pt_dns_qname(q, (size_t)n, name, sizeof(name), &end) != 0 ||
		    strcasecmp(name, d->name) != 0)
			continue;
		d->queries++;
		if (!d->answer)
			continue;
		a = q[end - 4] == 0 && q[end - 3] == 1;		/* QTYPE A */
		memcpy(r, q, end);
		r[2] = 0x81;	/* a response, recursion desired */
		r[3] = 0x80;	/* recursion available, no error */
		r[6] = 0;
		r[7] = a ? 2 : 0;	/* ANCOUNT */
		memset(r + 8, 0, 4);
		k = end;
		if (a) {
			static const uint8_t	rr[] = { 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4,
						   127, 0, 0, 2,
						   0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4,
						   127, 0, 0, 1 };

			memcpy(r + k, rr, sizeof(rr));
			k += sizeof(rr);
		}
		(void)sendto(d->fd, r, k, 0, (struct sockaddr *)&from, fl);
	}
	return NULL;
}

static void
pt_dns_start(struct pt_dns *d, const char *name)
{
	struct sockaddr_in	sin = { .sin_family = AF_INET };
	socklen_t		sl = sizeof(sin);

	memset(d, 0, sizeof(*d));
	d->name = name;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(d->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), 0);
	ck_assert_int_eq(bind(d->fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(getsockname(d->fd, (struct sockaddr *)&sin, &sl), 0);
	d->port = ntohs(sin.sin_port);
	ck_assert_int_eq(pthread_create(&d->th, NULL, pt_dns_main, d), 0);
}

static void
pt_dns_stop(struct pt_dns *d)
{
	d->stop = 1;
	pthread_join(d->th, NULL);
	close(d->fd);
}

/*
 * A member listed by a host name is resolved by evdns, never blocking the
 * daemon: while the name's nameserver says nothing, the daemon answers,
 * does not dial the member and lets nobody in under its id; once an
 * answer comes, it dials (its first address refuses: the next one is
 * tried), and the member is up both ways.
 */
START_TEST(test_member_by_name_resolves_without_blocking)
{
	struct pt_dns	 dns;
	char		 dir[128], conf[192], buf[32], *cfg;
	FILE		*f;
	int		 rc, t;

	pt_pick_port();
	pt_dns_start(&dns, "n1.l3kv.test");
	ck_assert_ptr_nonnull(test_mkdtemp(dir, sizeof(dir)));
	snprintf(conf, sizeof(conf), "%s/resolv.conf", dir);
	ck_assert_ptr_nonnull(f = fopen(conf, "w"));
	fprintf(f, "nameserver 127.0.0.1:%u\noptions timeout:1 attempts:30\n", dns.port);
	fclose(f);
	pt_start(1, 2, NULL, NULL);	/* n1 dials n0 at 127.0.0.1 */
	ck_assert(asprintf(&cfg, "{\"peer\": {\"id\": \"n0\", \"listen\": \"127.0.0.1:%u\", "
	    "\"provider\": \"%s\", \"fabric_addr\": \"127.0.0.1\", \"ping_ms\": 100, "
	    "\"members\": [{\"id\": \"n0\", \"addr\": \"127.0.0.1:%u\"}, "
	    "{\"id\": \"n1\", \"addr\": \"n1.l3kv.test:%u\"}]}, "
	    "\"testing\": {\"resolv_conf\": \"%s\"}}", pt_port_of(0), pt_provider, pt_port_of(0),
	    pt_port_of(1), conf) > 0);
	rc = test_daemon_start(&pt_d[0], cfg);
	free(cfg);
	ck_assert_msg(rc == 0, "daemon n0: %s", strerror(-rc));
	pt_up[0] = 1;
	for (t = 0; t < 1000 && dns.queries == 0; t++)
		usleep(10000);
	ck_assert_msg(dns.queries > 0, "n0 never asked the nameserver for n1.l3kv.test");
	/* Unanswered: n0 serves, dials nobody, and refuses n1's HELLOs (no address to check). */
	ck_assert_int_ge(test_stat_wait(pt_d[0].sock, "peers", "refused", 1), 1);
	ck_assert_str_ne(pt_state(0, 1, buf, sizeof(buf)), "up");
	ck_assert_str_ne(pt_state(1, 0, buf, sizeof(buf)), "up");
	dns.answer = 1;
	ck_assert(pt_wait_state(0, 1, "up"));
	ck_assert(pt_wait_state(1, 0, "up"));
	pt_stop(0);
	pt_stop(1);
	pt_dns_stop(&dns);
	unlink(conf);
	rmdir(dir);
}
END_TEST

/*
 * A listener that answers the HELLO but refuses the PEER_AUTH: the
 * dialler never counts it up and sends it nothing after the PEER_AUTH
 * (no PING, no ask), and closes.
 */
START_TEST(test_dialler_is_up_only_once_its_auth_is_taken)
{
	struct {
		struct proto_hdr	h;
		struct proto_peer_hello	hello;
	} f;
	struct sockaddr_in	 sin;
	struct proto_hdr	 h;
	char			 line[96], buf[32];
	int			 lfd, fd, one = 1;

	pt_pick_port();
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)pt_port_of(1));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
	ck_assert_int_eq(setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	pt_start(0, 2, NULL, NULL);	/* n0 dials n1: here */
	ck_assert_int_ge(fd = accept(lfd, NULL, NULL), 0);
	ck_assert_int_eq(pt_raw_read(fd, &h), 0);
	ck_assert_uint_eq(h.type, PROTO_T_PEER_HELLO);
	memset(&f, 0, sizeof(f));
	proto_hdr_init(&f.h, PROTO_T_PEER_HELLO, sizeof(f.hello), h.seq);
	f.h.flags = PROTO_F_REPLY;
	f.h.status = PROTO_S_OK;
	f.hello.version_min = f.hello.version_max = 1;
	snprintf(f.hello.id, sizeof(f.hello.id), "n1");
	snprintf(f.hello.role, sizeof(f.hello.role), "decode");
	f.hello.incarnation = 7;
	ck_assert_int_eq(write(fd, &f, sizeof(f)), (ssize_t)sizeof(f));
	ck_assert_int_eq(pt_raw_read(fd, &h), 0);
	ck_assert_uint_eq(h.type, PROTO_T_PEER_AUTH);
	proto_hdr_init(&f.h, PROTO_T_PEER_AUTH, 0, h.seq);
	f.h.flags = PROTO_F_REPLY;
	f.h.status = PROTO_S_PEER_AUTH;
	ck_assert_int_eq(write(fd, &f.h, sizeof(f.h)), (ssize_t)sizeof(f.h));
	/* Nothing more: the connection closes (a PING here would mean n0 counted n1 up). */
	ck_assert_int_eq(pt_raw_read(fd, &h), -1);
	ck_assert_str_ne(pt_state(0, 1, buf, sizeof(buf)), "up");
	snprintf(line, sizeof(line), "n1 (127.0.0.1:%u) is up", pt_port_of(1));
	ck_assert(!test_daemon_log_has(&pt_d[0], line));
	ck_assert(test_daemon_log_has(&pt_d[0], "n1 refused our proof: peer_auth"));
	close(fd);
	close(lfd);
}
END_TEST

/* With peer.secret, a member with the wrong secret is refused; the right one is let in. */
START_TEST(test_secret_is_checked)
{
	char	buf[32];

	pt_pick_port();
	pt_start(0, 2, "\"secret\": \"right\"", NULL);
	pt_start(1, 2, "\"secret\": \"wrong\"", NULL);
	ck_assert_int_ge(test_stat_wait(pt_d[0].sock, "peers", "refused", 1), 1);
	usleep(300000);
	ck_assert_str_ne(pt_state(1, 0, buf, sizeof(buf)), "up");
	pt_stop(1);
	pt_start(1, 2, "\"secret\": \"right\"", NULL);
	ck_assert(pt_wait_state(1, 0, "up"));
	ck_assert(pt_wait_state(0, 1, "up"));
}
END_TEST

/* The next frame's header on fd within 5 s, its payload skipped: 0, or -1 (none, or EOF). */
static int
pt_raw_read(int fd, struct proto_hdr *h)
{
	struct pollfd	pfd = { fd, POLLIN, 0 };
	uint8_t		junk[4096];
	size_t		got = 0, want;
	ssize_t		n;

	while (got < sizeof(*h) && poll(&pfd, 1, 5000) == 1 &&
	    (n = read(fd, (uint8_t *)h + got, sizeof(*h) - got)) > 0)
		got += (size_t)n;
	if (got < sizeof(*h))
		return -1;
	for (want = h->length; want > 0 && poll(&pfd, 1, 5000) == 1 &&
	    (n = read(fd, junk, want < sizeof(junk) ? want : sizeof(junk))) > 0; )
		want -= (size_t)n;
	return want == 0 ? 0 : -1;
}

/*
 * A stranger where n1 is (127.0.0.1), without peer.secret, says n1's HELLO
 * to daemon i: a new incarnation, no data path. Returns the connection,
 * its HELLO answered ok.
 */
static int
pt_stranger_hello(unsigned i)
{
	struct {
		struct proto_hdr	h;
		struct proto_peer_hello	hello;
	} f;
	struct sockaddr_in	sin;
	struct proto_hdr	h;
	int			fd;

	memset(&f, 0, sizeof(f));
	proto_hdr_init(&f.h, PROTO_T_PEER_HELLO, sizeof(f.hello), 1);
	f.hello.version_min = f.hello.version_max = 1;
	snprintf(f.hello.id, sizeof(f.hello.id), "n1");
	snprintf(f.hello.role, sizeof(f.hello.role), "decode");
	f.hello.incarnation = 1;
	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM, 0), 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)(pt_port + i));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(write(fd, &f, sizeof(f)), (ssize_t)sizeof(f));
	ck_assert_int_eq(pt_raw_read(fd, &h), 0);
	ck_assert_uint_eq(h.seq, 1);
	ck_assert_int_eq(h.status, PROTO_S_OK);
	return fd;
}

/* What daemon i knows of n1 is what it was: incarnation, data path, up. */
static void
pt_n1_unchanged(unsigned i, const char *inc, const char *dp)
{
	char	buf[32];
	json_t	*e;

	ck_assert_ptr_nonnull(e = pt_peer(i, "n1"));
	ck_assert_str_eq(json_string_value(json_object_get(e, "incarnation")), inc);
	ck_assert_str_eq(json_string_value(json_object_get(e, "data_path")), dp);
	json_decref(e);
	ck_assert_str_eq(pt_state(i, 1, buf, sizeof(buf)), "up");
	ck_assert(!test_daemon_log_has(&pt_d[i], "n1 restarted (incarnation 0000000000000001"));
	ck_assert(!test_daemon_log_has(&pt_d[i], "n1 connected (incarnation 0000000000000001"));
}

/*
 * With peer.secret, a HELLO claiming member n1 from n1's address (where a
 * stranger may well be) changes nothing of n1 until its PEER_AUTH proves
 * the secret: with a wrong proof it is refused and closed, without one
 * it waits and a request is refused; n1's incarnation and data path on n0
 * stay what they were, and n0 still pulls from n1.
 */
START_TEST(test_unproved_hello_changes_nothing_of_the_member)
{
	struct {
		struct proto_hdr	h;
		union {
			struct proto_peer_auth	auth;
			struct proto_peer_ping	ping;
		} u;
	} f;
	struct proto_hdr		h;
	char				inc[32], dp[32];
	long long			refused;
	json_t				*e;
	int				fd;

	pt_role(2, "\"secret\": \"s3cret\"", NULL);
	pt_incarnation(0, 1, inc, sizeof(inc));
	ck_assert_ptr_nonnull(e = pt_peer(0, "n1"));
	snprintf(dp, sizeof(dp), "%s", json_string_value(json_object_get(e, "data_path")));
	json_decref(e);
	refused = test_stat(pt_d[0].sock, "peers", "refused");

	/* A wrong proof (zeros): refused peer_auth and closed; nothing of n1 changed. */
	fd = pt_stranger_hello(0);
	pt_n1_unchanged(0, inc, dp);
	memset(&f, 0, sizeof(f));
	proto_hdr_init(&f.h, PROTO_T_PEER_AUTH, sizeof(f.u.auth), 2);
	ck_assert_int_eq(write(fd, &f, sizeof(f.h) + sizeof(f.u.auth)),
	    (ssize_t)(sizeof(f.h) + sizeof(f.u.auth)));
	ck_assert_int_eq(pt_raw_read(fd, &h), 0);
	ck_assert_uint_eq(h.seq, 2);
	ck_assert_int_eq(h.status, PROTO_S_PEER_AUTH);
	ck_assert_int_eq(pt_raw_read(fd, &h), -1);	/* closed */
	close(fd);
	ck_assert_int_eq(test_stat(pt_d[0].sock, "peers", "refused"), refused + 1);
	pt_n1_unchanged(0, inc, dp);

	/* No proof at all: the HELLO waits, a request is refused; still nothing changed. */
	fd = pt_stranger_hello(0);
	pt_n1_unchanged(0, inc, dp);
	proto_hdr_init(&f.h, PROTO_T_PEER_PING, sizeof(f.u.ping), 3);
	ck_assert_int_eq(write(fd, &f, sizeof(f.h) + sizeof(f.u.ping)),
	    (ssize_t)(sizeof(f.h) + sizeof(f.u.ping)));
	ck_assert_int_eq(pt_raw_read(fd, &h), 0);
	ck_assert_int_eq(h.status, PROTO_S_PEER_AUTH);
	close(fd);
	ck_assert_int_eq(test_stat(pt_d[0].sock, "peers", "refused"), refused + 2);
	pt_n1_unchanged(0, inc, dp);

	/* n1's pulls keep working: what n1 holds is restored on n0. */
	pt_restores_across(1, 0, 15);
	ck_assert_int_gt(pt_peer_stat(0, 1, "pulls"), 0);
}
END_TEST

/* ------------------------------------------------------------------ restores */

/* STATS cache.hits.peer of daemon i. */
static long long
pt_hits_peer(unsigned i)
{
	json_t		*j = test_stats(pt_d[i].sock);
	long long	 v;

	v = json_integer_value(json_object_get(json_object_get(json_object_get(j, "cache"),
	    "hits"), "peer"));
	json_decref(j);
	return v;
}

/*
 * The sum of daemon i's /metrics samples of the family `name` whose
 * labels hold `label` (any, when NULL), with pt_metrics: -1 when there
 * is none.
 */
static double
pt_metric(unsigned i, const char *name, const char *label)
{
	static const char	 req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	struct sockaddr_in	 sin;
	struct pollfd		 pfd;
	char			*buf = NULL, *grown, *line, *end, *v;
	size_t			 len = 0, cap = 0;
	ssize_t			 n;
	double			 sum = -1;
	int			 fd;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)(pt_port + PT_N + 1 + i));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM, 0), 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
	pfd.fd = fd;
	pfd.events = POLLIN;
	for (;;) {
		if (len + 4097 > cap) {
			cap = cap * 2 + 8192;
			ck_assert_ptr_nonnull(grown = realloc(buf, cap));
			buf = grown;
		}
		ck_assert_msg(poll(&pfd, 1, 5000) == 1, "n%u: /metrics did not end within 5 s", i);
		if ((n = read(fd, buf + len, 4096)) <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	ck_assert_msg(strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 ") != NULL,
	    "n%u: /metrics: %.80s", i, buf);
	for (line = buf; (end = strchr(line, '\n')) != NULL; line = end + 1) {
		*end = '\0';
		if (strncmp(line, name, strlen(name)) != 0 || line[strlen(name)] != '{' ||
		    (v = strstr(line, "} ")) == NULL || (label != NULL && (strstr(line, label) ==
		    NULL || strstr(line, label) > v)))
			continue;
		sum = (sum < 0 ? 0 : sum) + strtod(v + 2, NULL);
	}
	free(buf);
	return sum;
}

/* The same for l3kv_restored_pages_total with tier="tier". */
static double
pt_restored_by_tier(unsigned i, const char *tier)
{
	char	want[32];

	snprintf(want, sizeof(want), ",tier=\"%s\"", tier);
	return pt_metric(i, "l3kv_restored_pages_total", want);
}

/* Objects published on one daemon are restored byte for byte on the others. */
START_TEST(test_restore_objects_published_elsewhere)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	struct test_rank		pub, r;
	unsigned			i;
	uint32_t			p;
	long long			pulled = 0;

	pt_metrics = 1;
	pt_role(PT_N, NULL, NULL);
	pt_rank(&pub, 0);
	test_rank_publish_kv(&pub, 11, 0, 48, 0, NULL);
	/* Each stripe went to its home; those homed on n0 stay there. */
	usleep(200000);
	for (i = 1; i < PT_N; i++) {
		pt_rank(&r, i);
		ck_assert_uint_eq(test_rank_probe(&r, 11, 48, NULL, NULL), 48);
		a = test_rank_admit(&r, 1, 11, 48, 48, PROTO_SLOT_NONE);
		ck_assert_uint_eq(a.admitted_pages, 48);
		test_rank_sentinel(&r, TEST_RANK_KV, 0, PT_PAGES);
		ck_assert_int_eq(test_rank_restore(&r, a.lease, 0, 48, &res), 0);
		ck_assert_uint_eq(res.pages, 48);
		for (p = 0; p < 48; p++)
			ck_assert_msg(test_rank_page_is(&r, TEST_RANK_KV, p, 11, p), "n%u page %u", i,
			    p);
		ck_assert_int_eq(test_stat(pt_d[i].sock, "cache", "objects_lost"), 0);
		test_rank_fini(&r);
		/* What its offers did not bring here was pulled, and nothing else. */
		ck_assert_int_eq(pt_hits_peer(i) + test_stat(pt_d[i].sock, "peers",
		    "offers_stored"), 48);
		/* /metrics splits the hits as STATS does: pulled pages are the peer tier's, not DRAM's. */
		ck_assert_double_eq(pt_restored_by_tier(i, "peer"), (double)pt_hits_peer(i));
		ck_assert_double_eq(pt_restored_by_tier(i, "dram"), (double)(48 - pt_hits_peer(i)));
		ck_assert_double_eq(pt_restored_by_tier(i, "file"), 0);
		pulled += pt_hits_peer(i);
	}
	ck_assert_int_gt(pulled, 0);
	/* Stripes of 16 contiguous pages: fewer reads than pulls (coalesced). */
	ck_assert_int_lt(pt_peer_stat(1, 0, "reads") + pt_peer_stat(1, 2, "reads"),
	    pt_peer_stat(1, 0, "pulls") + pt_peer_stat(1, 2, "pulls"));
	ck_assert_int_gt(test_stat(pt_d[0].sock, "peers", "leases_served") +
	    test_stat(pt_d[1].sock, "peers", "leases_served") +
	    test_stat(pt_d[2].sock, "peers", "leases_served"), 0);
	test_rank_fini(&pub);
}
END_TEST

/* What PROBE must leave alone on a daemon: objects, pins, leases, the peers' pins and leases. */
static char *
pt_state_of(unsigned i)
{
	json_t	*j = test_stats(pt_d[i].sock), *keep, *peers = json_object_get(j, "peers");
	char	*out;

	keep = json_pack("{s:O, s:O, s:O, s:O, s:O}", "dram", json_object_get(j, "dram"),
	    "leases", json_object_get(json_object_get(j, "cache"), "leases_open"),
	    "pins", json_object_get(peers, "pins"), "leases_served",
	    json_object_get(peers, "leases_served"), "offers", json_object_get(peers,
	    "offers_served"));
	out = json_dumps(keep, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(keep);
	json_decref(j);
	return out;
}

/* PROBE counts what the homes hold and changes nothing on any daemon. */
START_TEST(test_probe_changes_nothing_anywhere)
{
	struct test_rank	pub, r;
	char			*before[PT_N], *after;
	unsigned		i, k;

	pt_role(PT_N, NULL, NULL);
	pt_rank(&pub, 0);
	test_rank_publish_kv(&pub, 12, 0, 48, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	pt_rank(&r, 1);
	ck_assert_uint_eq(test_rank_probe(&r, 12, 48, NULL, NULL), 48);
	for (i = 0; i < PT_N; i++)
		before[i] = pt_state_of(i);
	for (k = 0; k < 20; k++)
		ck_assert_uint_eq(test_rank_probe(&r, 12, 48, NULL, NULL), 48);
	/* A prefix nobody holds past page 16 is 16, asked of the homes too. */
	test_rank_publish_kv(&r, 13, 0, 16, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[1].sock, "dram", "pins", 0), 0);
	for (i = 0; i < PT_N; i++) {
		free(before[i]);
		before[i] = pt_state_of(i);
	}
	for (k = 0; k < 20; k++)
		ck_assert_uint_eq(test_rank_probe(&r, 13, 48, NULL, NULL), 16);
	for (i = 0; i < PT_N; i++) {
		after = pt_state_of(i);
		ck_assert_msg(strcmp(before[i], after) == 0, "n%u changed:\n%s\n%s", i, before[i],
		    after);
		free(after);
		free(before[i]);
	}
	ck_assert_int_gt(test_stat(pt_d[0].sock, "peers", "probes_served") +
	    test_stat(pt_d[2].sock, "peers", "probes_served"), 0);
	test_rank_fini(&r);
	test_rank_fini(&pub);
}
END_TEST

/* The next completion on r's connection within timeout_ms: 0, or -ETIMEDOUT. */
static int
pt_completion_within(struct test_rank *r, struct l3kv_completion *c, int timeout_ms)
{
	struct pollfd	pfd = { l3kv_fd(r->k), POLLIN, 0 };
	struct timespec	t0, t;
	int		rc, left;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		if ((rc = l3kv_poll_completion(r->k, c)) != -EAGAIN)
			return rc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		left = timeout_ms - (int)((t.tv_sec - t0.tv_sec) * 1000 +
		    (t.tv_nsec - t0.tv_nsec) / 1000000);
		if (left <= 0)
			return -ETIMEDOUT;
		poll(&pfd, 1, left);
	}
}

/*
 * A PROBE waiting for a home's answer when its session DETACHes on the
 * same connection is answered `state`, before the DETACH's ok and long
 * before peer.timeout_ms (3 s); a PROBE waiting when its connection
 * closes is answered by nobody, and the daemon goes on.
 */
START_TEST(test_probe_waiting_for_peers_is_answered_at_detach)
{
	struct l3kv_completion	c;
	struct test_rank	r;
	uint8_t			*hs = test_page_hashes(16, 64);
	uint64_t		t;
	long long		sent;
	uint32_t		hit;

	pt_role(2, NULL, NULL);
	pt_rank(&r, 1);
	sent = pt_peer_stat(1, 0, "probes_sent");
	/* n0 stopped: its answers can only time out, or go with its connection (pings). */
	ck_assert_int_eq(kill(pt_d[0].pid, SIGSTOP), 0);
	/* Corked: one write, so the DETACH is read before the loop could take any answer. */
	ck_assert_int_eq(l3kv_cork(r.k), 0);
	ck_assert_int_eq(l3kv_submit_probe(r.k, hs, 64, &t), 0);
	ck_assert_int_eq(l3kv_detach(r.k), 0);
	ck_assert_int_eq(l3kv_uncork(r.k), 0);
	ck_assert_msg(pt_completion_within(&r, &c, 2000) == 0, "the PROBE was not answered");
	ck_assert_uint_eq(c.ticket, t);
	ck_assert_int_eq(c.op, L3KV_OP_PROBE);
	ck_assert_int_eq(c.proto_status, PROTO_S_STATE);
	ck_assert_ptr_nonnull(strstr(c.payload, "detached"));
	l3kv_completion_release(&c);
	ck_assert_int_eq(pt_peer_stat(1, 0, "probes_sent"), sent + 1);	/* it did wait for n0 */
	/* The connection stays usable: a new ATTACH probes again (n0 is a miss, or down). */
	ck_assert_int_eq(l3kv_attach(r.k, &r.args, NULL), 0);
	ck_assert_int_eq(l3kv_probe(r.k, hs, 64, &hit), 0);
	ck_assert_uint_eq(hit, 0);
	test_rank_fini(&r);

	/* Again, but the connection closes with the PROBE waiting: nobody to answer, nothing freed twice. */
	ck_assert_int_eq(kill(pt_d[0].pid, SIGCONT), 0);
	ck_assert(pt_wait_state(1, 0, "up"));
	pt_rank(&r, 1);
	sent = pt_peer_stat(1, 0, "probes_sent");
	ck_assert_int_eq(kill(pt_d[0].pid, SIGSTOP), 0);
	ck_assert_int_eq(l3kv_submit_probe(r.k, hs, 64, &t), 0);
	for (int i = 0; i < 500 && pt_peer_stat(1, 0, "probes_sent") == sent; i++)
		usleep(10000);
	ck_assert_int_eq(pt_peer_stat(1, 0, "probes_sent"), sent + 1);
	test_rank_fini(&r);
	ck_assert_int_eq(kill(pt_d[0].pid, SIGCONT), 0);
	ck_assert_int_eq(test_stat_wait(pt_d[1].sock, "attach", "sessions", 0), 0);
	ck_assert(pt_wait_state(1, 0, "up"));
	pt_rank(&r, 1);
	ck_assert_uint_eq(test_rank_probe(&r, 16, 64, NULL, NULL), 0);
	test_rank_fini(&r);
	free(hs);
}
END_TEST

/* A hybrid layout: KV pages, an all_pages sidecar and a checkpoint, all from another daemon. */
START_TEST(test_hybrid_pools_restore_elsewhere)
{
	struct l3kv_restore_result	res;
	struct l3kv_state_dest		sd = { TEST_RANK_STATE, 1 };
	struct l3kv_admit_result	a;
	struct test_rank		pub, r;
	uint32_t			dst[16], stops[16], nstops, i;

	pt_role(PT_N, NULL, NULL);
	test_rank_init(&pub, &pt_kv, "h", 1, 0);
	pub.args.layout.attention = L3KV_ATTN_MHA;
	test_rank_add_state(&pub, 4, 4096, "conv:4096");
	test_rank_add_sidecar(&pub, L3KV_HIT_ALL_PAGES, 0, PT_TOKENS, 32, "swa:32");
	r = pub;
	test_rank_attach(&pub, pt_d[0].sock);
	for (i = 0; i < 16; i++) {
		test_rank_fill_page(&pub, TEST_RANK_KV, i, 21, i);
		test_rank_fill_page(&pub, TEST_RANK_SIDE, i, 22, i);
	}
	test_rank_publish(&pub, TEST_RANK_KV, 21, 0, 16, 0, NULL);
	/* The sidecar pages are published under prefix 21's hashes, with their own bytes. */
	for (i = 0; i < 16; i++) {
		struct l3kv_publish_page	pg;
		struct l3kv_publish_result	pr;

		test_page_hash(21, i, pg.hash);
		pg.src_page = i;
		ck_assert_int_eq(l3kv_publish(pub.k, TEST_RANK_SIDE, &pg, 1, &pr), 0);
	}
	test_rank_fill_page(&pub, TEST_RANK_STATE, 3, 23, 15);
	test_rank_publish(&pub, TEST_RANK_STATE, 21, 15, 1, 3, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);

	/* The second rank maps its own memory: r was a copy of pub's arguments before attach. */
	test_rank_init(&r, &pt_kv, "h", 1, 0);
	r.args.layout.attention = L3KV_ATTN_MHA;
	test_rank_add_state(&r, 4, 4096, "conv:4096");
	test_rank_add_sidecar(&r, L3KV_HIT_ALL_PAGES, 0, PT_TOKENS, 32, "swa:32");
	test_rank_attach(&r, pt_d[2].sock);
	ck_assert_uint_eq(test_rank_probe(&r, 21, 16, stops, &nstops), 16);
	ck_assert_uint_eq(nstops, 1);
	a = test_rank_admit(&r, 1, 21, 16, 16, 1);
	ck_assert_uint_eq(a.admitted_pages, 16);
	test_rank_sentinel(&r, TEST_RANK_KV, 0, 16);
	test_rank_sentinel(&r, TEST_RANK_SIDE, 0, 16);
	memset(r.mem[TEST_RANK_STATE], 0xee, r.len[TEST_RANK_STATE]);
	for (i = 0; i < 16; i++)
		dst[i] = i;
	ck_assert_int_eq(l3kv_restore_state(r.k, a.lease, TEST_RANK_KV, dst, 16, &sd, 10000, &res),
	    0);
	ck_assert_uint_eq(res.pages, 16);
	for (i = 0; i < 16; i++) {
		ck_assert_msg(test_rank_page_is(&r, TEST_RANK_KV, i, 21, i), "kv page %u", i);
		ck_assert_msg(test_rank_page_is(&r, TEST_RANK_SIDE, i, 22, i), "sidecar page %u", i);
	}
	ck_assert(test_rank_page_is(&r, TEST_RANK_STATE, 1, 23, 15));
	ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	test_rank_fini(&r);
	test_rank_fini(&pub);
}
END_TEST

/* A DCP group's shards are placed apart and each rank restores its own, from elsewhere. */
START_TEST(test_dcp_shards_restore_from_their_homes)
{
	struct l3kv_admit_result	res[2];
	struct l3kv_restore_result	rr;
	struct l3kv_admit_args		a;
	struct test_rank		pub[2], r[2];
	uint8_t				*hs = test_page_hashes(31, 32);
	uint32_t			dst[32], i, k;
	uint64_t			ticket;

	pt_role(PT_N, NULL, NULL);
	for (k = 0; k < 2; k++) {
		test_rank_init(&pub[k], &pt_kv, "dcp", 2, k);
		pub[k].args.layout.dcp_size = 2;
		pub[k].args.layout.dcp_rank = (uint16_t)k;
		pub[k].args.layout.tp_size = 1;
		pub[k].args.tp_rank = 0;
		test_rank_attach(&pub[k], pt_d[0].sock);
		/* Shard k's pages have their own bytes: prefix 31 + 10 * k. */
		for (i = 0; i < 32; i++)
			test_rank_fill_page(&pub[k], TEST_RANK_KV, i, 31 + 10 * k, i);
		test_rank_publish(&pub[k], TEST_RANK_KV, 31, 0, 32, 0, NULL);
	}
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	for (k = 0; k < 2; k++) {
		test_rank_init(&r[k], &pt_kv, "dcp", 2, k);
		r[k].args.layout.dcp_size = 2;
		r[k].args.layout.dcp_rank = (uint16_t)k;
		r[k].args.layout.tp_size = 1;
		r[k].args.tp_rank = 0;
		test_rank_attach(&r[k], pt_d[1].sock);
	}
	a = (struct l3kv_admit_args){ .request_id = 9, .hashes = hs, .npages = 32,
	    .reserved_pages = 32, .state_slot = PROTO_SLOT_NONE };
	test_rank_admit_group(r, 2, &a, res);
	ck_assert_uint_eq(res[0].admitted_pages, 32);
	ck_assert_uint_eq(res[1].admitted_pages, 32);
	for (i = 0; i < 32; i++)
		dst[i] = i;
	for (k = 0; k < 2; k++) {
		test_rank_sentinel(&r[k], TEST_RANK_KV, 0, PT_PAGES);
		ck_assert_int_eq(l3kv_submit_restore(r[k].k, res[k].lease, TEST_RANK_KV, dst, 32,
		    &ticket), 0);
	}
	for (k = 0; k < 2; k++) {
		struct l3kv_completion	c;

		test_rank_wait_completion(&r[k], &c);
		ck_assert_int_eq(l3kv_restore_result(&c, &rr), 0);
		l3kv_completion_release(&c);
		ck_assert_uint_eq(rr.pages, 32);
		for (i = 0; i < 32; i++)
			ck_assert_msg(test_rank_page_is(&r[k], TEST_RANK_KV, i, 31 + 10 * k, i),
			    "shard %u page %u", k, i);
	}
	for (k = 0; k < 2; k++) {
		ck_assert_int_eq(l3kv_release(r[k].k, res[k].lease), 0);
		test_rank_fini(&r[k]);
		test_rank_fini(&pub[k]);
	}
	free(hs);
}
END_TEST

/* ------------------------------------------------------------------ faults */

#define PT_BIG		128	/* pages of the fault tests' prefix: 8 stripes */

static const struct test_rank_kv	pt_big = { "peer-model", "latent:128:fp8_e4m3", L3KV_ATTN_MLA,
    512, PT_TOKENS, PT_LAYERS, PT_TB };

static void
pt_rank_big(struct test_rank *r, unsigned i)
{
	test_rank_init(r, &pt_big, "g", 1, 0);
	test_rank_attach(r, pt_d[i].sock);
}

/* STATS peers: the sum over daemon i's peers of one failure reason. */
static long long
pt_failures(unsigned i, const char *why)
{
	json_t		*j = test_stats(pt_d[i].sock), *a, *e;
	long long	 n = 0;
	size_t		 k;

	a = json_object_get(json_object_get(j, "peers"), "peers");
	json_array_foreach(a, k, e)
		n += json_integer_value(json_object_get(json_object_get(e, "failures"), why));
	json_decref(j);
	return n;
}

/*
 * Two daemons: n0 publishes a prefix of n pages (its stripes homed on n1
 * are offered there and pulled); returns once n0 holds no offer pins.
 */
static void
pt_pair_published(struct test_rank *pub, uint32_t prefix, uint32_t n, const char *peer1,
    const char *test1, const char *peer0, const char *test0)
{
	pt_pick_port();
	pt_start(0, 2, peer0, test0);
	pt_start(1, 2, peer1, test1);
	pt_wait_mesh(2);
	pt_rank_big(pub, 0);
	test_rank_publish_kv(pub, prefix, 0, n, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
}

/*
 * After a fault: what n1 now says it holds (PROBE) is what ADMIT promises
 * and what RESTORE puts in place, byte for byte; nothing is a false hit.
 */
static uint32_t
pt_honest(struct test_rank *r, uint64_t req, uint32_t prefix, uint32_t n)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;
	uint32_t			hit, p;

	hit = test_rank_probe(r, prefix, n, NULL, NULL);
	a = test_rank_admit(r, req, prefix, n, n, PROTO_SLOT_NONE);
	ck_assert_uint_le(a.admitted_pages, hit);
	if (a.admitted_pages == 0)
		return 0;
	test_rank_sentinel(r, TEST_RANK_KV, 0, n);
	ck_assert_int_eq(test_rank_restore(r, a.lease, 0, a.admitted_pages, &res), 0);
	ck_assert_uint_eq(res.pages, a.admitted_pages);
	for (p = 0; p < a.admitted_pages; p++)
		ck_assert_msg(test_rank_page_is(r, TEST_RANK_KV, p, prefix, p), "page %u", p);
	ck_assert(test_rank_is_sentinel(r, TEST_RANK_KV, a.admitted_pages, n - a.admitted_pages));
	ck_assert_int_eq(l3kv_release(r->k, a.lease), 0);
	return a.admitted_pages;
}

/*
 * ADMIT on n1 promises what the owner leased; the pulls wait
 * (testing.peer_pull_delay_ms) and the fault strikes meanwhile: the
 * RESTORE fails `lost`, its destination untouched.
 */
static void
pt_restore_lost(struct test_rank *r, uint32_t prefix, uint32_t n, void (*fault)(void *), void *arg)
{
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;

	a = test_rank_admit(r, 1, prefix, n, n, PROTO_SLOT_NONE);
	ck_assert_uint_eq(a.admitted_pages, n);
	ck_assert_int_gt(test_stat(pt_d[1].sock, "cache", "leases_open"), 0);
	fault(arg);
	test_rank_sentinel(r, TEST_RANK_KV, 0, n);
	ck_assert_int_eq(test_rank_restore(r, a.lease, 0, n, &res), -ENODATA);
	ck_assert(test_rank_is_sentinel(r, TEST_RANK_KV, 0, n));
	ck_assert_int_gt(test_stat(pt_d[1].sock, "cache", "objects_lost"), 0);
	(void)l3kv_release(r->k, a.lease);
}

static void
pt_fault_kill_owner(void *arg)
{
	int	status;

	(void)arg;
	pt_up[0] = 0;
	(void)test_daemon_stop(&pt_d[0], SIGKILL, &status);
}

/* The owner is SIGKILLed while the pulls wait: lost, then honest misses. */
START_TEST(test_owner_killed_mid_pull)
{
	struct test_rank	pub, r;

	pt_pair_published(&pub, 41, PT_BIG, NULL, "\"peer_pull_delay_ms\": 1500", NULL, NULL);
	pt_rank_big(&r, 1);
	ck_assert_uint_eq(test_rank_probe(&r, 41, PT_BIG, NULL, NULL), PT_BIG);
	test_rank_fini(&pub);
	pt_restore_lost(&r, 41, PT_BIG, pt_fault_kill_owner, NULL);
	ck_assert(pt_wait_state(1, 0, "down") || pt_wait_state(1, 0, "connecting"));
	ck_assert_int_gt(pt_failures(1, "stale") + pt_failures(1, "io"), 0);
	/* Only what n1 holds itself now: its offered stripes, up to the first one it lacks. */
	ck_assert_uint_lt(pt_honest(&r, 2, 41, PT_BIG), PT_BIG);
	test_rank_fini(&r);
}
END_TEST

static void
pt_fault_restart_owner(void *arg)
{
	struct test_rank	*pub = arg;
	uint32_t		 i;

	pt_fault_kill_owner(NULL);
	pt_start(0, 2, NULL, NULL);
	/* The same hashes, other bytes: what a restarted owner holds under the old names. */
	pt_rank_big(pub, 0);
	for (i = 0; i < PT_BIG; i++)
		test_rank_fill_page(pub, TEST_RANK_KV, i, 99, i);
	test_rank_publish(pub, TEST_RANK_KV, 42, 0, PT_BIG, 0, NULL);
	test_rank_fini(pub);
}

/* The owner restarts (a new incarnation) during the pulls: lost; no stale byte is restored. */
START_TEST(test_owner_restarted_mid_pull)
{
	struct test_rank	pub, r;

	pt_pair_published(&pub, 42, PT_BIG, NULL, "\"peer_pull_delay_ms\": 3000", NULL, NULL);
	test_rank_fini(&pub);
	pt_rank_big(&r, 1);
	pt_restore_lost(&r, 42, PT_BIG, pt_fault_restart_owner, &pub);
	ck_assert_int_gt(pt_failures(1, "stale") + pt_failures(1, "io") +
	    pt_failures(1, "checksum"), 0);
	ck_assert(pt_wait_state(1, 0, "up"));
	/* The restarted owner's pages have prefix 99's bytes: a restore now is exactly those. */
	{
		struct l3kv_restore_result	res;
		struct l3kv_admit_result	a;
		uint32_t			p, mine = 0, theirs = 0;

		a = test_rank_admit(&r, 2, 42, PT_BIG, PT_BIG, PROTO_SLOT_NONE);
		ck_assert_uint_gt(a.admitted_pages, 0);
		ck_assert_int_eq(test_rank_restore(&r, a.lease, 0, a.admitted_pages, &res), 0);
		for (p = 0; p < a.admitted_pages; p++) {
			/* n1's own copies (offered before) or the new owner's bytes, nothing else. */
			if (test_rank_page_is(&r, TEST_RANK_KV, p, 42, p))
				mine++;
			else {
				ck_assert_msg(test_rank_page_is(&r, TEST_RANK_KV, p, 99, p), "page %u", p);
				theirs++;
			}
		}
		ck_assert_uint_eq(mine + theirs, a.admitted_pages);
		ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	}
	test_rank_fini(&r);
}
END_TEST

/* An owner whose lease answers name keys outside its registered chunks: misses, nothing lost. */
START_TEST(test_bad_key_is_refused_before_any_read)
{
	struct test_rank	pub, r;
	uint32_t		got;

	pt_pair_published(&pub, 43, PT_BIG, NULL, NULL, NULL, "\"peer_bad_key\": true");
	pt_rank_big(&r, 1);
	got = pt_honest(&r, 1, 43, PT_BIG);
	ck_assert_uint_lt(got, PT_BIG);
	ck_assert_int_gt(pt_failures(1, "bad_key"), 0);
	ck_assert_int_eq(test_stat(pt_d[1].sock, "cache", "objects_lost"), 0);
	test_rank_fini(&r);
	test_rank_fini(&pub);
}
END_TEST

static void
pt_fault_expire_and_corrupt(void *arg)
{
	struct test_rank	*pub = arg;
	uint8_t			 h[L3KV_HASH_LEN];
	uint32_t		 i;

	/* The owner's lease reaches its maximum age (200 ms), then its objects change. */
	ck_assert_int_ge(test_stat_wait(pt_d[0].sock, "peers", "leases_expired", 1), 1);
	ck_assert_int_eq(test_stat(pt_d[0].sock, "peers", "pins"), 0);
	for (i = 0; i < PT_BIG; i++) {
		test_page_hash(44, i, h);
		ck_assert_int_eq(l3kv_debug(pub->k, L3KV_DEBUG_CORRUPT, 0, h), 0);
	}
}

/* The owner's lease expires before the pull, and the bytes change: caught on landing. */
START_TEST(test_owner_lease_expiry_is_caught)
{
	struct test_rank	pub, r;

	pt_pair_published(&pub, 44, PT_BIG, NULL, "\"peer_pull_delay_ms\": 1500",
	    "\"lease_max_ms\": 200", NULL);
	pt_rank_big(&r, 1);
	pt_restore_lost(&r, 44, PT_BIG, pt_fault_expire_and_corrupt, &pub);
	ck_assert_int_gt(pt_failures(1, "checksum"), 0);
	test_rank_fini(&r);
	test_rank_fini(&pub);
}
END_TEST

/* 400 pages, about half of them pulled at once by one ADMIT: all byte for byte. */
START_TEST(test_200_concurrent_pulls)
{
	struct test_rank	pub, r;
	long long		pulls;

	pt_pair_published(&pub, 45, 400, "\"stripe_pages\": 1", NULL, "\"stripe_pages\": 1", NULL);
	pt_rank_big(&r, 1);
	ck_assert_uint_eq(pt_honest(&r, 1, 45, 400), 400);
	pulls = pt_peer_stat(1, 0, "pulls");
	ck_assert_msg(pulls >= 150, "only %lld pulls", pulls);
	ck_assert_int_eq(pt_failures(1, "io") + pt_failures(1, "checksum") +
	    pt_failures(1, "timeout"), 0);
	test_rank_fini(&r);
	test_rank_fini(&pub);
}
END_TEST

/* Of pages [0, n) of prefix, how many daemon i finds one at a time (PROBE of each alone). */
static uint32_t
pt_probe_each(struct test_rank *r, uint32_t prefix, uint32_t n)
{
	uint8_t		h[L3KV_HASH_LEN];
	uint32_t	i, hit, got = 0;

	for (i = 0; i < n; i++) {
		test_page_hash(prefix, i, h);
		ck_assert_int_eq(l3kv_probe(r->k, h, 1, &hit), 0);
		got += hit;
	}
	return got;
}

/*
 * What a daemon pulled for a restore of its own is checked by that
 * restore, and served to other daemons only after it: n1 pulls a prefix
 * published on n0 and lets go of it unrestored (its copies unverified);
 * n0 loses its own copies and forgets n2, so that the pages homed on n2
 * are now homed on n0 or n1, and n0 asks n1 for some it only pulled. n1
 * says it lacks them until a restore on n1 read them whole, then has them.
 */
START_TEST(test_pulled_copies_are_served_only_once_restored)
{
	struct test_rank	pub, r1;
	struct l3kv_admit_result a;
	uint8_t			h[L3KV_HASH_LEN];
	uint32_t		i, before, after, n = 400;

	pt_metrics = 1;
	pt_role(PT_N, "\"stripe_pages\": 1", NULL);
	pt_rank_big(&pub, 0);
	test_rank_publish_kv(&pub, 49, 0, n, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	pt_rank_big(&r1, 1);
	a = test_rank_admit(&r1, 1, 49, n, n, PROTO_SLOT_NONE);
	ck_assert_uint_eq(a.admitted_pages, n);
	ck_assert_int_eq(l3kv_release(r1.k, a.lease), 0);
	/* The pulls land anyway, and stay unverified. */
	ck_assert_int_eq(test_stat_wait(pt_d[1].sock, "dram", "writing", 0), 0);
	ck_assert_int_gt(test_stat(pt_d[1].sock, "dram", "unverified"), 100);
	ck_assert_double_eq(pt_metric(1, "l3kv_dram_unverified_objects", NULL),
	    (double)test_stat(pt_d[1].sock, "dram", "unverified"));
	for (i = 0; i < n; i++) {
		test_page_hash(49, i, h);
		ck_assert_int_eq(l3kv_debug(pub.k, L3KV_DEBUG_DROP, 0, h), 0);
	}
	pt_reload(0, 2);
	ck_assert(pt_wait_state(0, 2, "absent"));
	before = pt_probe_each(&pub, 49, n);
	/* n1 restores the prefix: every pulled copy read whole, and so servable. */
	ck_assert_uint_eq(pt_honest(&r1, 2, 49, n), n);
	ck_assert_int_eq(test_stat(pt_d[1].sock, "dram", "unverified"), 0);
	ck_assert_double_eq(pt_metric(1, "l3kv_dram_unverified_objects", NULL), 0);
	after = pt_probe_each(&pub, 49, n);
	/* About a sixth of the pages: homed on n2 of three, then on n1 of two. */
	ck_assert_msg(after > before + 20, "n0 found %u pages before n1 restored, %u after",
	    before, after);
	ck_assert_int_eq(test_stat(pt_d[1].sock, "cache", "objects_lost"), 0);
	test_rank_fini(&r1);
	test_rank_fini(&pub);
}
END_TEST

/* A member dropped from the list (SIGHUP): its keys are misses; nothing false, nothing lost. */
START_TEST(test_membership_change_remaps_to_misses)
{
	struct test_rank	pub, r;
	uint32_t		before, after;

	pt_role(PT_N, NULL, NULL);
	pt_rank_big(&pub, 2);
	test_rank_publish_kv(&pub, 46, 0, PT_BIG, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[2].sock, "dram", "pins", 0), 0);
	test_rank_fini(&pub);
	pt_rank_big(&r, 1);
	/* PROBE only: a restore would leave every pulled page in n1's DRAM. */
	before = test_rank_probe(&r, 46, PT_BIG, NULL, NULL);
	ck_assert_uint_eq(before, PT_BIG);
	/* n1 forgets n2, the publisher: what was homed there, or stays there, is gone for n1. */
	pt_reload(1, 2);
	ck_assert(pt_wait_state(1, 2, "absent"));
	ck_assert_int_eq(test_stat(pt_d[1].sock, "peers", "members"), 2);
	/* Stripes n2 was home of (8 stripes of 3 members: some) are now homed where nobody has them. */
	after = pt_honest(&r, 2, 46, PT_BIG);
	ck_assert_uint_lt(after, before);
	ck_assert_int_eq(test_stat(pt_d[1].sock, "cache", "objects_lost"), 0);
	test_rank_fini(&r);
}
END_TEST

/* peer.replicas 2: every stripe on two homes; the publisher dies and nothing is missed. */
START_TEST(test_two_replicas_survive_a_member)
{
	struct test_rank	pub, r;

	pt_role(PT_N, "\"replicas\": 2", NULL);
	pt_rank_big(&pub, 0);
	test_rank_publish_kv(&pub, 47, 0, PT_BIG, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	test_rank_fini(&pub);
	pt_fault_kill_owner(NULL);
	ck_assert(pt_wait_state(1, 0, "down") || pt_wait_state(1, 0, "connecting"));
	pt_rank_big(&r, 1);
	/* Of any two homes out of three, n1 or n2 is one: all of it is still there. */
	ck_assert_uint_eq(pt_honest(&r, 1, 47, PT_BIG), PT_BIG);
	test_rank_fini(&r);
}
END_TEST

/* ------------------------------------------------------------------ etcd */

static void
pt_setup_etcd(void)
{
	char	why[256];

	ck_assert_msg(test_etcd_init(&pt_etcd, why, sizeof(why)) == 0, "etcd: %s", why);
	pt_use_etcd = 1;
}

static void
pt_teardown_etcd(void)
{
	pt_teardown();
	test_etcd_fini(&pt_etcd);
	pt_use_etcd = pt_etcd_static = 0;
}

static const char *
pt_membership(unsigned i, char *buf, size_t len)
{
	json_t	*j = test_stats(pt_d[i].sock);

	ck_assert_ptr_nonnull(j);
	snprintf(buf, len, "%s", json_string_value(json_object_get(json_object_get(j, "peers"),
	    "membership")));
	json_decref(j);
	return buf;
}

/*
 * n0 publishes 48 pages; n1 and n2 restore every one byte for byte
 * (pulled, or offered to them as homes).
 */
static void
pt_publish_restore_everywhere(uint32_t prefix)
{
	struct test_rank	pub, r;
	unsigned		i;
	long long		pulled = 0;

	pt_rank(&pub, 0);
	test_rank_publish_kv(&pub, prefix, 0, 48, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	for (i = 1; i < PT_N; i++) {
		pt_rank(&r, i);
		ck_assert_uint_eq(pt_honest(&r, 1, prefix, 48), 48);
		ck_assert_int_eq(test_stat(pt_d[i].sock, "cache", "objects_lost"), 0);
		pulled += pt_hits_peer(i);
		test_rank_fini(&r);
	}
	ck_assert_int_gt(pulled, 0);
	test_rank_fini(&pub);
}

/* No static list: three daemons find each other through etcd and restore across nodes. */
START_TEST(test_etcd_daemons_find_each_other)
{
	char		buf[64];
	unsigned	i;

	pt_role(PT_N, NULL, NULL);
	for (i = 0; i < PT_N; i++) {
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "members"), PT_N);
		ck_assert_str_eq(pt_membership(i, buf, sizeof(buf)), "etcd");
		ck_assert_int_gt(test_stat(pt_d[i].sock, "peers", "etcd_views"), 0);
	}
	pt_publish_restore_everywhere(61);
}
END_TEST

/* etcd SIGKILLed: the last view stands (past the leases' TTL) and restores go on. */
START_TEST(test_etcd_stopped_keeps_the_view)
{
	char		buf[32];
	unsigned	i, j;

	pt_role(PT_N, NULL, NULL);
	test_etcd_stop(&pt_etcd);
	/* Twice the TTL: had the view followed etcd's leases, it would be empty by now. */
	usleep(4500 * 1000);
	for (i = 0; i < PT_N; i++) {
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "members"), PT_N);
		for (j = 0; j < PT_N; j++)
			if (i != j)
				ck_assert_str_eq(pt_state(i, j, buf, sizeof(buf)), "up");
	}
	pt_publish_restore_everywhere(62);
}
END_TEST

/*
 * A member SIGKILLed (its lease not revoked) leaves the others' view
 * after its TTL, which a static list never does; the stripes it was home
 * of become honest misses, never wrong bytes.
 */
START_TEST(test_etcd_member_gone_after_ttl)
{
	struct test_rank	pub, r;
	char			buf[32];
	uint32_t		before, after;
	int			status;

	pt_role(PT_N, NULL, NULL);
	pt_rank_big(&pub, 2);
	test_rank_publish_kv(&pub, 63, 0, PT_BIG, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[2].sock, "dram", "pins", 0), 0);
	test_rank_fini(&pub);
	pt_rank_big(&r, 1);
	before = test_rank_probe(&r, 63, PT_BIG, NULL, NULL);
	ck_assert_uint_eq(before, PT_BIG);
	pt_up[2] = 0;
	(void)test_daemon_stop(&pt_d[2], SIGKILL, &status);
	/* The TTL is 2 s; etcd expires leases a little late. */
	ck_assert(pt_wait_state(1, 2, "absent"));
	ck_assert_str_eq(pt_state(0, 2, buf, sizeof(buf)), "absent");
	ck_assert_int_eq(test_stat(pt_d[1].sock, "peers", "members"), 2);
	after = pt_honest(&r, 2, 63, PT_BIG);
	ck_assert_uint_lt(after, before);
	ck_assert_int_eq(test_stat(pt_d[1].sock, "cache", "objects_lost"), 0);
	test_rank_fini(&r);
}
END_TEST

/*
 * peer.members with etcd: the view while etcd has not answered (it is
 * down when the daemons start); once etcd is back, its view replaces it,
 * and a reloaded static list no longer does.
 */
START_TEST(test_etcd_static_list_until_etcd_answers)
{
	char		buf[64], why[256];
	unsigned	i;

	pt_etcd_static = 1;
	test_etcd_stop(&pt_etcd);
	pt_role(PT_N, NULL, NULL);
	for (i = 0; i < PT_N; i++) {
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "members"), PT_N);
		ck_assert_str_eq(pt_membership(i, buf, sizeof(buf)), "static, etcd not answered yet");
	}
	pt_publish_restore_everywhere(64);
	/* etcd back (same data): every daemon registers again and takes etcd's view. */
	ck_assert_msg(test_etcd_start(&pt_etcd, 0, why, sizeof(why)) == 0, "etcd: %s", why);
	for (i = 0; i < PT_N; i++) {
		/* its first view may come before every member registered again */
		for (int t = 0; t < 1000 && (strcmp(pt_membership(i, buf, sizeof(buf)), "etcd") != 0 ||
		    test_stat(pt_d[i].sock, "peers", "members") != PT_N); t++)
			usleep(10000);
		ck_assert_str_eq(pt_membership(i, buf, sizeof(buf)), "etcd");
		ck_assert_int_eq(test_stat(pt_d[i].sock, "peers", "members"), PT_N);
	}
	/* n1's static list shrinks to n0 and n1 and is reloaded: etcd's view (all three) stands. */
	pt_reload(1, 2);
	for (int t = 0; t < 500 && !test_daemon_log_has(&pt_d[1], "etcd's view stands"); t++)
		usleep(10000);
	ck_assert(test_daemon_log_has(&pt_d[1], "etcd's view stands"));
	ck_assert_int_eq(test_stat(pt_d[1].sock, "peers", "members"), PT_N);
	/*
	 * n2 may have left etcd's view and come back while the daemons
	 * registered again (its channel then reconnects): up within the wait.
	 * It failed once in make check as an instant check ("down").
	 */
	ck_assert_msg(pt_wait_state(1, 2, "up"), "n1 sees n2 %s", pt_state(1, 2, buf, sizeof(buf)));
}
END_TEST

/* ------------------------------------------------------------------ netns, sockets */

static void
pt_setup_netns(void)
{
	ck_assert_int_eq(test_netns_up(pt_ns, PT_N), 0);
}

static void
pt_teardown_netns(void)
{
	pt_teardown();
	ck_assert_int_eq(test_netns_down(pt_ns), 0);
	pt_ns[0] = '\0';
}

/* Three nodes on a bridge: restores byte for byte of what another node published. */
START_TEST(test_netns_restore_across_nodes)
{
	struct test_rank	pub, r;
	unsigned		i;

	pt_role(PT_N, NULL, NULL);
	pt_rank_big(&pub, 0);
	test_rank_publish_kv(&pub, 51, 0, PT_BIG, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	for (i = 1; i < PT_N; i++) {
		pt_rank_big(&r, i);
		ck_assert_uint_eq(pt_honest(&r, 1, 51, PT_BIG), PT_BIG);
		ck_assert_int_gt(pt_hits_peer(i), 0);
		test_rank_fini(&r);
	}
	test_rank_fini(&pub);
}
END_TEST

static void
pt_fault_link_down(void *arg)
{
	(void)arg;
	ck_assert_int_eq(test_netns_link(pt_ns, 1, 0), 0);
}

/* The owner's node is cut off the bridge while the pulls wait: lost; then honest misses. */
START_TEST(test_netns_link_down_mid_pull)
{
	struct test_rank	pub, r;

	pt_pick_port();
	pt_start(0, 2, NULL, NULL);
	pt_start(1, 2, "\"pull_timeout_ms\": 1000", "\"peer_pull_delay_ms\": 1000");
	pt_wait_mesh(2);
	pt_rank_big(&pub, 0);
	test_rank_publish_kv(&pub, 52, 0, PT_BIG, 0, NULL);
	ck_assert_int_eq(test_stat_wait(pt_d[0].sock, "dram", "pins", 0), 0);
	pt_rank_big(&r, 1);
	pt_restore_lost(&r, 52, PT_BIG, pt_fault_link_down, NULL);
	ck_assert_int_gt(pt_failures(1, "stale") + pt_failures(1, "io") +
	    pt_failures(1, "timeout"), 0);
	/* Cut off: what n1 holds itself only, and exactly that. */
	ck_assert_uint_lt(pt_honest(&r, 2, 52, PT_BIG), PT_BIG);
	/* Back on the bridge: the owner is found again and everything restores. */
	ck_assert_int_eq(test_netns_link(pt_ns, 1, 1), 0);
	ck_assert(pt_wait_state(1, 0, "up"));
	ck_assert_uint_eq(pt_honest(&r, 3, 52, PT_BIG), PT_BIG);
	test_rank_fini(&r);
	test_rank_fini(&pub);
}
END_TEST

static void
pt_setup_sockets(void)
{
	pt_provider = "sockets";
}

static void
pt_teardown_sockets(void)
{
	pt_teardown();
	pt_provider = "tcp";
}

/* Why provider prov cannot open here (in a child: a provider may leave threads), or NULL. */
static const char *
pt_provider_reason(const char *prov)
{
	static char	why[320];
	int		p[2], st = 0;
	ssize_t		n;
	pid_t		pid;

	if (pipe(p) != 0 || (pid = fork()) < 0)
		return "fork failed";
	if (pid == 0) {
		struct event_base	*b = event_base_new();
		struct fabric		*f;
		char			 err[300] = "";

		close(p[0]);
		log_init(LOG_LEVEL_ERROR);
		if (fabric_open(b, prov, "127.0.0.1", 1, &f, err, sizeof(err)) == 0)
			fabric_close(f);
		if (write(p[1], err, strlen(err)) < 0)
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	n = read(p[0], why, sizeof(why) - 1);
	close(p[0]);
	waitpid(pid, &st, 0);
	if (n < 0 || !WIFEXITED(st))
		return "the provider probe died";
	why[n] = '\0';
	return n > 0 ? why : NULL;
}

Suite *
suite_peer(void)
{
	Suite		*s = suite_create("peer");
	const char	*why;
	TCase		*tc;

	tc = test_tcase(s, "placement", 0, NULL, NULL);
	tcase_add_test(tc, test_hrw_is_stable_and_order_free);
	tcase_add_test(tc, test_hrw_spreads_keys);
	tcase_add_test(tc, test_hrw_remaps_minimally);
	tcase_add_test(tc, test_stripe_pages_share_a_home);
	tc = test_tcase(s, "channel", 60, NULL, pt_teardown);
	tcase_add_test(tc, test_three_daemons_connect);
	tcase_add_test(tc, test_l3kvctl_shows_the_peers);
	tcase_add_test(tc, test_stranger_is_refused);
	tcase_add_test(tc, test_member_id_from_another_address_is_refused);
	tcase_add_test(tc, test_member_by_name_or_wildcard_is_checked_so);
	tcase_add_test(tc, test_member_by_name_resolves_without_blocking);
	tcase_add_test(tc, test_dialler_is_up_only_once_its_auth_is_taken);
	tcase_add_test(tc, test_secret_is_checked);
	tcase_add_test(tc, test_unproved_hello_changes_nothing_of_the_member);
	tcase_add_test(tc, test_hostile_peer_bytes_are_refused);
	tc = test_tcase(s, "restore", 60, NULL, pt_teardown);
	tcase_add_test(tc, test_restore_objects_published_elsewhere);
	tcase_add_test(tc, test_lanes_between_daemons);
	tcase_add_test(tc, test_probe_changes_nothing_anywhere);
	tcase_add_test(tc, test_probe_waiting_for_peers_is_answered_at_detach);
	tcase_add_test(tc, test_hybrid_pools_restore_elsewhere);
	tcase_add_test(tc, test_dcp_shards_restore_from_their_homes);
	tc = test_tcase(s, "faults", 90, NULL, pt_teardown);
	tcase_add_test(tc, test_owner_killed_mid_pull);
	tcase_add_test(tc, test_owner_restarted_mid_pull);
	tcase_add_test(tc, test_bad_key_is_refused_before_any_read);
	tcase_add_test(tc, test_owner_lease_expiry_is_caught);
	tcase_add_test(tc, test_200_concurrent_pulls);
	tcase_add_test(tc, test_membership_change_remaps_to_misses);
	tcase_add_test(tc, test_pulled_copies_are_served_only_once_restored);
	tcase_add_test(tc, test_two_replicas_survive_a_member);
	/* The error paths again on the sockets provider (a restarted owner's reused keys). */
	if ((why = pt_provider_reason("sockets")) != NULL) {
		printf("SKIPPED tcase peer/sockets: %s\n", why);
		test_skipped++;
	} else {
		tc = test_tcase(s, "sockets", 90, pt_setup_sockets, pt_teardown_sockets);
		tcase_add_test(tc, test_restore_objects_published_elsewhere);
		tcase_add_test(tc, test_owner_killed_mid_pull);
		tcase_add_test(tc, test_owner_restarted_mid_pull);
		tcase_add_test(tc, test_bad_key_is_refused_before_any_read);
		tcase_add_test(tc, test_owner_lease_expiry_is_caught);
	}
	{
		char	ewhy[256];

		if ((why = pt_provider_reason("tcp")) == NULL && test_etcd_reason(ewhy,
		    sizeof(ewhy)) != 0)
			why = ewhy;
		if (why != NULL) {
			printf("SKIPPED tcase peer/etcd: %s\n", why);
			test_skipped++;
		} else {
			tc = test_tcase(s, "etcd", 90, pt_setup_etcd, pt_teardown_etcd);
			tcase_add_test(tc, test_etcd_daemons_find_each_other);
			tcase_add_test(tc, test_etcd_stopped_keeps_the_view);
			tcase_add_test(tc, test_etcd_member_gone_after_ttl);
			tcase_add_test(tc, test_etcd_static_list_until_etcd_answers);
		}
	}
	if ((why = test_netns_reason()) != NULL) {
		printf("SKIPPED tcase peer/netns: %s\n", why);
		test_skipped++;
	} else if ((why = pt_provider_reason("tcp")) != NULL) {
		printf("SKIPPED tcase peer/netns: %s\n", why);
		test_skipped++;
	} else {
		tc = test_tcase(s, "netns", 120, pt_setup_netns, pt_teardown_netns);
		tcase_add_test(tc, test_netns_restore_across_nodes);
		tcase_add_test(tc, test_netns_link_down_mid_pull);
	}
	return s;
}
