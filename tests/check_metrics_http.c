/*
 * metrics.listen end to end (daemon/httpd.c, daemon/prom.c): a real l3kvd
 * serving on a loopback port, its counters moved through libl3kv by a
 * test engine rank, /metrics read back over plain HTTP.
 *
 * Suite metrics_http: the values that moved (publishes, restores,
 * declines by reason, the histograms, the SGLang counterparts) and their
 * agreement with STATS; /health and /ready (503 while the file tier is
 * down and while the daemon drains); hostile HTTP (huge headers, POST,
 * unknown paths, a partial request left open, more connections than the
 * cap) answered or closed while the engine socket goes on serving.
 *
 * Suite metrics_prom (runs where Debian's prometheus package is, which
 * `make deps` installs; skipped with the reason elsewhere): promtool's
 * check of the exposition, a real Prometheus server scraping the daemon
 * every second and queried through its HTTP API for the counters the
 * test moved, and every expression of the Grafana dashboard
 * (config/grafana-l3kv.json) naming metrics the exposition has.
 */
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"
#include "tests.h"

#define PAGES		32
#define LAYERS		2
#define PAGE_TOKENS	8
#define TOKEN_BYTES	64
#define PAGE_BYTES	(PAGE_TOKENS * LAYERS * TOKEN_BYTES)

static const struct test_rank_kv	kv = { "metrics-test", "latent:64:fp8_e4m3", L3KV_ATTN_MLA,
    PAGES, PAGE_TOKENS, LAYERS, TOKEN_BYTES };

static uint16_t	http_port;	/* the daemon's metrics.listen port */
static char	file_dir[PATH_MAX];	/* a file tier's root is file_dir/file */

/* A loopback TCP port free now (bound to 0, read back, closed). */
static uint16_t
free_port(void)
{
	struct sockaddr_in	sin;
	socklen_t		len = sizeof(sin);
	int			fd;

	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
	close(fd);
	return ntohs(sin.sin_port);
}

/* Starts test_td with metrics.listen on a free loopback port, plus extra (or NULL). */
static void
start_with(const char *extra)
{
	char	cfg[1024];

	http_port = free_port();
	snprintf(cfg, sizeof(cfg), "{\"metrics\": {\"listen\": \"127.0.0.1:%u\"}%s%s}",
	    (unsigned)http_port, extra != NULL ? ", " : "", extra != NULL ? extra : "");
	test_td_setup_with(cfg);
}

static void
setup(void)
{
	start_with("\"tiers\": {\"dram\": {\"size\": \"8 MiB\"}}");
}

static void
teardown(void)
{
	test_td_teardown();
}

static int
tcp_connect(uint16_t port)
{
	struct sockaddr_in	sin;
	int			fd;

	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_msg(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0, "connect %u: %s",
	    (unsigned)port, strerror(errno));
	return fd;
}

/* Reads fd to EOF (up to timeout_ms): a NUL-terminated malloc'd string; *eof 1 if it ended. */
static char *
read_all(int fd, int timeout_ms, int *eof)
{
	struct pollfd	pfd = { fd, POLLIN, 0 };
	size_t		n = 0, cap = 1 << 16;
	char		*buf = malloc(cap), *nb;
	ssize_t		r;

	ck_assert_ptr_nonnull(buf);
	*eof = 0;
	for (;;) {
		if (poll(&pfd, 1, timeout_ms) <= 0)
			break;
		if (n + 1 >= cap) {
			ck_assert_ptr_nonnull(nb = realloc(buf, cap * 2));
			buf = nb;
			cap *= 2;
		}
		r = read(fd, buf + n, cap - n - 1);
		if (r <= 0) {
			*eof = 1;
			break;
		}
		n += (size_t)r;
	}
	buf[n] = '\0';
	return buf;
}

/* Sends a raw request to port; returns the whole response (malloc'd), *code its status. */
static char *
http_raw(uint16_t port, const char *req, size_t len, int *code)
{
	char	*resp;
	int	 fd, eof;

	fd = tcp_connect(port);
	ck_assert_int_eq(write(fd, req, len), (ssize_t)len);
	resp = read_all(fd, 10000, &eof);
	close(fd);
	ck_assert_msg(eof, "no end of the response to %.40s", req);
	*code = 0;
	if (sscanf(resp, "HTTP/1.%*d %d", code) != 1)
		*code = 0;
	return resp;
}

/* GET (or another method) path on port: the body (malloc'd), *code the status. */
static char *
http_req(uint16_t port, const char *method, const char *path, int *code)
{
	char	req[1024], *resp, *body;

	snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
	    method, path);
	resp = http_raw(port, req, strlen(req), code);
	body = strstr(resp, "\r\n\r\n");
	body = strdup(body != NULL ? body + 4 : "");
	free(resp);
	return body;
}

static char *
get(const char *path, int *code)
{
	return http_req(http_port, "GET", path, code);
}

/* /metrics, which must answer 200. */
static char *
scrape(void)
{
	char	*b;
	int	 code;

	b = get("/metrics", &code);
	ck_assert_int_eq(code, 200);
	return b;
}

/*
 * The sum of the samples of name whose labels include every `k="v"` of
 * want ("" for any); -1 when no sample matches.
 */
static double
value(const char *text, const char *name, const char *want)
{
	const char	*line, *end, *sp, *w, *c;
	char		 pair[256];
	double		 sum = -1;
	size_t		 nl = strlen(name), plen;
	int		 ok;

	for (line = text; *line != '\0'; line = *end != '\0' ? end + 1 : end) {
		end = strchr(line, '\n');
		if (end == NULL)
			end = line + strlen(line);
		if (*line == '#' || strncmp(line, name, nl) != 0 || (line[nl] != '{' && line[nl] != ' '))
			continue;
		ok = 1;
		for (w = want; ok && *w != '\0'; w = *c != '\0' ? c + 1 : c) {
			c = strchr(w, ',');
			/* A comma inside a quoted value is not one here: the tests' values have none. */
			if (c == NULL)
				c = w + strlen(w);
			plen = (size_t)(c - w);
			ck_assert_uint_lt(plen, sizeof(pair));
			memcpy(pair, w, plen);
			pair[plen] = '\0';
			sp = strstr(line, pair);
			ok = sp != NULL && sp < end && (sp[-1] == '{' || sp[-1] == ',');
		}
		if (!ok)
			continue;
		sp = memchr(line, '}', (size_t)(end - line));
		sp = sp != NULL ? sp + 1 : line + nl;
		sum = (sum < 0 ? 0 : sum) + strtod(sp, NULL);
	}
	return sum;
}

static void
solo_attach(struct test_rank *r)
{
	test_rank_init(r, &kv, "g1", 1, 0);
	test_rank_attach(r, test_td.sock);
}

/*
 * The counters a test moves: 8 pages published, probed, 5 of them
 * admitted (reservation 5) and restored, then two declines (no
 * reservation, no hit).
 */
static void
move_counters(struct test_rank *r)
{
	struct l3kv_publish_result	pub;
	struct l3kv_restore_result	res;
	struct l3kv_admit_result	a;

	test_rank_publish_kv(r, 1, 0, 8, 0, &pub);
	ck_assert_uint_eq(pub.stored, 8);
	ck_assert_uint_eq(test_rank_probe(r, 1, 8, NULL, NULL), 8);
	a = test_rank_admit(r, 1, 1, 8, 5, L3KV_SLOT_NONE);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NONE);
	ck_assert_uint_eq(a.admitted_pages, 5);
	ck_assert_int_eq(test_rank_restore(r, a.lease, 16, 5, &res), 0);
	ck_assert_uint_eq(res.pages, 5);
	ck_assert_int_eq(l3kv_release(r->k, a.lease), 0);
	a = test_rank_admit(r, 2, 1, 8, 0, L3KV_SLOT_NONE);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NO_RESERVATION);
	a = test_rank_admit(r, 3, 99, 4, 4, L3KV_SLOT_NONE);
	ck_assert_int_eq(a.decline, L3KV_DECLINE_NO_HIT);
}

START_TEST(test_metrics_count_what_moved)
{
	struct test_rank	 r;
	char			*m, want[256], addr[64];
	json_t			*st;

	solo_attach(&r);
	ck_assert_ptr_nonnull(st = test_td_stats());
	snprintf(want, sizeof(want), "namespace=\"%s\"", json_string_value(json_object_get(
	    json_array_get(json_object_get(st, "namespaces"), 0), "name")));
	json_decref(st);
	m = scrape();
	ck_assert_double_eq(value(m, "l3kv_published_pages_total", want), 0);
	free(m);
	move_counters(&r);
	m = scrape();
	ck_assert_double_eq(value(m, "l3kv_published_pages_total", "pool=\"kv\""), 8);
	ck_assert_double_eq(value(m, "l3kv_published_pages_total", want), 8);
	ck_assert_double_eq(value(m, "l3kv_published_bytes_total", "pool=\"kv\""), 8 * PAGE_BYTES);
	ck_assert_double_eq(value(m, "l3kv_backed_up_tokens_total", want), 8 * PAGE_TOKENS);
	ck_assert_double_eq(value(m, "l3kv_probes_total", want), 1);
	ck_assert_double_eq(value(m, "l3kv_admits_total", want), 3);
	ck_assert_double_eq(value(m, "l3kv_admitted_total", want), 1);
	ck_assert_double_eq(value(m, "l3kv_admitted_pages_total", want), 5);
	/* The group hit told: 8 (restore), 8 (declined for no reservation), 0 (no hit). */
	ck_assert_double_eq(value(m, "l3kv_admit_hit_pages_total", want), 16);
	ck_assert_double_eq(value(m, "l3kv_admit_declines_total", "reason=\"no_reservation\""), 1);
	ck_assert_double_eq(value(m, "l3kv_admit_declines_total", "reason=\"no_hit\""), 1);
	ck_assert_double_eq(value(m, "l3kv_admit_declines_total", "reason=\"group_timeout\""), 0);
	ck_assert_double_eq(value(m, "l3kv_unfulfilled_pages_total", "reason=\"reservation\""), 3);
	ck_assert_double_eq(value(m, "l3kv_unfulfilled_pages_total", "reason=\"declined\""), 8);
	ck_assert_double_eq(value(m, "l3kv_unfulfilled_pages_total", "reason=\"released\""), 0);
	ck_assert_double_eq(value(m, "l3kv_restores_total", want), 1);
	ck_assert_double_eq(value(m, "l3kv_restored_pages_total", "tier=\"dram\""), 5);
	ck_assert_double_eq(value(m, "l3kv_restored_pages_total", "tier=\"file\""), 0);
	ck_assert_double_eq(value(m, "l3kv_restored_pages_total", "tier=\"peer\""), 0);
	ck_assert_double_eq(value(m, "l3kv_restored_bytes_total", want), 5 * PAGE_BYTES);
	ck_assert_double_eq(value(m, "l3kv_prefetched_tokens_total", want), 5 * PAGE_TOKENS);
	ck_assert_double_eq(value(m, "l3kv_leases_open", ""), 0);
	/* The histograms: one observation per answer, in the right result. */
	ck_assert_double_eq(value(m, "l3kv_probe_duration_seconds_count", ""), 1);
	ck_assert_double_eq(value(m, "l3kv_admit_duration_seconds_count", "result=\"admitted\""), 1);
	ck_assert_double_eq(value(m, "l3kv_admit_duration_seconds_count", "result=\"declined\""), 2);
	ck_assert_double_eq(value(m, "l3kv_restore_duration_seconds_count", "result=\"ready\""), 1);
	ck_assert_double_eq(value(m, "l3kv_restore_duration_seconds_bucket",
	    "result=\"ready\",le=\"+Inf\""), 1);
	ck_assert_double_eq(value(m, "l3kv_publish_duration_seconds_count", "result=\"stored\""), 1);
	ck_assert(value(m, "l3kv_restore_duration_seconds_sum", "result=\"ready\"") > 0);
	ck_assert_double_eq(value(m, "l3kv_namespace_sessions", want), 1);
	ck_assert_double_eq(value(m, "l3kv_namespace_objects", "pool=\"kv\",tier=\"dram\""), 8);
	ck_assert_double_eq(value(m, "l3kv_sessions", ""), 1);
	/* The previous scrape's printing time: more than nothing, far less than a second. */
	ck_assert(value(m, "l3kv_http_scrape_seconds", "") > 0);
	ck_assert(value(m, "l3kv_http_scrape_seconds", "") < 1);
	ck_assert(strstr(m, "l3kv_info{role=\"decode\",version=\"") != NULL);
	/* The exposition and STATS agree. */
	ck_assert_ptr_nonnull(st = test_td_stats());
	ck_assert_double_eq(value(m, "l3kv_restored_pages_total", ""),
	    (double)test_td_stat("cache", "pages_restored"));
	ck_assert_double_eq(value(m, "l3kv_admitted_pages_total", ""),
	    (double)test_td_stat("cache", "admitted_pages"));
	ck_assert_double_eq(value(m, "l3kv_tier_objects", "tier=\"dram\""),
	    (double)test_td_stat("dram", "objects"));
	ck_assert_double_eq(value(m, "l3kv_tier_used_bytes", "tier=\"dram\""),
	    (double)test_td_stat("dram", "bytes_used"));
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)http_port);
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(st, "daemon"),
	    "metrics_listen")), addr);
	json_decref(st);
	free(m);
	/* A lease given back unrestored is counted unfulfilled as it ends. */
	{
		struct l3kv_admit_result a = test_rank_admit(&r, 4, 1, 8, 8, L3KV_SLOT_NONE);

		ck_assert_uint_eq(a.admitted_pages, 8);
		ck_assert_int_eq(l3kv_release(r.k, a.lease), 0);
	}
	m = scrape();
	ck_assert_double_eq(value(m, "l3kv_unfulfilled_pages_total", "reason=\"released\""), 8);
	free(m);
	test_rank_fini(&r);
}
END_TEST

/* A lease left to expire: counted as an expiry, and its pages as unfulfilled (expired). */
/* How many times needle occurs in text. */
static size_t
count_of(const char *text, const char *needle)
{
	size_t	n = 0;

	for (; (text = strstr(text, needle)) != NULL; text += strlen(needle))
		n++;
	return n;
}

static const char *const device_families[] = {
	"l3kv_copy_device_started", "l3kv_copy_device_regions", "l3kv_copy_device_jobs_inflight",
	"l3kv_copy_device_jobs_total", "l3kv_copy_device_restores_total",
	"l3kv_copy_device_publishes_total", "l3kv_copy_device_jobs_failed_total",
	"l3kv_copy_device_bytes_total", "l3kv_copy_device_staging_slots",
	"l3kv_copy_device_staging_slots_in_use", "l3kv_copy_device_waiting_on_events",
};

/* The STATS member of a copy.devices entry each device family reports. */
static const char *const device_keys[] = {
	"started", "regions", "jobs_inflight", "jobs", "restores", "publishes", "failed", "bytes",
	"staging_slots", "staging_in_use", "waiting_on_events",
};

/*
 * A series per cuda copy engine, labelled device, gpu and uuid as STATS
 * copy.devices and HEALTH device_uuids have them, each family declared
 * once; without a GPU (this host, unless it has one) no device series and
 * no device family at all, rather than families with no samples.
 */
START_TEST(test_device_series_follow_stats_copy_devices)
{
	struct l3kv	*k = NULL;
	json_t		*st, *devs, *d, *h, *v;
	char		*m, *text = NULL, labels[256], type[96];
	const char	*uuid;
	size_t		 i, f, n;

	ck_assert_ptr_nonnull(st = test_td_stats());
	devs = json_object_get(json_object_get(st, "copy"), "devices");
	ck_assert(json_is_array(devs));
	n = json_array_size(devs);
	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &k), 0);
	ck_assert_int_eq(l3kv_health(k, &text), 0);
	ck_assert_ptr_nonnull(h = json_loads(text, 0, NULL));
	ck_assert(json_is_array(json_object_get(h, "device_uuids")));
	ck_assert_uint_eq(json_array_size(json_object_get(h, "device_uuids")), n);
	m = scrape();
	if (n == 0) {
		ck_assert_msg(strstr(m, "l3kv_copy_device_") == NULL, "no GPU, but device metrics:\n%s",
		    strstr(m, "l3kv_copy_device_"));
		ck_assert(!json_is_true(json_object_get(json_object_get(st, "daemon"), "gpu")));
	}
	for (f = 0; n > 0 && f < sizeof(device_families) / sizeof(device_families[0]); f++) {
		snprintf(type, sizeof(type), "# TYPE %s ", device_families[f]);
		ck_assert_uint_eq(count_of(m, type), 1);
		snprintf(type, sizeof(type), "\n%s{", device_families[f]);
		ck_assert_uint_eq(count_of(m, type), n);
	}
	json_array_foreach(devs, i, d) {
		v = json_array_get(json_object_get(h, "device_uuids"), i);
		uuid = json_string_value(json_object_get(d, "uuid"));
		ck_assert(uuid != NULL ? json_is_string(v) && strcmp(json_string_value(v), uuid) == 0 :
		    json_is_null(v));
		snprintf(labels, sizeof(labels), "device=\"%zu\",gpu=\"%lld\",uuid=\"%s\"", i,
		    (long long)json_integer_value(json_object_get(d, "gpu")), uuid != NULL ? uuid : "");
		for (f = 0; f < sizeof(device_families) / sizeof(device_families[0]); f++) {
			v = json_object_get(d, device_keys[f]);
			ck_assert_msg(value(m, device_families[f], labels) ==
			    (json_is_boolean(v) ? (double)json_is_true(v) : (double)json_integer_value(v)),
			    "%s{%s}", device_families[f], labels);
		}
	}
	free(m);
	json_decref(h);
	l3kv_free(text);
	l3kv_close(k);
	json_decref(st);
}
END_TEST

START_TEST(test_an_expired_lease_counts_its_pages_unfulfilled)
{
	struct l3kv_publish_result	 pub;
	struct l3kv_admit_result	 a;
	struct test_rank		 r;
	char				*m = NULL;
	int				 i;

	solo_attach(&r);
	test_rank_publish_kv(&r, 1, 0, 4, 0, &pub);
	a = test_rank_admit(&r, 1, 1, 4, 4, L3KV_SLOT_NONE);
	ck_assert_uint_eq(a.admitted_pages, 4);
	ck_assert_uint_eq(a.ttl_ms, 100);
	/* It expires at the TTL; its tombstone goes (and is counted) one TTL later. */
	for (i = 0; i < 100; i++) {
		free(m);
		m = scrape();
		if (value(m, "l3kv_unfulfilled_pages_total", "reason=\"expired\"") == 4)
			break;
		usleep(20000);
	}
	ck_assert_double_eq(value(m, "l3kv_unfulfilled_pages_total", "reason=\"expired\""), 4);
	ck_assert_double_eq(value(m, "l3kv_lease_expiries_total", ""), 1);
	ck_assert_double_eq(value(m, "l3kv_leases_open", ""), 0);
	ck_assert_double_eq(value(m, "l3kv_unfulfilled_pages_total", "reason=\"released\""), 0);
	free(m);
	test_rank_fini(&r);
}
END_TEST

static void
setup_ttl(void)
{
	start_with("\"tiers\": {\"dram\": {\"size\": \"8 MiB\"}}, \"lease\": {\"ttl_ms\": 100}");
}

START_TEST(test_health_and_ready)
{
	char	*b;
	int	 code;

	b = get("/health", &code);
	ck_assert_int_eq(code, 200);
	ck_assert_str_eq(b, "ok\n");
	free(b);
	b = get("/ready", &code);
	ck_assert_int_eq(code, 200);
	ck_assert_str_eq(b, "ready\n");
	free(b);
	b = http_req(http_port, "HEAD", "/metrics", &code);
	ck_assert_int_eq(code, 200);
	ck_assert_str_eq(b, "");	/* HEAD: headers only */
	free(b);
}
END_TEST

static void	write_file(const char *path, const char *text);

#define TIER_DOWN	"tier file is down: the last write-through failed: "

/*
 * The file tier's root is replaced by a plain file under the daemon: its
 * writes fail, /ready says so; the directory back, the next write goes
 * through and /ready is 200 again.
 */
START_TEST(test_ready_503_while_the_file_tier_is_down)
{
	struct l3kv_publish_result	 pub;
	struct test_rank		 r;
	char				 root[PATH_MAX], *b, *m;
	int				 code, i;

	snprintf(root, sizeof(root), "%s/file", file_dir);
	solo_attach(&r);
	test_rank_publish_kv(&r, 1, 0, 2, 0, &pub);
	ck_assert_int_eq(test_td_stat_wait("file", "writes", 2), 2);
	b = get("/ready", &code);
	ck_assert_int_eq(code, 200);
	free(b);
	ck_assert_int_eq(test_rmtree(root), 0);
	write_file(root, "not a directory\n");
	test_rank_publish_kv(&r, 2, 0, 2, 4, &pub);
	ck_assert_uint_eq(pub.stored, 2);	/* DRAM keeps the promise */
	for (i = 0; i < 500 && test_td_stat("file", "write_failures") == 0; i++)
		usleep(10000);
	ck_assert_int_gt(test_td_stat("file", "write_failures"), 0);
	b = get("/ready", &code);
	ck_assert_int_eq(code, 503);
	ck_assert_msg(strncmp(b, TIER_DOWN, strlen(TIER_DOWN)) == 0 &&
	    strchr(b, '\n') == b + strlen(b) - 1, "%s", b);
	free(b);
	m = scrape();
	ck_assert_double_eq(value(m, "l3kv_ready", ""), 0);
	ck_assert(value(m, "l3kv_file_write_failures_total", "") > 0);
	free(m);
	b = get("/health", &code);
	ck_assert_int_eq(code, 200);	/* alive all the same */
	free(b);
	ck_assert_int_eq(unlink(root), 0);
	test_rank_publish_kv(&r, 3, 0, 2, 8, &pub);
	/* Both new pages written; a page of the failed batch may be written too, from the backlog. */
	for (i = 0; i < 500 && test_td_stat("file", "writes") < 4; i++)
		usleep(10000);
	ck_assert_int_ge(test_td_stat("file", "writes"), 4);
	b = get("/ready", &code);
	ck_assert_int_eq(code, 200);
	free(b);
	test_rank_fini(&r);
}
END_TEST

static void
setup_file(void)
{
	char	extra[PATH_MAX + 128];

	ck_assert_ptr_nonnull(test_mkdtemp(file_dir, sizeof(file_dir)));
	snprintf(extra, sizeof(extra), "\"tiers\": {\"dram\": {\"size\": \"8 MiB\"}, "
	    "\"file\": {\"path\": \"%s/file\"}}", file_dir);
	start_with(extra);
}

static void
teardown_file(void)
{
	test_td_teardown();
	test_rmtree(file_dir);
}

START_TEST(test_ready_503_while_draining)
{
	struct l3kv_publish_page	pg[1];
	struct l3kv_completion		c;
	struct test_rank		r;
	uint64_t			ticket;
	char				*b;
	int				code;
	uint32_t			i;

	solo_attach(&r);
	for (i = 0; i < 1; i++) {
		test_rank_fill_page(&r, TEST_RANK_KV, i, 7, i);
		memset(&pg[i], 0, sizeof(pg[i]));
		test_page_hash(7, i, pg[i].hash);
		pg[i].src_page = i;
	}
	ck_assert_int_eq(l3kv_submit_publish(r.k, TEST_RANK_KV, pg, 1, &ticket), 0);
	ck_assert_int_eq(test_td_stat_wait("copy", "jobs_inflight", 1), 1);
	kill(test_td.pid, SIGTERM);
	/* The copy is slowed (testing.copy_delay_ms): the drain waits for it, /ready says why. */
	for (i = 0; i < 200; i++) {
		b = get("/ready", &code);
		if (code == 503)
			break;
		free(b);
		usleep(5000);
	}
	ck_assert_int_eq(code, 503);
	ck_assert_str_eq(b, "draining: the daemon is stopping\n");
	free(b);
	b = get("/health", &code);
	ck_assert_int_eq(code, 200);
	free(b);
	/* The drain cancels the copy and closes the connection: whatever the answer, one comes. */
	test_rank_wait_completion(&r, &c);
	ck_assert_uint_eq(c.ticket, ticket);
	free(c.payload);
	test_rank_fini(&r);
}
END_TEST

static void
setup_slow(void)
{
	start_with("\"tiers\": {\"dram\": {\"size\": \"8 MiB\"}}, "
	    "\"testing\": {\"copy_delay_ms\": 1000}");
}

/* The engine socket still answers, and right. */
static void
engine_works(struct test_rank *r, uint32_t prefix)
{
	struct l3kv_publish_result	pub;

	test_rank_publish_kv(r, prefix, 0, 2, 0, &pub);
	ck_assert_uint_eq(pub.stored, 2);
	ck_assert_uint_eq(test_rank_probe(r, prefix, 4, NULL, NULL), 2);
}

START_TEST(test_hostile_http_leaves_the_engine_socket_alone)
{
	struct test_rank	 r;
	char			*big, *resp, *b, *m;
	int			 code, slow, fds[40], eof, i, closed;
	size_t			 n;

	solo_attach(&r);
	/* A partial request left open (slowloris): the engine socket goes on meanwhile. */
	slow = tcp_connect(http_port);
	ck_assert_int_eq(write(slow, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: ", 37), 37);
	engine_works(&r, 1);
	/* Headers over the bound: refused, not served. */
	n = 64 * 1024;
	ck_assert_ptr_nonnull(big = malloc(n + 64));
	i = snprintf(big, n + 64, "GET /metrics HTTP/1.1\r\nX-Big: ");
	memset(big + i, 'a', n);
	memcpy(big + i + n, "\r\n\r\n", 4);
	resp = http_raw(http_port, big, (size_t)i + n + 4, &code);
	ck_assert_msg(code == 0 || (code >= 400 && code < 500), "huge headers: %d", code);
	free(resp);
	free(big);
	b = http_req(http_port, "POST", "/metrics", &code);
	ck_assert_int_eq(code, 405);
	free(b);
	b = http_req(http_port, "DELETE", "/ready", &code);
	ck_assert_int_eq(code, 405);
	free(b);
	b = get("/nothing", &code);
	ck_assert_int_eq(code, 404);
	free(b);
	b = get("/metrics/../ready", &code);
	ck_assert_int_ne(code, 200);
	free(b);
	resp = http_raw(http_port, "\x16\x03\x01garbage\r\n\r\n", 13, &code);
	ck_assert_int_ne(code, 200);
	free(resp);
	engine_works(&r, 2);
	/* More connections than the cap: those over it are closed at once, the engine serves. */
	for (i = 0; i < 40; i++)
		fds[i] = tcp_connect(http_port);
	usleep(300000);
	for (i = 0, closed = 0; i < 40; i++) {
		resp = read_all(fds[i], 200, &eof);
		closed += eof;
		free(resp);
	}
	ck_assert_int_ge(closed, 40 - 32 - 1);	/* the slow one holds a slot */
	engine_works(&r, 3);
	for (i = 0; i < 40; i++)
		close(fds[i]);
	close(slow);
	/* Once they are gone (a sweep a second), /metrics answers again and counted them. */
	usleep(1200000);
	m = scrape();
	ck_assert(value(m, "l3kv_http_connections_closed_total", "reason=\"limit\"") >= 40 - 32 - 1);
	ck_assert_double_eq(value(m, "l3kv_http_rejected_total", ""), 2);
	ck_assert(value(m, "l3kv_http_requests_total", "path=\"other\"") >= 1);
	ck_assert_double_eq(value(m, "l3kv_connections_open", ""), 1);
	free(m);
	test_rank_fini(&r);
}
END_TEST

/*
 * Past METRICS_NS_MAX (16) namespaces, the next ones share one label,
 * namespace="other": the series stay bounded, the counts stay whole.
 */
START_TEST(test_namespaces_past_the_cap_are_counted_as_other)
{
	struct l3kv_publish_result	 pub;
	struct test_rank_kv		 k = kv;
	struct test_rank		 r;
	char				 model[32], *m, *line, *end;
	int				 i, labels = 0;

	for (i = 0; i < 20; i++) {
		snprintf(model, sizeof(model), "cap-model-%02d", i);
		k.model = model;
		test_rank_init(&r, &k, "g1", 1, 0);
		test_rank_attach(&r, test_td.sock);
		test_rank_publish_kv(&r, 1, 0, 1, 0, &pub);
		ck_assert_uint_eq(pub.stored, 1);
		test_rank_fini(&r);
	}
	m = scrape();
	/* One publish per namespace: 16 labelled, 4 under other. */
	ck_assert_double_eq(value(m, "l3kv_publishes_total", ""), 20);
	ck_assert_double_eq(value(m, "l3kv_publishes_total", "namespace=\"other\""), 4);
	ck_assert_double_eq(value(m, "l3kv_published_pages_total",
	    "namespace=\"other\",pool=\"other\""), 4);
	for (line = m; (line = strstr(line, "\nl3kv_publishes_total{")) != NULL; line = end) {
		end = strchr(line + 1, '\n');
		labels++;
	}
	ck_assert_int_eq(labels, 17);
	ck_assert(strstr(m, "namespace=\"decode/cap-model-15-") != NULL);
	ck_assert(strstr(m, "namespace=\"decode/cap-model-16-") == NULL);
	free(m);
}
END_TEST

static uint64_t
now_ms(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * A request trickled a byte every 250 ms never ends, and each byte resets
 * evhttp's idle timer: the connection's own deadline (10 s) closes it.
 */
START_TEST(test_a_trickled_request_is_closed_at_its_deadline)
{
	struct pollfd	 pfd;
	uint64_t	 t0 = now_ms(), t = 0;
	char		 c = 'a', *m;
	int		 fd, closed = 0;

	fd = tcp_connect(http_port);
	ck_assert_int_eq(write(fd, "GET /metrics HTTP/1.1\r\nX-Slow: ", 31), 31);
	while (!closed && (t = now_ms() - t0) < 15000) {
		pfd.fd = fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		if (poll(&pfd, 1, 250) > 0)
			closed = read(fd, &c, 1) <= 0;
		else if (write(fd, &c, 1) != 1)
			closed = 1;
	}
	close(fd);
	ck_assert_msg(closed && t >= 9500 && t <= 12500, "closed %d after %llu ms", closed,
	    (unsigned long long)t);
	m = scrape();
	ck_assert_double_eq(value(m, "l3kv_http_connections_closed_total", "reason=\"deadline\""), 1);
	free(m);
}
END_TEST

/* A port in use: the daemon refuses to start and says which. */
START_TEST(test_metrics_listen_in_use_refuses_to_start)
{
	struct test_daemon	d;
	char			cfg[256];
	int			fd, st;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	{
		struct sockaddr_in	sin;
		socklen_t		len = sizeof(sin);

		memset(&sin, 0, sizeof(sin));
		sin.sin_family = AF_INET;
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
		ck_assert_int_eq(listen(fd, 1), 0);
		ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
		snprintf(cfg, sizeof(cfg), "{\"metrics\": {\"listen\": \"127.0.0.1:%u\"}}",
		    (unsigned)ntohs(sin.sin_port));
	}
	ck_assert_int_eq(test_daemon_start(&d, cfg), -ECHILD);
	ck_assert(test_daemon_log_has(&d, "metrics.listen: cannot listen on 127.0.0.1:"));
	test_daemon_stop(&d, SIGTERM, &st);
	close(fd);
}
END_TEST

/* Whether nothing listens on port (a connect to it is refused). */
static int
port_refuses(uint16_t port)
{
	struct sockaddr_in	sin;
	int			fd, rc;

	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sin.sin_port = htons(port);
	rc = connect(fd, (struct sockaddr *)&sin, sizeof(sin));
	close(fd);
	return rc != 0 && errno == ECONNREFUSED;
}

/* Rewrites d's config with metrics.listen = listen, SIGHUPs it and waits for its summary line. */
static void
reload_listen(struct test_daemon *d, const char *listen, int nth)
{
	char	cfg[256];
	int	i, n = 0;

	snprintf(cfg, sizeof(cfg), "{\"metrics\": {\"listen\": \"%s\"}}", listen);
	ck_assert_int_eq(test_daemon_write_config(d, cfg), 0);
	ck_assert_int_eq(kill(d->pid, SIGHUP), 0);
	for (i = 0; i < 250 && n < nth; i++) {
		usleep(20000);
		n = test_daemon_log_count(d, " changed, ");
	}
	ck_assert_msg(n >= nth, "no reload summary line #%d in the log", nth);
}

/*
 * metrics.listen is live: a reload moves the server to the new address
 * (the old port closes), an address it cannot bind is refused with the
 * old server still serving, and "" turns it off.
 */
START_TEST(test_metrics_listen_moves_at_a_reload)
{
	struct test_daemon	d;
	char			cfg[256], *b;
	uint16_t		p1 = free_port(), p2;
	int			code, st;

	snprintf(cfg, sizeof(cfg), "{\"metrics\": {\"listen\": \"127.0.0.1:%u\"}}", (unsigned)p1);
	ck_assert_int_eq(test_daemon_start(&d, cfg), 0);
	b = http_req(p1, "GET", "/health", &code);
	ck_assert_int_eq(code, 200);
	free(b);
	do
		p2 = free_port();
	while (p2 == p1);
	snprintf(cfg, sizeof(cfg), "127.0.0.1:%u", (unsigned)p2);
	reload_listen(&d, cfg, 1);
	ck_assert(test_daemon_log_has(&d, "reload: metrics.listen: "));
	b = http_req(p2, "GET", "/health", &code);
	ck_assert_int_eq(code, 200);
	free(b);
	ck_assert_msg(port_refuses(p1), "the old port %u still listens", (unsigned)p1);
	ck_assert_int_eq(test_stat(d.sock, "reload", "keys_applied"), 1);
	/* Not an address of this host (TEST-NET-1): refused, the old server serves on. */
	reload_listen(&d, "192.0.2.1:9", 2);
	ck_assert(test_daemon_log_has(&d, "192.0.2.1:9\" refused: metrics.listen: cannot listen"));
	ck_assert_int_eq(test_stat(d.sock, "reload", "keys_refused"), 1);
	b = http_req(p2, "GET", "/health", &code);
	ck_assert_int_eq(code, 200);
	free(b);
	/* Off. */
	reload_listen(&d, "", 3);
	ck_assert_msg(port_refuses(p2), "port %u still listens with metrics.listen off",
	    (unsigned)p2);
	ck_assert_int_eq(test_stat(d.sock, "reload", "keys_applied"), 2);
	ck_assert_int_eq(test_daemon_stop(&d, SIGTERM, &st), 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
END_TEST

Suite *
suite_metrics_http(void)
{
	Suite	*s = suite_create("metrics_http");
	TCase	*tc;

	tc = test_tcase(s, "counters", 30, setup, teardown);
	tcase_add_test(tc, test_metrics_count_what_moved);
	tcase_add_test(tc, test_device_series_follow_stats_copy_devices);
	tcase_add_test(tc, test_health_and_ready);
	tcase_add_test(tc, test_namespaces_past_the_cap_are_counted_as_other);
	tc = test_tcase(s, "expiry", 30, setup_ttl, teardown);
	tcase_add_test(tc, test_an_expired_lease_counts_its_pages_unfulfilled);
	tc = test_tcase(s, "ready", 30, setup_file, teardown_file);
	tcase_add_test(tc, test_ready_503_while_the_file_tier_is_down);
	tc = test_tcase(s, "drain", 30, setup_slow, teardown);
	tcase_add_test(tc, test_ready_503_while_draining);
	tc = test_tcase(s, "hostile", 30, setup, teardown);
	tcase_add_test(tc, test_hostile_http_leaves_the_engine_socket_alone);
	tcase_add_test(tc, test_a_trickled_request_is_closed_at_its_deadline);
	tc = test_tcase(s, "listen", 30, NULL, NULL);
	tcase_add_test(tc, test_metrics_listen_in_use_refuses_to_start);
	tcase_add_test(tc, test_metrics_listen_moves_at_a_reload);
	return s;
}

/* The metrics_prom suite: promtool, a real Prometheus, the dashboard. */

/* Why the metrics_prom suite cannot run here (no promtool or prometheus on PATH), or NULL. */
const char *
metrics_prom_skip_reason(void)
{
	if (system("command -v promtool >/dev/null 2>&1") != 0)
		return "promtool not found (Debian's prometheus package; make deps installs it)";
	if (system("command -v prometheus >/dev/null 2>&1") != 0)
		return "prometheus not found (Debian's prometheus package; make deps installs it)";
	return NULL;
}

static void
write_file(const char *path, const char *text)
{
	FILE	*f;

	ck_assert_ptr_nonnull(f = fopen(path, "w"));
	ck_assert_int_eq(fputs(text, f) >= 0, 1);
	ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_promtool_checks_the_exposition)
{
	struct test_rank	 r;
	char			 path[PATH_MAX], cmd[PATH_MAX + 64], *m, *out;
	int			 rc;

	solo_attach(&r);
	move_counters(&r);
	m = scrape();
	snprintf(path, sizeof(path), "%s/metrics.txt", test_td.dir);
	write_file(path, m);
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
	rc = test_run_cmd(cmd, &out);
	ck_assert_msg(rc == 0 && out[0] == '\0', "promtool check metrics (%d):\n%s", rc, out);
	free(out);
	free(m);
	test_rank_fini(&r);
}
END_TEST

/* A Prometheus server for a test: its pid, port and directory. */
struct prom_server {
	pid_t		pid;
	uint16_t	port;
	char		dir[PATH_MAX];
};

static void
prom_start(struct prom_server *p, uint16_t target)
{
	char	yml[PATH_MAX], data[PATH_MAX], log[PATH_MAX], listen[64], cfg[512], *b;
	int	fd, code = 0, i;

	ck_assert_ptr_nonnull(test_mkdtemp(p->dir, sizeof(p->dir)));
	snprintf(yml, sizeof(yml), "%s/prometheus.yml", p->dir);
	snprintf(data, sizeof(data), "--storage.tsdb.path=%s/data", p->dir);
	snprintf(log, sizeof(log), "%s/prometheus.log", p->dir);
	snprintf(cfg, sizeof(cfg), "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
	    "  evaluation_interval: 1s\nscrape_configs:\n  - job_name: l3kvd\n"
	    "    static_configs:\n      - targets: ['127.0.0.1:%u']\n", (unsigned)target);
	write_file(yml, cfg);
	p->port = free_port();
	snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%u", (unsigned)p->port);
	snprintf(cfg, sizeof(cfg), "--config.file=%s", yml);
	ck_assert_int_ge(p->pid = fork(), 0);
	if (p->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execlp("prometheus", "prometheus", cfg, data, listen, "--log.level=warn",
		    (char *)NULL);
		_exit(127);
	}
	for (i = 0; i < 200; i++) {
		int	fd2 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in sin;

		memset(&sin, 0, sizeof(sin));
		sin.sin_family = AF_INET;
		sin.sin_port = htons(p->port);
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (connect(fd2, (struct sockaddr *)&sin, sizeof(sin)) == 0) {
			close(fd2);
			b = http_req(p->port, "GET", "/-/ready", &code);
			free(b);
			if (code == 200)
				break;
		} else
			close(fd2);
		ck_assert_msg(waitpid(p->pid, NULL, WNOHANG) == 0, "prometheus exited; see %s", log);
		usleep(50000);
	}
	ck_assert_msg(code == 200, "prometheus not ready after 10 s; see %s", log);
}

static void
prom_stop(struct prom_server *p)
{
	int	st;

	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, &st, 0);
		p->pid = 0;
	}
	if (getenv("L3KV_KEEP") == NULL)
		test_rmtree(p->dir);
}

/* The value of an instant query's only series, or -1 when it has none. */
static double
prom_query(const struct prom_server *p, const char *expr)
{
	static const char	 hex[] = "0123456789ABCDEF";
	json_error_t		 jerr;
	json_t			*j, *res, *v;
	char			 path[1024], *b;
	double			 out = -1;
	size_t			 o;
	int			 code;

	o = (size_t)snprintf(path, sizeof(path), "/api/v1/query?query=");
	for (; *expr != '\0' && o + 4 < sizeof(path); expr++) {
		if (isalnum((unsigned char)*expr) || *expr == '_')
			path[o++] = *expr;
		else {
			path[o++] = '%';
			path[o++] = hex[(unsigned char)*expr >> 4];
			path[o++] = hex[(unsigned char)*expr & 15];
		}
	}
	path[o] = '\0';
	b = http_req(p->port, "GET", path, &code);
	ck_assert_msg(code == 200, "query %s: %d %s", path, code, b);
	ck_assert_msg((j = json_loads(b, 0, &jerr)) != NULL, "%s: %s", jerr.text, b);
	res = json_object_get(json_object_get(j, "data"), "result");
	if (json_array_size(res) == 1 && (v = json_array_get(json_object_get(json_array_get(res, 0),
	    "value"), 1)) != NULL)
		out = strtod(json_string_value(v), NULL);
	json_decref(j);
	free(b);
	return out;
}

/* Waits (up to 15 s: scrapes come every second) for an expression to reach want. */
static double
prom_wait(const struct prom_server *p, const char *expr, double want)
{
	double	v = -1;
	int	i;

	for (i = 0; i < 150; i++) {
		if ((v = prom_query(p, expr)) == want)
			break;
		usleep(100000);
	}
	return v;
}

START_TEST(test_prometheus_scrapes_the_counters_that_moved)
{
	struct prom_server	p;
	struct test_rank	r;

	solo_attach(&r);
	prom_start(&p, http_port);
	ck_assert_double_eq(prom_wait(&p, "up{job=\"l3kvd\"}", 1), 1);
	move_counters(&r);
	ck_assert_double_eq(prom_wait(&p, "sum(l3kv_published_pages_total{pool=\"kv\"})", 8), 8);
	ck_assert_double_eq(prom_wait(&p, "sum(l3kv_restored_pages_total)", 5), 5);
	ck_assert_double_eq(prom_wait(&p, "sum(l3kv_restores_total)", 1), 1);
	ck_assert_double_eq(prom_wait(&p,
	    "sum(l3kv_admit_declines_total{reason=\"no_reservation\"})", 1), 1);
	ck_assert_double_eq(prom_wait(&p, "sum(l3kv_admit_declines_total{reason=\"no_hit\"})", 1),
	    1);
	ck_assert_double_eq(prom_wait(&p,
	    "sum(l3kv_restore_duration_seconds_count{result=\"ready\"})", 1), 1);
	ck_assert_double_eq(prom_wait(&p, "l3kv_ready", 1), 1);
	prom_stop(&p);
	test_rank_fini(&r);
}
END_TEST

/* The dashboard: $L3KV_SRCDIR (default ".")/config/grafana-l3kv.json. */
static char *
dashboard_text(void)
{
	const char	*s = getenv("L3KV_SRCDIR");
	char		 path[PATH_MAX], *text;
	FILE		*f;
	long		 n;

	snprintf(path, sizeof(path), "%s/config/grafana-l3kv.json", s != NULL && *s != '\0' ? s : ".");
	ck_assert_msg((f = fopen(path, "r")) != NULL, "%s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	ck_assert_ptr_nonnull(text = calloc(1, (size_t)n + 1));
	ck_assert_int_eq(fread(text, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return text;
}

/* Every "expr" of the panels' targets, recursively, into a (a JSON array of strings). */
static void
dashboard_exprs(json_t *j, json_t *a)
{
	const char	*k;
	json_t		*v;
	size_t		 i;

	if (json_is_object(j)) {
		json_object_foreach(j, k, v) {
			if (strcmp(k, "expr") == 0 && json_is_string(v))
				json_array_append(a, v);
			else
				dashboard_exprs(v, a);
		}
	} else if (json_is_array(j)) {
		for (i = 0; i < json_array_size(j); i++)
			dashboard_exprs(json_array_get(j, i), a);
	}
}

START_TEST(test_dashboard_names_only_metrics_that_exist)
{
	static const char *const suffixes[] = { "_bucket", "_sum", "_count" };
	struct test_rank	 r;
	json_error_t		 jerr;
	json_t			*d, *exprs, *e;
	char			*text, *m, name[128], type[160];
	const char		*x, *p;
	size_t			 i, n, k, names = 0;

	solo_attach(&r);
	move_counters(&r);
	m = scrape();
	text = dashboard_text();
	ck_assert_msg((d = json_loads(text, JSON_REJECT_DUPLICATES, &jerr)) != NULL, "line %d: %s",
	    jerr.line, jerr.text);
	ck_assert_ptr_nonnull(exprs = json_array());
	dashboard_exprs(d, exprs);
	ck_assert_uint_ge(json_array_size(exprs), 8);
	for (i = 0; i < json_array_size(exprs); i++) {
		e = json_array_get(exprs, i);
		x = json_string_value(e);
		for (p = x; (p = strstr(p, "l3kv_")) != NULL; p += n) {
			for (n = 0; isalnum((unsigned char)p[n]) || p[n] == '_'; n++)
				;
			ck_assert_uint_lt(n, sizeof(name));
			memcpy(name, p, n);
			name[n] = '\0';
			snprintf(type, sizeof(type), "# TYPE %s ", name);
			for (k = 0; strstr(m, type) == NULL && k < 3; k++) {
				size_t	sl = strlen(suffixes[k]);

				/* A histogram's series: its family is the name less the suffix. */
				if (n > sl && strcmp(name + n - sl, suffixes[k]) == 0)
					snprintf(type, sizeof(type), "# TYPE %.*s histogram", (int)(n - sl),
					    name);
			}
			ck_assert_msg(strstr(m, type) != NULL, "the dashboard's \"%s\" names %s, "
			    "which /metrics does not have", x, name);
			names++;
		}
	}
	ck_assert_uint_ge(names, 10);
	json_decref(exprs);
	json_decref(d);
	free(text);
	free(m);
	test_rank_fini(&r);
}
END_TEST

Suite *
suite_metrics_prom(void)
{
	Suite	*s = suite_create("metrics_prom");
	TCase	*tc;

	/* With a file tier: the dashboard's file panels name its metrics. */
	tc = test_tcase(s, "prom", 60, setup_file, teardown_file);
	tcase_add_test(tc, test_promtool_checks_the_exposition);
	tcase_add_test(tc, test_prometheus_scrapes_the_counters_that_moved);
	tcase_add_test(tc, test_dashboard_names_only_metrics_that_exist);
	return s;
}
