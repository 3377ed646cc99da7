/*
 * The l3kv test runner's shared declarations: one suite per check_*.c,
 * and helpers that start a real l3kvd on a temporary socket.
 */
#ifndef L3KV_TESTS_H
#define L3KV_TESTS_H

#include <sys/types.h>

#include <check.h>
#include <limits.h>

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
Suite	*suite_cache(void);
Suite	*suite_gpu(void);
Suite	*suite_gpu_host(void);
Suite	*suite_hybrid(void);
Suite	*suite_filetier(void);
Suite	*suite_filetier_daemon(void);
Suite	*suite_python(void);
Suite	*suite_python_gpu(void);
/* Why the python_gpu suite cannot run here (no torch, no CUDA for it), or NULL. */
const char *python_gpu_skip_reason(void);

/* A real l3kvd started from $L3KV_BUILD/l3kvd in a mkdtemp directory. */
struct test_daemon {
	pid_t	pid;
	char	dir[PATH_MAX];		/* mkdtemp directory, removed by stop */
	char	sock[PATH_MAX];		/* dir/l3kvd.sock */
	char	config[PATH_MAX];	/* dir/l3kvd.json */
	char	log[PATH_MAX];		/* dir/l3kvd.log: the daemon's stderr */
};

const char *test_build_dir(void);
char	*test_path(const char *rel, char *buf, size_t len);
int	 test_daemon_start(struct test_daemon *, const char *extra_json);
int	 test_daemon_start_in(struct test_daemon *, const char *dir, const char *extra_json);
int	 test_daemon_stop(struct test_daemon *, int sig, int *status);
int	 test_daemon_log_has(const struct test_daemon *, const char *needle);
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

/* STATS of the daemon on a socket (tests/util.c). */
#include <jansson.h>
json_t	*test_stats(const char *sock);
long long test_stat(const char *sock, const char *section, const char *key);
long long test_stat_wait(const char *sock, const char *section, const char *key,
	    long long want);

#endif
