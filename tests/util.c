/*
 * Test helpers: temporary directories, a real l3kvd started on a
 * temporary socket with a generated config, fd accounting.
 */
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "l3kv.h"
#include "tests.h"

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

static int
test_write_config(struct test_daemon *d, const char *extra_json)
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
	if ((rc = test_write_config(d, extra_json)) != 0)
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
 * Signals the daemon, waits for it (up to 5 s, then SIGKILL) and removes
 * its directory. *status gets waitpid's status.
 */
int
test_daemon_stop(struct test_daemon *d, int sig, int *status)
{
	struct timespec	ts = { 0, 10 * 1000 * 1000 };
	int		st = 0, i;
	pid_t		r = 0;

	if (d->pid > 0) {
		kill(d->pid, sig);
		for (i = 0; i < 500; i++) {
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
