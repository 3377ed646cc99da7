/*
 * etcd.c against a real etcd (Debian's etcd-server) on loopback: a data
 * directory from mkdtemp, random client and peer ports. Members register,
 * see each other, vanish when their process dies (after the lease TTL) or
 * closes (at once: the lease is revoked); etcd stopped keeps the last view
 * (the callback is not called at all); etcd back with an empty data
 * directory gets every member again from their re-registration. Hostile
 * entries under the prefix are skipped. Where etcd cannot start the
 * tcase is printed SKIPPED with the reason.
 */
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <netinet/in.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"
#include "tests.h"

#define ET_TTL		2
#define ET_PREFIX	"/l3kv/test/decode"

struct et_view {
	int			calls;
	size_t			n;
	struct peer_member	m[16];
};

static struct test_etcd	 et_srv;
static struct event_base *et_base;

static long long
et_ms(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
et_view_cb(void *arg, const struct peer_member *m, size_t n)
{
	struct et_view	*v = arg;

	v->calls++;
	v->n = n < 16 ? n : 16;
	if (v->n > 0)
		memcpy(v->m, m, v->n * sizeof(*m));
}

/* Runs the loop until the view has n members (and at least calls calls), or ms pass. */
static int
et_wait_n(const struct et_view *v, size_t n, int calls, int ms)
{
	long long	end = et_ms() + ms;
	struct timeval	tv = { 0, 50000 };

	while ((v->n != n || v->calls < calls) && et_ms() < end) {
		event_base_loopexit(et_base, &tv);
		event_base_dispatch(et_base);
	}
	return v->n == n && v->calls >= calls;
}

static void
et_spin(int ms)
{
	static const struct et_view	never = { 0, 99, { { "", "" } } };

	et_wait_n(&never, 0, 0, ms);
}

static void
et_setup(void)
{
	char	why[256];

	log_init(LOG_LEVEL_ERROR);
	ck_assert_msg(test_etcd_init(&et_srv, why, sizeof(why)) == 0, "etcd: %s", why);
	ck_assert_ptr_nonnull(et_base = event_base_new());
}

static void
et_teardown(void)
{
	event_base_free(et_base);
	et_base = NULL;
	test_etcd_fini(&et_srv);
}

static struct etcd *
et_open_ttl(const char *id, const char *addr, unsigned ttl, struct et_view *v)
{
	struct peer_member	self;
	struct etcd		*e;
	char			err[256] = "";

	memset(&self, 0, sizeof(self));
	snprintf(self.id, sizeof(self.id), "%s", id);
	snprintf(self.addr, sizeof(self.addr), "%s", addr);
	ck_assert_msg(etcd_open(et_base, NULL, et_srv.endpoint, ET_PREFIX, &self, ttl, et_view_cb, v,
	    &e, err, sizeof(err)) == 0, "etcd_open: %s", err);
	return e;
}

static struct etcd *
et_open(const char *id, const char *addr, struct et_view *v)
{
	return et_open_ttl(id, addr, ET_TTL, v);
}

static int
et_has(const struct et_view *v, const char *id, const char *addr)
{
	size_t	i;

	for (i = 0; i < v->n; i++)
		if (strcmp(v->m[i].id, id) == 0 && strcmp(v->m[i].addr, addr) == 0)
			return 1;
	return 0;
}

/* base64 of s, for the entries a test puts by hand. */
static void
et_b64(const char *s, char *out)
{
	static const char	t[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t			n = strlen(s), i;
	uint32_t		v;

	for (i = 0; i + 2 < n; i += 3) {
		v = (uint32_t)(uint8_t)s[i] << 16 | (uint32_t)(uint8_t)s[i + 1] << 8 | (uint8_t)s[i + 2];
		*out++ = t[v >> 18];
		*out++ = t[(v >> 12) & 63];
		*out++ = t[(v >> 6) & 63];
		*out++ = t[v & 63];
	}
	if (i < n) {
		v = (uint32_t)(uint8_t)s[i] << 16 | (i + 1 < n ? (uint32_t)(uint8_t)s[i + 1] << 8 : 0);
		*out++ = t[v >> 18];
		*out++ = t[(v >> 12) & 63];
		*out++ = i + 1 < n ? t[(v >> 6) & 63] : '=';
		*out++ = '=';
	}
	*out = '\0';
}

static void
et_put(const char *key, const char *value)
{
	char	k[512], v[512], body[1200];

	et_b64(key, k);
	et_b64(value, v);
	snprintf(body, sizeof(body), "{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
	ck_assert_int_eq(test_etcd_http(&et_srv, "/v3/kv/put", body, NULL, 0), 200);
}

static void
et_del(const char *key)
{
	char	k[512], body[600];

	et_b64(key, k);
	snprintf(body, sizeof(body), "{\"key\":\"%s\"}", k);
	ck_assert_int_eq(test_etcd_http(&et_srv, "/v3/kv/deleterange", body, NULL, 0), 200);
}

START_TEST(test_etcd_members_see_each_other)
{
	struct et_view	va, vb;
	struct etcd	*a, *b;
	int		calls;

	memset(&va, 0, sizeof(va));
	memset(&vb, 0, sizeof(vb));
	/* A long TTL, so that a member gone within seconds was revoked, not expired. */
	a = et_open_ttl("node-a", "127.0.0.1:7001", 30, &va);
	b = et_open_ttl("node-b", "127.0.0.1:7002", 30, &vb);
	ck_assert(et_wait_n(&va, 2, 1, 10000));
	ck_assert(et_wait_n(&vb, 2, 1, 10000));
	ck_assert_str_eq(va.m[0].id, "node-a");		/* sorted by id */
	ck_assert(et_has(&va, "node-a", "127.0.0.1:7001") && et_has(&va, "node-b", "127.0.0.1:7002"));
	ck_assert(et_has(&vb, "node-a", "127.0.0.1:7001") && et_has(&vb, "node-b", "127.0.0.1:7002"));
	/* Hostile entries under the prefix are skipped: the view does not change. */
	calls = va.calls;
	et_put(ET_PREFIX "/evil", "not json");
	et_put(ET_PREFIX "/liar", "{\"id\":\"node-a\",\"addr\":\"6.6.6.6:1\"}");
	et_put(ET_PREFIX "/sub/dir", "{\"id\":\"sub/dir\",\"addr\":\"1.1.1.1:1\"}");
	et_put(ET_PREFIX "/noaddr", "{\"id\":\"noaddr\"}");
	et_put(ET_PREFIX "/big", "{\"id\":\"big\",\"addr\":\"0123456789012345678901234567890123456789"
	    "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234"
	    "56789\"}");
	et_put(ET_PREFIX "x/other", "{\"id\":\"other\",\"addr\":\"1.1.1.1:1\"}");
	et_spin(500);
	ck_assert_uint_eq(va.n, 2);
	ck_assert_int_eq(va.calls, calls);
	ck_assert(et_has(&va, "node-a", "127.0.0.1:7001"));
	/* A member put by hand arrives through the watch; its delete takes it away. */
	et_put(ET_PREFIX "/node-c", "{\"id\":\"node-c\",\"addr\":\"127.0.0.1:7003\"}");
	ck_assert(et_wait_n(&va, 3, calls + 1, 5000));
	ck_assert(et_has(&va, "node-c", "127.0.0.1:7003"));
	ck_assert(et_wait_n(&vb, 3, 1, 5000));
	et_del(ET_PREFIX "/node-c");
	ck_assert(et_wait_n(&va, 2, calls + 2, 5000));
	ck_assert(!et_has(&va, "node-c", "127.0.0.1:7003"));
	/* A member that closes revokes its lease: gone well before its TTL. */
	etcd_close(b);
	ck_assert(et_wait_n(&va, 1, calls + 3, 10000));
	ck_assert_str_eq(va.m[0].id, "node-a");
	etcd_close(a);
}
END_TEST

/* A member whose process dies (no revoke) disappears when its lease runs out. */
START_TEST(test_etcd_member_gone_after_ttl)
{
	struct et_view	va;
	struct etcd	*a;
	long long	t0, dt;
	pid_t		pid;
	int		st;

	memset(&va, 0, sizeof(va));
	if ((pid = fork()) == 0) {
		struct et_view	vb;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		event_reinit(et_base);
		memset(&vb, 0, sizeof(vb));
		(void)et_open("node-b", "127.0.0.1:7002", &vb);
		event_base_dispatch(et_base);
		_exit(0);
	}
	ck_assert_int_gt(pid, 0);
	a = et_open("node-a", "127.0.0.1:7001", &va);
	ck_assert(et_wait_n(&va, 2, 1, 10000));
	et_spin(ET_TTL * 1000);		/* B's keepalives hold it there */
	ck_assert_uint_eq(va.n, 2);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	t0 = et_ms();
	ck_assert(et_wait_n(&va, 1, 1, ET_TTL * 1000 + 5000));
	dt = et_ms() - t0;
	ck_assert_str_eq(va.m[0].id, "node-a");
	/* Not before its last keepalive's lease ran out: at least TTL - TTL/3. */
	ck_assert_msg(dt >= ET_TTL * 1000 * 2 / 3 - 200, "gone after %lld ms", dt);
	etcd_close(a);
}
END_TEST

/* etcd gone: the last view stays and the callback is not called; back (empty): re-registration. */
START_TEST(test_etcd_stopped_keeps_view_restarted_reregisters)
{
	struct et_view	va, vb;
	struct etcd	*a, *b;
	char		why[256];
	int		ca, cb;

	memset(&va, 0, sizeof(va));
	memset(&vb, 0, sizeof(vb));
	a = et_open("node-a", "127.0.0.1:7001", &va);
	b = et_open("node-b", "127.0.0.1:7002", &vb);
	ck_assert(et_wait_n(&va, 2, 1, 10000));
	ck_assert(et_wait_n(&vb, 2, 1, 10000));
	ca = va.calls;
	cb = vb.calls;
	test_etcd_stop(&et_srv);
	et_spin(ET_TTL * 3 * 1000);
	ck_assert_int_eq(va.calls, ca);
	ck_assert_int_eq(vb.calls, cb);
	ck_assert_uint_eq(va.n, 2);
	ck_assert(et_has(&va, "node-b", "127.0.0.1:7002"));
	/* A fresh etcd knows nobody: each member must register again to be seen. */
	ck_assert_msg(test_etcd_start(&et_srv, 1, why, sizeof(why)) == 0, "etcd restart: %s", why);
	ck_assert(et_wait_n(&va, 2, ca + 1, 20000));
	ck_assert(et_wait_n(&vb, 2, cb + 1, 20000));
	ck_assert(et_has(&va, "node-b", "127.0.0.1:7002") && et_has(&vb, "node-a", "127.0.0.1:7001"));
	etcd_close(a);
	etcd_close(b);
}
END_TEST

START_TEST(test_etcd_open_refuses_bad_arguments)
{
	struct peer_member	self = { "node-a", "127.0.0.1:7001" }, bad = { "a/b", "x:1" };
	struct et_view		v;
	struct etcd		*e;
	char			err[256];

	memset(&v, 0, sizeof(v));
	ck_assert_int_eq(etcd_open(et_base, NULL, "https://127.0.0.1:1", ET_PREFIX, &self, 5, et_view_cb,
	    &v, &e, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(etcd_open(et_base, NULL, "http://127.0.0.1", ET_PREFIX, &self, 5, et_view_cb,
	    &v, &e, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(etcd_open(et_base, NULL, "http://127.0.0.1:99999", ET_PREFIX, &self, 5,
	    et_view_cb, &v, &e, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(etcd_open(et_base, NULL, et_srv.endpoint, "relative", &self, 5, et_view_cb, &v,
	    &e, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(etcd_open(et_base, NULL, et_srv.endpoint, ET_PREFIX, &bad, 5, et_view_cb, &v,
	    &e, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(etcd_open(et_base, NULL, et_srv.endpoint, ET_PREFIX, &self, 1, et_view_cb, &v,
	    &e, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(e);
	/* Nothing listening: no view, no callback, and closing it is clean. */
	ck_assert_int_eq(etcd_open(et_base, NULL, "http://127.0.0.1:1", ET_PREFIX, &self, 5, et_view_cb,
	    &v, &e, err, sizeof(err)), 0);
	et_spin(700);
	ck_assert_int_eq(v.calls, 0);
	etcd_close(e);
}
END_TEST

Suite *
suite_etcd(void)
{
	Suite	*s = suite_create("etcd");
	TCase	*tc;
	char	 why[256];

	if (test_etcd_reason(why, sizeof(why)) != 0) {
		printf("SKIPPED tcase etcd/etcd: %s\n", why);
		test_skipped++;
		return s;
	}
	tc = test_tcase(s, "etcd", 90, et_setup, et_teardown);
	tcase_add_test(tc, test_etcd_members_see_each_other);
	tcase_add_test(tc, test_etcd_member_gone_after_ttl);
	tcase_add_test(tc, test_etcd_stopped_keeps_view_restarted_reregisters);
	tcase_add_test(tc, test_etcd_open_refuses_bad_arguments);
	return s;
}
