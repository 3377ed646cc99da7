/*
 * Test helpers: temporary directories, a real l3kvd started on a
 * temporary socket with a generated config (test_td: the one a suite's
 * fixture starts for each test), test cases, fd accounting, page hashes,
 * and test engine ranks.
 *
 * A test rank (struct test_rank) is what the attach, cache, file-tier and
 * hybrid suites attach with: memfd regions (KV pages; optionally state
 * slots and a sidecar) that the daemon maps with its host copy engine and
 * that the test maps too. Its helpers publish pages of known content,
 * probe, admit and restore, and assert that each call succeeded; what the
 * answer must be is left to the test.
 */
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <netinet/in.h>

#include <arpa/inet.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"
#include "tests.h"

int	test_skipped;

static const char *
test_netns_script(char *buf, size_t len)
{
	const char	*src = getenv("L3KV_SRCDIR");

	snprintf(buf, len, "%s/tests/netns.sh", src != NULL && *src != '\0' ? src : ".");
	return buf;
}

/* Runs tests/netns.sh with args; its exit status, or -1. Its output goes to out (may be NULL). */
static int
test_netns_run(const char *args, char *out, size_t outlen)
{
	char	script[PATH_MAX], cmd[PATH_MAX + 256];
	FILE	*f;
	size_t	n = 0;
	int	st;

	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", test_netns_script(script, sizeof(script)), args);
	if ((f = popen(cmd, "r")) == NULL)
		return -1;
	if (out != NULL && outlen > 0) {
		n = fread(out, 1, outlen - 1, f);
		out[n] = '\0';
		while (n > 0 && out[n - 1] == '\n')
			out[--n] = '\0';
	} else {
		char	sink[256];

		while (fread(sink, 1, sizeof(sink), f) > 0)
			;
	}
	st = pclose(f);
	return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *
test_netns_reason(void)
{
	static char	why[512];
	static int	asked;
	int		rc;

	if (!asked) {
		asked = 1;
		rc = test_netns_run("check", why, sizeof(why));
		if (rc == 0)
			why[0] = '\0';
		else if (why[0] == '\0' || rc != 77)
			snprintf(why, sizeof(why), "tests/netns.sh check failed (status %d)", rc);
	}
	return why[0] != '\0' ? why : NULL;
}

int
test_netns_up(char prefix[TEST_NETNS_PREFIX_MAX], unsigned n)
{
	static unsigned	seq;
	char		args[128], out[512];
	unsigned	r;

	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (unsigned)time(NULL);
	snprintf(prefix, TEST_NETNS_PREFIX_MAX, "l3kvt%ldx%x%u", (long)getpid(), r & 0xffffff, seq++);
	snprintf(args, sizeof(args), "up %s %u", prefix, n);
	if (test_netns_run(args, out, sizeof(out)) != 0) {
		fprintf(stderr, "tests/netns.sh %s: %s\n", args, out);
		return -1;
	}
	return 0;
}

int
test_netns_down(const char *prefix)
{
	char	args[128];

	snprintf(args, sizeof(args), "down %s", prefix);
	return test_netns_run(args, NULL, 0) == 0 ? 0 : -1;
}

int
test_netns_link(const char *prefix, unsigned k, int up)
{
	char	args[128];

	snprintf(args, sizeof(args), "link %s %u %s", prefix, k, up ? "up" : "down");
	return test_netns_run(args, NULL, 0) == 0 ? 0 : -1;
}

int
test_netns_enter(const char *prefix, unsigned k)
{
	char	path[PATH_MAX];
	int	fd, rc = 0;

	snprintf(path, sizeof(path), "/run/netns/%s-%u", prefix, k);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -errno;
	if (setns(fd, CLONE_NEWNET) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

const char *
test_build_dir(void)
{
	const char	*b = getenv("L3KV_BUILD");

	return b != NULL && *b != '\0' ? b : "build";
}

/* $L3KV_BUILD/rel as an absolute-or-relative path in buf. */
char *
test_path(const char *rel, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", test_build_dir(), rel);
	return buf;
}

char *
test_mkdtemp(char *buf, size_t len)
{
	const char	*tmp = getenv("TMPDIR");

	snprintf(buf, len, "%s/l3kv-test-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
	return mkdtemp(buf);
}

static int
test_rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	return remove(path);
}

int
test_rmtree(const char *dir)
{
	return nftw(dir, test_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

int
test_fd_count(void)
{
	DIR		*d;
	struct dirent	*e;
	int		 n = 0;

	if ((d = opendir("/proc/self/fd")) == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;	/* the DIR's own fd */
}

/* Waits until something accepts on the socket path. */
int
test_wait_socket(const char *path, int timeout_ms)
{
	struct sockaddr_un	sun;
	struct timespec		ts = { 0, 5 * 1000 * 1000 };
	int			fd, waited;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
	for (waited = 0; waited < timeout_ms; waited += 5) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
			close(fd);
			return 0;
		}
		close(fd);
		nanosleep(&ts, NULL);
	}
	return -ETIMEDOUT;
}

/* Writes d's config file: the base test config with extra_json merged over it. */
int
test_daemon_write_config(struct test_daemon *d, const char *extra_json)
{
	json_t		*cfg, *extra;
	json_error_t	 jerr;
	int		 rc;

	cfg = json_pack("{s:{s:s, s:s}, s:{s:s}, s:{s:{s:s}}}",
	    "socket", "path", d->sock, "mode", "0600",
	    "log", "level", "debug",
	    "tiers", "dram", "size", "64 MiB");
	if (cfg == NULL)
		return -ENOMEM;
	if (extra_json != NULL) {
		extra = json_loads(extra_json, JSON_REJECT_DUPLICATES, &jerr);
		if (extra == NULL) {
			fprintf(stderr, "test config: %s\n", jerr.text);
			json_decref(cfg);
			return -EINVAL;
		}
		json_object_update_recursive(cfg, extra);
		json_decref(extra);
	}
	rc = json_dump_file(cfg, d->config, JSON_INDENT(2));
	json_decref(cfg);
	return rc == 0 ? 0 : -EIO;
}

/*
 * Starts build/l3kvd on dir/l3kvd.sock with the base test config plus
 * extra_json merged over it; waits until it accepts (up to 30 s: a
 * daemon with the cuda copy engine creates a CUDA context and pins its
 * arena first), or fails at once with -ECHILD if it exited.
 */
int
test_daemon_start_in(struct test_daemon *d, const char *dir, const char *extra_json)
{
	char	bin[PATH_MAX];
	int	fd, rc, waited;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "%s", dir);
	snprintf(d->sock, sizeof(d->sock), "%s/l3kvd.sock", dir);
	snprintf(d->config, sizeof(d->config), "%s/l3kvd.json", dir);
	snprintf(d->log, sizeof(d->log), "%s/l3kvd.log", dir);
	if ((rc = test_daemon_write_config(d, extra_json)) != 0)
		return rc;
	test_path("l3kvd", bin, sizeof(bin));
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		/*
		 * A test that fails leaves no daemon behind (one holding a GPU,
		 * or the runner's output pipe, would outlive the run).
		 */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, "l3kvd", "-f", d->config, (char *)NULL);
		_exit(127);
	}
	for (waited = 0; (rc = test_wait_socket(d->sock, 100)) == -ETIMEDOUT && waited < 30000;
	    waited += 100) {
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			return -ECHILD;
		}
	}
	if (rc != 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
		d->pid = 0;
		return rc;
	}
	return 0;
}

int
test_daemon_start(struct test_daemon *d, const char *extra_json)
{
	char	dir[PATH_MAX];

	if (test_mkdtemp(dir, sizeof(dir)) == NULL)
		return -errno;
	return test_daemon_start_in(d, dir, extra_json);
}

/*
 * Signals the daemon, waits for it (up to wait_ms, then SIGKILL) and
 * removes its directory. *status gets waitpid's status.
 */
int
test_daemon_stop_within(struct test_daemon *d, int sig, int *status, unsigned wait_ms)
{
	struct timespec	ts = { 0, 10 * 1000 * 1000 };
	int		st = 0;
	unsigned	i;
	pid_t		r = 0;

	if (d->pid > 0) {
		kill(d->pid, sig);
		for (i = 0; i < wait_ms / 10; i++) {
			r = waitpid(d->pid, &st, WNOHANG);
			if (r != 0)
				break;
			nanosleep(&ts, NULL);
		}
		if (r == 0) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
		}
		d->pid = 0;
	}
	if (status != NULL)
		*status = st;
	if (getenv("L3KV_KEEP") == NULL && d->dir[0] != '\0')
		test_rmtree(d->dir);
	d->dir[0] = '\0';
	return 0;
}

struct test_daemon	test_td;
static int		test_td_fds;	/* the fds the test held before test_td started */

void
test_td_start(const char *extra_json)
{
	ck_assert_int_eq(test_daemon_start(&test_td, extra_json), 0);
}

/* SIGTERM: the daemon must exit, and with 0. */
/* The same, waiting up to 5 s. */
int
test_daemon_stop(struct test_daemon *d, int sig, int *status)
{
	return test_daemon_stop_within(d, sig, status, 5000);
}

/* SIGTERM to test_td, which must exit 0 within wait_ms. */
void
test_td_stop_within(unsigned wait_ms)
{
	int	st;

	ck_assert_int_eq(test_daemon_stop_within(&test_td, SIGTERM, &st, wait_ms), 0);
	ck_assert(WIFEXITED(st));
	ck_assert_int_eq(WEXITSTATUS(st), 0);
}

void
test_td_stop(void)
{
	test_td_stop_within(5000);
}

void
test_td_restart(const char *extra_json)
{
	test_td_stop();
	test_td_start(extra_json);
}

void
test_td_setup_with(const char *extra_json)
{
	test_td_fds = test_fd_count();
	test_td_start(extra_json);
}

void
test_td_setup(void)
{
	test_td_setup_with(NULL);
}

void
test_td_teardown(void)
{
	test_td_stop();
	ck_assert_int_eq(test_fd_count(), test_td_fds);
}

TCase *
test_tcase(Suite *s, const char *name, double timeout, void (*setup)(void), void (*teardown)(void))
{
	TCase	*tc = tcase_create(name);

	if (setup != NULL || teardown != NULL)
		tcase_add_checked_fixture(tc, setup, teardown);
	if (timeout > 0)
		tcase_set_timeout(tc, timeout);
	suite_add_tcase(s, tc);
	return tc;
}

/* 1 if the daemon's log holds needle. */
int
test_daemon_log_has(const struct test_daemon *d, const char *needle)
{
	FILE	*f;
	char	 line[4096];
	int	 found = 0;

	if ((f = fopen(d->log, "r")) == NULL)
		return 0;
	while (!found && fgets(line, sizeof(line), f) != NULL)
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

/*
 * Runs a shell command with its stderr joined to its stdout; returns its
 * exit status, *out the first MiB of what it printed (free it).
 */
int
test_run_cmd(const char *cmd, char **out)
{
	char	 full[PATH_MAX * 3];
	FILE	*p;
	size_t	 n = 0, r;
	int	 st;

	ck_assert((size_t)snprintf(full, sizeof(full), "%s 2>&1", cmd) < sizeof(full));
	ck_assert_ptr_nonnull(p = popen(full, "r"));
	ck_assert_ptr_nonnull(*out = calloc(1, 1 << 20));
	while (n < (1 << 20) - 1 && (r = fread(*out + n, 1, (1 << 20) - 1 - n, p)) > 0)
		n += r;
	st = pclose(p);
	ck_assert_msg(st != -1 && WIFEXITED(st), "%s: status %#x", cmd, st);
	return WEXITSTATUS(st);
}

/* How many lines of d's log hold needle. */
int
test_daemon_log_count(const struct test_daemon *d, const char *needle)
{
	FILE	*f;
	char	 line[4096];
	int	 n = 0;

	if ((f = fopen(d->log, "r")) == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* The STATS document of the daemon on sock, parsed (json_decref it). */
json_t *
test_stats(const char *sock)
{
	struct l3kv	*k = NULL;
	json_error_t	 jerr;
	json_t		*j;
	char		*text = NULL;

	ck_assert_int_eq(l3kv_connect(sock, 5000, &k), 0);
	ck_assert_int_eq(l3kv_stats(k, &text), 0);
	j = json_loads(text, 0, &jerr);
	ck_assert_msg(j != NULL, "STATS is not JSON: %s", jerr.text);
	l3kv_free(text);
	l3kv_close(k);
	return j;
}

/* One counter of STATS: section.key, which must be an integer. */
long long
test_stat(const char *sock, const char *section, const char *key)
{
	json_t		*j = test_stats(sock);
	json_t		*v = json_object_get(json_object_get(j, section), key);
	long long	 n;

	ck_assert_msg(json_is_integer(v), "stats %s.%s missing", section, key);
	n = json_integer_value(v);
	json_decref(j);
	return n;
}

/* How many of process pid's threads are named name (/proc/PID/task/TID/comm). */
int
test_threads_named(pid_t pid, const char *name)
{
	char		 path[64], comm[32];
	struct dirent	*de;
	DIR		*d;
	FILE		*f;
	int		 n = 0;

	snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
	ck_assert_msg((d = opendir(path)) != NULL, "%s: %s", path, strerror(errno));
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/task/%.16s/comm", (long)pid, de->d_name);
		if ((f = fopen(path, "r")) == NULL)
			continue;	/* the thread ended meanwhile */
		if (fgets(comm, sizeof(comm), f) != NULL) {
			comm[strcspn(comm, "\n")] = '\0';
			n += strcmp(comm, name) == 0;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

/* Waits (at most 5 s) until a counter reaches want; returns its last value. */
long long
test_stat_wait(const char *sock, const char *section, const char *key, long long want)
{
	long long	v = -1;
	int		i;

	for (i = 0; i < 500; i++) {
		if ((v = test_stat(sock, section, key)) == want)
			break;
		usleep(10000);
	}
	return v;
}

json_t *
test_td_stats(void)
{
	return test_stats(test_td.sock);
}

long long
test_td_stat(const char *section, const char *key)
{
	return test_stat(test_td.sock, section, key);
}

long long
test_td_stat_wait(const char *section, const char *key, long long want)
{
	return test_stat_wait(test_td.sock, section, key, want);
}

void
test_page_hash(uint32_t prefix, uint32_t i, uint8_t *h)
{
	uint32_t	j, x = prefix * 2654435761U + i * 40503U + 1;

	for (j = 0; j < L3KV_HASH_LEN; j++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		h[j] = (uint8_t)x;
	}
}

uint8_t *
test_page_hashes(uint32_t prefix, uint32_t n)
{
	uint8_t		*h = malloc((size_t)n * L3KV_HASH_LEN);
	uint32_t	 i;

	ck_assert_ptr_nonnull(h);
	for (i = 0; i < n; i++)
		test_page_hash(prefix, i, h + (size_t)i * L3KV_HASH_LEN);
	return h;
}

/* Maps a memfd of len bytes as region i of a rank. */
static void
test_rank_map(struct test_rank *r, unsigned i, size_t len)
{
	r->fd[i] = memfd_create("l3kv-test-rank", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(r->fd[i], 0);
	ck_assert_int_eq(ftruncate(r->fd[i], (off_t)len), 0);
	r->mem[i] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd[i], 0);
	ck_assert(r->mem[i] != MAP_FAILED);
	r->len[i] = len;
}

/* Region i (pool i) of pages page_first: page, then token, then layer. */
static void
test_rank_pages(struct test_rank *r, unsigned i, uint32_t pages, uint32_t page_tokens,
    uint32_t layers, uint32_t token_bytes)
{
	uint64_t	page = (uint64_t)page_tokens * layers * token_bytes;

	test_rank_map(r, i, (size_t)pages * page);
	r->regions[i] = (struct l3kv_region){ .pool = i, .kind = L3KV_MEM_MEMFD,
	    .layout = L3KV_LAYOUT_PAGE_FIRST, .fd = r->fd[i], .size = (uint64_t)pages * page,
	    .num_pages = pages, .page_tokens = page_tokens, .layers = layers,
	    .token_bytes = token_bytes, .page_stride = page, .layer_stride = token_bytes,
	    .token_stride = (uint64_t)layers * token_bytes };
}

/*
 * A rank `idx` of a TP group of `size` ranks named `group` (borrowed, as
 * are kv's strings), with a KV region only; wait_complete, write-through.
 */
void
test_rank_init(struct test_rank *r, const struct test_rank_kv *kv, const char *group,
    unsigned size, unsigned idx)
{
	memset(r, 0, sizeof(*r));
	test_rank_pages(r, TEST_RANK_KV, kv->pages, kv->page_tokens, kv->layers, kv->token_bytes);
	r->pools[TEST_RANK_KV] = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0,
	    kv->layers, r->regions[TEST_RANK_KV].page_stride, kv->schema };
	r->args.layout = (struct l3kv_layout){ .model = kv->model, .kv_dtype = "fp8_e4m3",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = size, .dcp_size = 1,
	    .pp_size = 1, .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST,
	    .attention = kv->attention, .page_tokens = kv->page_tokens,
	    .logical_page_tokens = kv->page_tokens };
	r->args.pools = r->pools;
	r->args.npools = 1;
	r->args.regions = r->regions;
	r->args.nregions = 1;
	r->args.group = group;
	r->args.group_size = size;
	r->args.group_rank = idx;
	r->args.tp_rank = idx;
	r->args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	r->args.write = L3KV_WRITE_THROUGH;
}

/* Adds the state pool: `slots` checkpoint slots of slot_bytes; slot 0 is live. */
void
test_rank_add_state(struct test_rank *r, uint32_t slots, uint32_t slot_bytes, const char *schema)
{
	ck_assert_uint_eq(r->args.nregions, TEST_RANK_STATE);
	test_rank_map(r, TEST_RANK_STATE, (size_t)slots * slot_bytes);
	r->pools[TEST_RANK_STATE] = (struct l3kv_pool){ "state", L3KV_POOL_STATE,
	    L3KV_HIT_ALL_PAGES, 0, 1, slot_bytes, schema };
	r->regions[TEST_RANK_STATE] = (struct l3kv_region){ .pool = TEST_RANK_STATE,
	    .kind = L3KV_MEM_MEMFD, .layout = L3KV_LAYOUT_SLOTS, .fd = r->fd[TEST_RANK_STATE],
	    .size = r->len[TEST_RANK_STATE], .num_pages = slots, .page_tokens = 1, .layers = 1,
	    .token_bytes = slot_bytes, .page_stride = slot_bytes };
	r->live[0] = 0;
	r->args.live_slots = r->live;
	r->args.nlive = 1;
	r->args.npools = r->args.nregions = TEST_RANK_STATE + 1;
}

/* Adds a one-layer sidecar pool (after the state pool), a page per KV page. */
void
test_rank_add_sidecar(struct test_rank *r, enum l3kv_hit_policy hit, unsigned trailing,
    uint32_t page_tokens, uint32_t token_bytes, const char *schema)
{
	ck_assert_uint_eq(r->args.nregions, TEST_RANK_SIDE);
	test_rank_pages(r, TEST_RANK_SIDE, r->regions[TEST_RANK_KV].num_pages, page_tokens, 1,
	    token_bytes);
	r->pools[TEST_RANK_SIDE] = (struct l3kv_pool){ "swa", L3KV_POOL_SIDECAR, hit, trailing, 1,
	    r->regions[TEST_RANK_SIDE].page_stride, schema };
	r->args.npools = r->args.nregions = TEST_RANK_SIDE + 1;
}

void
test_rank_attach(struct test_rank *r, const char *sock)
{
	ck_assert_int_eq(l3kv_connect(sock, 5000, &r->k), 0);
	ck_assert_msg(l3kv_attach(r->k, &r->args, NULL) == 0, "attach: %s", l3kv_last_error(r->k));
}

/* Closes the connection and unmaps the regions; idempotent. */
void
test_rank_fini(struct test_rank *r)
{
	unsigned	i;

	l3kv_close(r->k);
	r->k = NULL;
	for (i = 0; i < TEST_RANK_REGIONS; i++) {
		if (r->mem[i] == NULL)
			continue;
		munmap(r->mem[i], r->len[i]);
		close(r->fd[i]);
		r->mem[i] = NULL;
	}
}

/* Pages (or slots) [first, first+n) of a region, which must hold them; *len: one page's bytes. */
static uint8_t *
test_rank_page(const struct test_rank *r, unsigned region, uint32_t first, uint32_t n, size_t *len)
{
	*len = r->regions[region].page_stride;
	ck_assert_uint_le(((size_t)first + n) * *len, r->len[region]);
	return r->mem[region] + (size_t)first * *len;
}

/* Deterministic bytes of page i of a prefix. */
static void
test_page_content(uint8_t *p, size_t len, uint32_t prefix, uint32_t i)
{
	uint32_t	x = prefix * 7919U + i * 104729U + 17;
	size_t		j;

	for (j = 0; j < len; j++) {
		x = x * 1103515245U + 12345U;
		p[j] = (uint8_t)(x >> 16);
	}
}

/* Fills page `page` of a region with the content of page i of a prefix. */
void
test_rank_fill_page(struct test_rank *r, unsigned region, uint32_t page, uint32_t prefix,
    uint32_t i)
{
	size_t	 len;
	uint8_t	*p = test_rank_page(r, region, page, 1, &len);

	test_page_content(p, len, prefix, i);
}

/* 1 if page `page` of a region holds the content of page i of a prefix. */
int
test_rank_page_is(const struct test_rank *r, unsigned region, uint32_t page, uint32_t prefix,
    uint32_t i)
{
	size_t	 len;
	uint8_t	*p = test_rank_page(r, region, page, 1, &len), *want = malloc(len);
	int	 ok;

	ck_assert_ptr_nonnull(want);
	test_page_content(want, len, prefix, i);
	ok = memcmp(p, want, len) == 0;
	free(want);
	return ok;
}

/* Fills pages [first, first+n) of a region with the sentinel. */
void
test_rank_sentinel(struct test_rank *r, unsigned region, uint32_t first, uint32_t n)
{
	size_t	 len;
	uint8_t	*p = test_rank_page(r, region, first, n, &len);

	memset(p, TEST_RANK_SENTINEL, (size_t)n * len);
}

/* 1 if pages [first, first+n) of a region hold nothing but the sentinel. */
int
test_rank_is_sentinel(const struct test_rank *r, unsigned region, uint32_t first, uint32_t n)
{
	size_t		 len, j;
	const uint8_t	*p = test_rank_page(r, region, first, n, &len);

	for (j = 0; j < (size_t)n * len; j++)
		if (p[j] != TEST_RANK_SENTINEL)
			return 0;
	return 1;
}

/*
 * Publishes pages [first, first+n) of a region, as they are, under the
 * hashes of pages [from, from+n) of a prefix: the call must succeed and
 * each page be stored or found present. res may be NULL.
 */
void
test_rank_publish(struct test_rank *r, unsigned region, uint32_t prefix, uint32_t from,
    uint32_t n, uint32_t first, struct l3kv_publish_result *res)
{
	struct l3kv_publish_result	 mine;
	struct l3kv_publish_page	*pg = calloc(n, sizeof(*pg));
	uint32_t			 i;

	ck_assert_ptr_nonnull(pg);
	if (res == NULL)
		res = &mine;
	for (i = 0; i < n; i++) {
		test_page_hash(prefix, from + i, pg[i].hash);
		pg[i].src_page = first + i;
	}
	ck_assert_msg(l3kv_publish(r->k, region, pg, n, res) == 0, "publish: %s",
	    l3kv_last_error(r->k));
	ck_assert_uint_eq(res->stored + res->present, n);
	free(pg);
}

/* Fills KV pages [first, first+n) with pages [from, from+n) of a prefix and publishes them. */
void
test_rank_publish_kv(struct test_rank *r, uint32_t prefix, uint32_t from, uint32_t n,
    uint32_t first, struct l3kv_publish_result *res)
{
	uint32_t	i;

	for (i = 0; i < n; i++)
		test_rank_fill_page(r, TEST_RANK_KV, first + i, prefix, from + i);
	test_rank_publish(r, TEST_RANK_KV, prefix, from, n, first, res);
}

/*
 * PROBE of the first n pages of a prefix; returns the hit. Without stops
 * and nstops it is l3kv_probe(), the call a plain engine makes; stops
 * (room for n) gets the legal stop points.
 */
uint32_t
test_rank_probe(struct test_rank *r, uint32_t prefix, uint32_t n, uint32_t *stops,
    uint32_t *nstops)
{
	uint8_t		*h = test_page_hashes(prefix, n);
	uint32_t	 hit = UINT32_MAX, dummy;

	if (stops == NULL && nstops == NULL)
		ck_assert_int_eq(l3kv_probe(r->k, h, n, &hit), 0);
	else
		ck_assert_int_eq(l3kv_probe_stops(r->k, h, n, &hit, stops, stops != NULL ? n : 0,
		    nstops != NULL ? nstops : &dummy), 0);
	free(h);
	return hit;
}

/* ADMIT of the first n pages of a prefix; the call must succeed, the answer is the test's. */
struct l3kv_admit_result
test_rank_admit(struct test_rank *r, uint64_t req, uint32_t prefix, uint32_t n,
    uint32_t reserved, uint32_t slot)
{
	struct l3kv_admit_result	res;
	struct l3kv_admit_args		a;
	uint8_t				*h = test_page_hashes(prefix, n);

	a = (struct l3kv_admit_args){ .request_id = req, .hashes = h, .npages = n,
	    .reserved_pages = reserved, .state_slot = slot };
	memset(&res, 0xa5, sizeof(res));	/* every field must come from the reply */
	ck_assert_int_eq(l3kv_admit(r->k, &a, &res), 0);
	free(h);
	return res;
}

/*
 * The same ADMIT submitted on each of n ranks before any answer is
 * awaited (as a group's ranks do); res[i] gets rank i's answer.
 */
void
test_rank_admit_group(struct test_rank *r, unsigned n, const struct l3kv_admit_args *a,
    struct l3kv_admit_result *res)
{
	struct l3kv_completion	c;
	uint64_t		ticket;
	unsigned		i;

	for (i = 0; i < n; i++)
		ck_assert_int_eq(l3kv_submit_admit(r[i].k, a, &ticket), 0);
	for (i = 0; i < n; i++) {
		test_rank_wait_completion(&r[i], &c);
		ck_assert_int_eq(c.status, 0);
		ck_assert_int_eq(l3kv_admit_result(&c, &res[i]), 0);
		l3kv_completion_release(&c);
	}
}

/* RESTOREs a lease into KV pages first..first+n-1 (10 s); returns l3kv_restore's result. */
int
test_rank_restore(struct test_rank *r, uint64_t lease, uint32_t first, uint32_t n,
    struct l3kv_restore_result *res)
{
	uint32_t	*dst = malloc(n * sizeof(*dst) + 1), i;
	int		 rc;

	ck_assert_ptr_nonnull(dst);
	for (i = 0; i < n; i++)
		dst[i] = first + i;
	rc = l3kv_restore(r->k, lease, TEST_RANK_KV, dst, n, 10000, res);
	free(dst);
	return rc;
}

/* The next completion of a rank (within 20 s). */
void
test_rank_wait_completion(struct test_rank *r, struct l3kv_completion *c)
{
	struct pollfd	pfd = { l3kv_fd(r->k), POLLIN, 0 };
	int		rc, i;

	for (i = 0; i < 1000; i++) {
		if ((rc = l3kv_poll_completion(r->k, c)) == 0)
			return;
		ck_assert_int_eq(rc, -EAGAIN);
		poll(&pfd, 1, 20);
	}
	ck_abort_msg("no completion");
}

/* ------------------------------------------------------------------ a real etcd */

static long long
test_etcd_ms(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int
test_etcd_port_free(unsigned port)
{
	struct sockaddr_in	sa;
	int			fd, ok;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		return 0;
	ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/* One blocking HTTP POST to the server; the status, or -1. The answer's body goes to out. */
int
test_etcd_http(struct test_etcd *et, const char *path, const char *body, char *out, size_t outlen)
{
	struct sockaddr_in	sa;
	char			req[2048], ans[8192];
	size_t			got = 0;
	ssize_t			n;
	int			fd, code = -1;
	char			*b;
	struct timeval		tv = { 2, 0 };

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)et->cport);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		goto out;
	n = snprintf(req, sizeof(req), "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n"
	    "Connection: close\r\n\r\n%s", path, strlen(body), body);
	if (write(fd, req, (size_t)n) != n)
		goto out;
	while (got < sizeof(ans) - 1 && (n = read(fd, ans + got, sizeof(ans) - 1 - got)) > 0)
		got += (size_t)n;
	ans[got] = '\0';
	if (sscanf(ans, "HTTP/1.%*d %d", &code) != 1)
		code = -1;
	if (out != NULL && outlen > 0) {
		b = strstr(ans, "\r\n\r\n");
		snprintf(out, outlen, "%s", b != NULL ? b + 4 : "");
	}
out:
	close(fd);
	return code;
}

/* Starts etcd on et's ports; fresh: a new, empty data directory. 0, or -1 with why. */
int
test_etcd_start(struct test_etcd *et, int fresh, char *why, size_t whylen)
{
	char		curl[64], purl[64], cluster[80], log[PATH_MAX + 16], ans[256];
	long long	end;
	int		st, fd;

	if (fresh)
		snprintf(et->data, sizeof(et->data), "%s/data%u", et->dir, ++et->gen);
	snprintf(curl, sizeof(curl), "http://127.0.0.1:%u", et->cport);
	snprintf(purl, sizeof(purl), "http://127.0.0.1:%u", et->pport);
	snprintf(cluster, sizeof(cluster), "t=%s", purl);
	snprintf(et->endpoint, sizeof(et->endpoint), "%s", curl);
	snprintf(log, sizeof(log), "%s/etcd.log", et->dir);
	if ((et->pid = fork()) < 0) {
		snprintf(why, whylen, "fork: %s", strerror(errno));
		return -1;
	}
	if (et->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execlp("etcd", "etcd", "--name", "t", "--data-dir", et->data,
		    "--listen-client-urls", curl, "--advertise-client-urls", curl,
		    "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		    "--initial-cluster", cluster, (char *)NULL);
		fprintf(stderr, "exec etcd: %s\n", strerror(errno));
		_exit(127);
	}
	for (end = test_etcd_ms() + 20000; test_etcd_ms() < end; usleep(50000)) {
		if (waitpid(et->pid, &st, WNOHANG) == et->pid) {
			et->pid = 0;
			snprintf(why, whylen, "etcd exited (status %#x; is etcd-server installed?), "
			    "see its log", st);
			return -1;
		}
		if (test_etcd_http(et, "/v3/kv/range", "{\"key\":\"AA==\"}", ans, sizeof(ans)) == 200)
			return 0;
	}
	kill(et->pid, SIGKILL);
	waitpid(et->pid, &st, 0);
	et->pid = 0;
	snprintf(why, whylen, "etcd did not answer within 20 s");
	return -1;
}

void
test_etcd_stop(struct test_etcd *et)
{
	int	st;

	if (et->pid > 0) {
		kill(et->pid, SIGKILL);
		waitpid(et->pid, &st, 0);
	}
	et->pid = 0;
}

int
test_etcd_init(struct test_etcd *et, char *why, size_t whylen)
{
	unsigned	r;
	int		tries;

	memset(et, 0, sizeof(*et));
	if (test_mkdtemp(et->dir, sizeof(et->dir)) == NULL) {
		snprintf(why, whylen, "mkdtemp: %s", strerror(errno));
		return -1;
	}
	srand((unsigned)getpid() ^ (unsigned)test_etcd_ms());
	for (tries = 0; tries < 50; tries++) {
		r = 20000 + (unsigned)rand() % 30000;
		if (test_etcd_port_free(r) && test_etcd_port_free(r + 1))
			break;
	}
	et->cport = r;
	et->pport = r + 1;
	return test_etcd_start(et, 1, why, whylen);
}

void
test_etcd_fini(struct test_etcd *et)
{
	test_etcd_stop(et);
	test_rmtree(et->dir);
}

/*
 * Whether etcd can start here: asked in a child, which starts and stops
 * one. 0, or -1 with why (for the SKIPPED line).
 */
int
test_etcd_reason(char *why, size_t whylen)
{
	struct test_etcd	et;
	pid_t			pid = -1;
	int			p[2], st = 0;
	ssize_t			n;

	why[0] = '\0';
	if (pipe(p) == 0 && (pid = fork()) == 0) {
		close(p[0]);
		if (test_etcd_init(&et, why, whylen) != 0 && write(p[1], why, strlen(why)) < 0)
			_exit(1);
		test_etcd_fini(&et);
		_exit(0);
	} else if (pid > 0) {
		close(p[1]);
		n = read(p[0], why, whylen - 1);
		why[n > 0 ? n : 0] = '\0';
		close(p[0]);
		waitpid(pid, &st, 0);
	} else
		snprintf(why, whylen, "fork failed");
	return why[0] != '\0' ? -1 : 0;
}
