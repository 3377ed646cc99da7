/*
 * The Python client (lib/python/l3kv) end to end: runs
 * tests/python/test_client.py, which starts its own l3kvd from
 * $L3KV_BUILD and drives it through that build's libl3kv.so with ctypes,
 * and asserts that it exits 0. python3 is required, not optional: where
 * it is missing the test fails and says so, it never passes silently.
 *
 * Under ASan the library is instrumented and the interpreter is not, so
 * the sanitizer runtimes this runner was linked with are preloaded into
 * python3; otherwise it could not load libl3kv.so at all.
 */
#include <sys/prctl.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define PY_ASAN	1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PY_ASAN	1
#endif
#endif
#ifdef PY_ASAN
#include <link.h>
#endif

#include "tests.h"

#define PY_SCRIPT	"tests/python/test_client.py"
#define PY_DEADLINE_S	60		/* the script takes about a second */
#define PY_OUTPUT_MAX	(1U << 20)
#define PY_EXEC_FAILED	127
#define PY_TAIL		1500		/* of the output, in the failure message */

#ifdef PY_ASAN
/* Appends each loaded sanitizer runtime to the colon-separated list in arg. */
static int
py_sanitizer_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	char		*list = arg;
	const char	*name = info->dlpi_name;
	size_t		 len = strlen(list);

	(void)size;
	if (name == NULL || (strstr(name, "/libasan.so") == NULL &&
	    strstr(name, "/libubsan.so") == NULL))
		return 0;
	snprintf(list + len, PATH_MAX * 2 - len, "%s%s", len > 0 ? ":" : "", name);
	return 0;
}

/* LD_PRELOAD and ASAN_OPTIONS for an uninstrumented interpreter. */
static void
py_preload_sanitizers(void)
{
	static char	list[PATH_MAX * 2];
	char		opts[1024];
	const char	*old = getenv("ASAN_OPTIONS");

	list[0] = '\0';
	dl_iterate_phdr(py_sanitizer_cb, list);
	if (list[0] != '\0')
		setenv("LD_PRELOAD", list, 1);
	/* CPython keeps its arenas to the end: leak reports would be noise. */
	snprintf(opts, sizeof(opts), "%s%sdetect_leaks=0", old != NULL ? old : "",
	    old != NULL && *old != '\0' ? ":" : "");
	setenv("ASAN_OPTIONS", opts, 1);
}
#endif

/* The child: python3 on the script, stdout and stderr into out. */
static void
py_exec(int out)
{
	char	lib[PATH_MAX];

	dup2(out, 1);
	dup2(out, 2);
	if (out > 2)
		close(out);
	/* The build under test, whatever the caller's environment says. */
	setenv("L3KV_BUILD", test_build_dir(), 1);
	setenv("L3KV_LIB", test_path("libl3kv.so", lib, sizeof(lib)), 1);
	/* Neither python3 nor the l3kvd it starts may outlive a killed test. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
#ifdef PY_ASAN
	py_preload_sanitizers();
#endif
	execlp("python3", "python3", PY_SCRIPT, (char *)NULL);
	fprintf(stderr, "exec python3: %s\n", strerror(errno));
	_exit(PY_EXEC_FAILED);
}

/*
 * Reads the child's output until EOF or the deadline; returns it
 * NUL-terminated (the first PY_OUTPUT_MAX bytes), and 0 or -ETIMEDOUT.
 */
static int
py_collect(int fd, char **out, size_t *len)
{
	struct pollfd	 pfd = { .fd = fd, .events = POLLIN };
	time_t		 deadline = time(NULL) + PY_DEADLINE_S;
	char		 chunk[4096], *buf;
	size_t		 n = 0;
	ssize_t		 r;

	buf = malloc(PY_OUTPUT_MAX + 1);
	ck_assert_ptr_nonnull(buf);
	for (;;) {
		if (time(NULL) >= deadline) {
			buf[n] = '\0';
			*out = buf;
			*len = n;
			return -ETIMEDOUT;
		}
		if (poll(&pfd, 1, 1000) <= 0)
			continue;
		r = read(fd, chunk, sizeof(chunk));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (n + (size_t)r > PY_OUTPUT_MAX)
			r = (ssize_t)(PY_OUTPUT_MAX - n);
		memcpy(buf + n, chunk, (size_t)r);
		n += (size_t)r;
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

START_TEST(test_python_client_passes_its_tests)
{
	char	*output;
	size_t	 len;
	pid_t	 pid;
	int	 pipefd[2], st = 0, rc;

	ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(pipefd[0]);
		py_exec(pipefd[1]);
	}
	close(pipefd[1]);
	rc = py_collect(pipefd[0], &output, &len);
	close(pipefd[0]);
	if (rc != 0)
		kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);

	if (rc != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fprintf(stderr, "--- %s output ---\n%s--- end of %s output ---\n", PY_SCRIPT, output,
		    PY_SCRIPT);
	ck_assert_msg(!(WIFEXITED(st) && WEXITSTATUS(st) == PY_EXEC_FAILED &&
	    strstr(output, "exec python3:") != NULL),
	    "python3 is required for the python suite and could not be run: %s", output);
	ck_assert_msg(rc == 0, "%s ran past %d s; killed. Its output ends:\n%s", PY_SCRIPT,
	    PY_DEADLINE_S, output + (len > PY_TAIL ? len - PY_TAIL : 0));
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	    "%s %s %d. Its output ends:\n%s", PY_SCRIPT,
	    WIFEXITED(st) ? "exited" : "was killed by signal",
	    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
	    output + (len > PY_TAIL ? len - PY_TAIL : 0));
	free(output);
}
END_TEST

Suite *
suite_python(void)
{
	Suite	*s = suite_create("python");
	TCase	*tc = tcase_create("client");

	tcase_set_timeout(tc, PY_DEADLINE_S + 30);
	tcase_add_test(tc, test_python_client_passes_its_tests);
	suite_add_tcase(s, tc);
	return s;
}
