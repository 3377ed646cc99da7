/*
 * The l3kv test runner's shared declarations: one suite per check_*.c,
 * helpers that start a real l3kvd on a temporary socket, and test engine
 * ranks that drive it through libl3kv.
 */
#ifndef L3KV_TESTS_H
#define L3KV_TESTS_H

#include <sys/types.h>

#include <check.h>
#include <limits.h>

#include "l3kv.h"

/* Suites, one per check_*.c file. */
Suite	*suite_proto(void);
Suite	*suite_config(void);
Suite	*suite_client(void);
Suite	*suite_daemon(void);
Suite	*suite_service(void);
Suite	*suite_ctl(void);
Suite	*suite_root(void);
Suite	*suite_attach(void);
Suite	*suite_dram(void);
Suite	*suite_copy(void);
Suite	*suite_cache(void);
Suite	*suite_gpu(void);
Suite	*suite_gpu_host(void);
Suite	*suite_hybrid(void);
Suite	*suite_filetier(void);
Suite	*suite_filetier_daemon(void);
Suite	*suite_fabric(void);
Suite	*suite_peer(void);
Suite	*suite_etcd(void);
Suite	*suite_python(void);
Suite	*suite_python_gpu(void);
/* Why the python_gpu suite cannot run here (no torch, no CUDA for it), or NULL. */
const char *python_gpu_skip_reason(void);
Suite	*suite_python_sglang(void);
Suite	*suite_metrics_http(void);
Suite	*suite_metrics_prom(void);
/* Why the metrics_prom suite cannot run here (no promtool or prometheus), or NULL. */
const char *metrics_prom_skip_reason(void);
/* Why the python_sglang suite cannot run here (no SGLang venv, and why), or NULL. */
const char *python_sglang_skip_reason(void);
Suite	*suite_deb(void);

/* Test cases a suite left out because this machine cannot run them (printed SKIPPED). */
extern int	test_skipped;

/*
 * Network namespaces joined by a bridge (tests/netns.sh, found under
 * $L3KV_SRCDIR, default "."): node K of a set is namespace PREFIX-K with
 * address 10.77.0.K. test_netns_reason says why sets cannot be made here
 * (NULL: they can); test_netns_up makes n nodes under a fresh prefix
 * named for this process (so that a crashed test's set is cleaned by the
 * next), test_netns_link cuts node k off (up 0) or restores it.
 */
#define TEST_NETNS_PREFIX_MAX	48
const char *test_netns_reason(void);
int	 test_netns_up(char prefix[TEST_NETNS_PREFIX_MAX], unsigned n);
int	 test_netns_down(const char *prefix);
int	 test_netns_link(const char *prefix, unsigned k, int up);
/* Moves the calling process into node k of a set (setns); 0 or -errno. */
int	 test_netns_enter(const char *prefix, unsigned k);

/* A real l3kvd started from $L3KV_BUILD/l3kvd in a mkdtemp directory. */
struct test_daemon {
	pid_t	pid;
	char	dir[PATH_MAX];		/* mkdtemp directory, removed by stop */
	char	sock[PATH_MAX];		/* dir/l3kvd.sock */
	char	config[PATH_MAX];	/* dir/l3kvd.json */
	char	log[PATH_MAX];		/* dir/l3kvd.log: the daemon's stderr */
};

/*
 * The daemon of the running test, for suites whose every test gets its
 * own (tests/util.c). test_td_setup and test_td_setup_with (a checked
 * fixture's setup, or called from one) count the fds the test holds and
 * start it; test_td_teardown stops it, asserting that it exits 0 on
 * SIGTERM and that the test holds no fd more than it did. A test may
 * stop and start it between (test_td_stop, test_td_start, test_td_restart).
 */
extern struct test_daemon	test_td;

void	 test_td_setup(void);
void	 test_td_setup_with(const char *extra_json);
void	 test_td_teardown(void);
void	 test_td_start(const char *extra_json);
void	 test_td_stop(void);
void	 test_td_stop_within(unsigned wait_ms);
void	 test_td_restart(const char *extra_json);

/*
 * A test case of suite s with a checked fixture (setup and teardown may
 * be NULL) and a timeout in seconds (0 keeps check's default).
 */
TCase	*test_tcase(Suite *s, const char *name, double timeout, void (*setup)(void),
	    void (*teardown)(void));

const char *test_build_dir(void);
char	*test_path(const char *rel, char *buf, size_t len);
int	 test_daemon_start(struct test_daemon *, const char *extra_json);
int	 test_daemon_start_in(struct test_daemon *, const char *dir, const char *extra_json);
int	 test_daemon_stop(struct test_daemon *, int sig, int *status);
int	 test_daemon_stop_within(struct test_daemon *, int sig, int *status, unsigned wait_ms);
int	 test_daemon_log_has(const struct test_daemon *, const char *needle);
int	 test_daemon_log_count(const struct test_daemon *, const char *needle);
int	 test_run_cmd(const char *cmd, char **out);
/* Rewrites its config file (a reload re-reads it): the base config, extra_json over it. */
int	 test_daemon_write_config(struct test_daemon *, const char *extra_json);
int	 test_wait_socket(const char *path, int timeout_ms);
int	 test_fd_count(void);
int	 test_rmtree(const char *dir);
char	*test_mkdtemp(char *buf, size_t len);

/*
 * Page i's 32-byte hash in prefix `prefix`: deterministic, never all
 * zero; test_page_hashes() returns n of them in malloc'd memory.
 */
void	 test_page_hash(uint32_t prefix, uint32_t i, uint8_t *h);
uint8_t	*test_page_hashes(uint32_t prefix, uint32_t n);

/* STATS of the daemon on a socket, and of test_td (tests/util.c). */
#include <jansson.h>
json_t	*test_stats(const char *sock);
long long test_stat(const char *sock, const char *section, const char *key);
int	 test_threads_named(pid_t pid, const char *name);
long long test_stat_wait(const char *sock, const char *section, const char *key,
	    long long want);
json_t	*test_td_stats(void);
long long test_td_stat(const char *section, const char *key);
long long test_td_stat_wait(const char *section, const char *key, long long want);

/*
 * A test engine rank (tests/util.c): one libl3kv connection and the memfd
 * regions it attaches, mapped here too, so that a test fills the sources
 * it publishes and reads the destinations a restore wrote. Region i
 * belongs to pool i: the KV pages, then a state-slot region (slot 0
 * live) and a sidecar, each where the suite adds one. A suite changes
 * args (its layout, policies, ranks) between init and attach.
 */
#define TEST_RANK_KV		0
#define TEST_RANK_STATE		1
#define TEST_RANK_SIDE		2
#define TEST_RANK_REGIONS	3
#define TEST_RANK_LIVE		4	/* live state slots a rank can list */
#define TEST_RANK_SENTINEL	0xee	/* the bytes of a page nothing wrote */

struct test_rank {
	struct l3kv		*k;
	int			 fd[TEST_RANK_REGIONS];
	uint8_t			*mem[TEST_RANK_REGIONS];	/* NULL where no region */
	size_t			 len[TEST_RANK_REGIONS];
	struct l3kv_pool	 pools[TEST_RANK_REGIONS];
	struct l3kv_region	 regions[TEST_RANK_REGIONS];
	struct l3kv_attach_args	 args;
	uint32_t		 live[TEST_RANK_LIVE];	/* slot 0, then any a suite adds */
};

/* A rank's layout and KV pages (page_first: tokens x layers x token_bytes). */
struct test_rank_kv {
	const char		*model;
	const char		*schema;	/* the KV pool's tensor schema */
	enum l3kv_attention	 attention;
	uint32_t		 pages;
	uint32_t		 page_tokens;
	uint32_t		 layers;
	uint32_t		 token_bytes;
};

void	 test_rank_init(struct test_rank *, const struct test_rank_kv *, const char *group,
	    unsigned size, unsigned idx);
void	 test_rank_add_state(struct test_rank *, uint32_t slots, uint32_t slot_bytes,
	    const char *schema);
void	 test_rank_add_sidecar(struct test_rank *, enum l3kv_hit_policy, unsigned trailing,
	    uint32_t page_tokens, uint32_t token_bytes, const char *schema);
void	 test_rank_attach(struct test_rank *, const char *sock);
void	 test_rank_fini(struct test_rank *);
void	 test_rank_fill_page(struct test_rank *, unsigned region, uint32_t page, uint32_t prefix,
	    uint32_t i);
int	 test_rank_page_is(const struct test_rank *, unsigned region, uint32_t page,
	    uint32_t prefix, uint32_t i);
void	 test_rank_sentinel(struct test_rank *, unsigned region, uint32_t first, uint32_t n);
int	 test_rank_is_sentinel(const struct test_rank *, unsigned region, uint32_t first,
	    uint32_t n);
void	 test_rank_publish(struct test_rank *, unsigned region, uint32_t prefix, uint32_t from,
	    uint32_t n, uint32_t first, struct l3kv_publish_result *);
void	 test_rank_publish_kv(struct test_rank *, uint32_t prefix, uint32_t from, uint32_t n,
	    uint32_t first, struct l3kv_publish_result *);
uint32_t test_rank_probe(struct test_rank *, uint32_t prefix, uint32_t n, uint32_t *stops,
	    uint32_t *nstops);
struct l3kv_admit_result test_rank_admit(struct test_rank *, uint64_t req, uint32_t prefix,
	    uint32_t n, uint32_t reserved, uint32_t slot);
void	 test_rank_admit_group(struct test_rank *, unsigned n, const struct l3kv_admit_args *,
	    struct l3kv_admit_result *);
int	 test_rank_restore(struct test_rank *, uint64_t lease, uint32_t first, uint32_t n,
	    struct l3kv_restore_result *);
void	 test_rank_wait_completion(struct test_rank *, struct l3kv_completion *);

/*
 * A real etcd (Debian's etcd-server) on loopback: a data directory from
 * mkdtemp, random client and peer ports (test_etcd_init), SIGKILLed by
 * test_etcd_stop and started again (fresh: an empty data directory) by
 * test_etcd_start. test_etcd_reason says why etcd cannot start here.
 */
struct test_etcd {
	pid_t		pid;
	char		dir[PATH_MAX];		/* mkdtemp: data dirs and the log */
	char		data[PATH_MAX + 16];
	unsigned	cport, pport;
	char		endpoint[64];		/* http://127.0.0.1:PORT */
	unsigned	gen;			/* data directories made */
};
int	 test_etcd_init(struct test_etcd *, char *why, size_t whylen);
int	 test_etcd_start(struct test_etcd *, int fresh, char *why, size_t whylen);
void	 test_etcd_stop(struct test_etcd *);
void	 test_etcd_fini(struct test_etcd *);
int	 test_etcd_http(struct test_etcd *, const char *path, const char *body, char *out,
	    size_t outlen);
int	 test_etcd_reason(char *why, size_t whylen);

#endif
