/*
 * The Python client (lib/python/l3kv) end to end: runs the scripts of
 * tests/python with that build's libl3kv.so and asserts that each exits
 * 0. test_client.py starts its own l3kvd from $L3KV_BUILD and drives it
 * through ctypes; test_torch_geometry.py checks l3kv.torch's region
 * geometry without a GPU; test_sglang_alone.py drives l3kv.sglang on a
 * stand-in host pool against a real l3kvd (suite python). python3 is
 * required, not optional: where it is missing the test fails and says
 * so, it never passes silently.
 *
 * test_gpu_torch.py is an engine written with torch on the GPU (suite
 * python_gpu, tag gpu_torch). It exits 77 where torch or CUDA is missing;
 * the runner asks it first (--probe, python_gpu_skip_reason()) and lists
 * the suite as skipped with its reason, and a 77 from the real run is a
 * failure, never a pass.
 *
 * test_sglang.py is SGLang's own HiCache stack (sglang 0.5.23, CPU only)
 * around l3kv.sglang.L3kvStorage and a live l3kvd (suite python_sglang,
 * tag sglang). It runs under the interpreter of the virtual environment
 * `make check` builds ($L3KV_SGLANG_PYTHON, default
 * build/venv-sglang/bin/python); where that could not be made, the
 * venv's SKIPPED file says why and the suite is listed as skipped with
 * that reason, as it is where the interpreter is missing or the script's
 * --probe exits 77; a 77 from the real run is a failure.
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

#define PY_CLIENT	"tests/python/test_client.py"
#define PY_GEOMETRY	"tests/python/test_torch_geometry.py"
#define PY_SGLANG_ALONE	"tests/python/test_sglang_alone.py"
#define PY_GPU		"tests/python/test_gpu_torch.py"
#define PY_SGLANG	"tests/python/test_sglang.py"
#define PY_SGLANG_VENV	"build/venv-sglang"	/* the Makefile's SG_VENV, $L3KV_SGLANG_VENV */
#define PY_SGLANG_DEADLINE_S 240	/* ~45 s: importing SGLang ~15, TP 2 workers ~25 */
#define PY_DEADLINE_S	60		/* the CPU scripts take about a second */
#define PY_GPU_DEADLINE_S 300		/* the GPU one about half a minute */
#define PY_PROBE_S	120		/* importing torch and finding CUDA */
#define PY_OUTPUT_MAX	(1U << 20)
#define PY_EXEC_FAILED	127
#define PY_SKIP		77		/* a script's "cannot run here" */
#define PY_TAIL		1500		/* of the output, in the failure message */
#define PY_NOTE		"python_gpu: "	/* lines of the GPU script echoed to stderr */

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

/* The SGLang venv: $L3KV_SGLANG_VENV (the Makefile passes SG_VENV), else PY_SGLANG_VENV. */
static const char *
py_sglang_venv(void)
{
	const char	*env = getenv("L3KV_SGLANG_VENV");

	return env != NULL && *env != '\0' ? env : PY_SGLANG_VENV;
}

/* The SGLang venv's interpreter ($L3KV_SGLANG_PYTHON overrides it, for a venv of one's own). */
static const char *
py_sglang_python(void)
{
	static char	path[PATH_MAX];
	const char	*env = getenv("L3KV_SGLANG_PYTHON");

	if (env != NULL && *env != '\0')
		return env;
	snprintf(path, sizeof(path), "%s/bin/python", py_sglang_venv());
	return path;
}

/* The child: python on the script (arg: its one argument, or NULL), stdout and stderr into out. */
static void
py_exec(int out, const char *python, const char *script, const char *arg)
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
	execlp(python, python, script, arg, (char *)NULL);
	fprintf(stderr, "exec python3: %s: %s\n", python, strerror(errno));
	_exit(PY_EXEC_FAILED);
}

/*
 * Reads the child's output until EOF or deadline_s; returns it
 * NUL-terminated (the first PY_OUTPUT_MAX bytes), and 0 or -ETIMEDOUT.
 */
static int
py_collect(int fd, int deadline_s, char **out, size_t *len)
{
	struct pollfd	 pfd = { .fd = fd, .events = POLLIN };
	time_t		 deadline = time(NULL) + deadline_s;
	char		 chunk[4096], *buf;
	size_t		 n = 0;
	ssize_t		 r;

	if ((buf = malloc(PY_OUTPUT_MAX + 1)) == NULL)
		return -ENOMEM;
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

/*
 * Runs python3 on script (with arg, or none) for at most deadline_s:
 * its output in *out (free it), its wait status in *st. Returns 0,
 * -ETIMEDOUT (the child was killed), or -errno when it could not start.
 */
static int
py_run_with(const char *python, const char *script, const char *arg, int deadline_s, char **out,
    size_t *len, int *st)
{
	pid_t	pid;
	int	pipefd[2], rc;

	*out = NULL;
	*len = 0;
	*st = 0;
	if (pipe2(pipefd, O_CLOEXEC) != 0)
		return -errno;
	if ((pid = fork()) < 0) {
		rc = -errno;
		close(pipefd[0]);
		close(pipefd[1]);
		return rc;
	}
	if (pid == 0) {
		close(pipefd[0]);
		py_exec(pipefd[1], python, script, arg);
	}
	close(pipefd[1]);
	rc = py_collect(pipefd[0], deadline_s, out, len);
	close(pipefd[0]);
	if (rc != 0)
		kill(pid, SIGKILL);
	while (waitpid(pid, st, 0) < 0 && errno == EINTR)
		;
	return rc;
}

static int
py_run(const char *script, const char *arg, int deadline_s, char **out, size_t *len, int *st)
{
	return py_run_with("python3", script, arg, deadline_s, out, len, st);
}

/* Fails the test unless script exited 0; its output is printed when it did not. */
static void
py_assert_passed(const char *script, int rc, int st, const char *output, size_t len,
    int deadline_s)
{
	ck_assert_msg(rc != -ENOMEM, "out of memory for %s's output", script);
	if (rc != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fprintf(stderr, "--- %s output ---\n%s--- end of %s output ---\n", script, output,
		    script);
	ck_assert_msg(!(WIFEXITED(st) && WEXITSTATUS(st) == PY_EXEC_FAILED &&
	    strstr(output, "exec python3:") != NULL),
	    "python3 is required for the python suite and could not be run: %s", output);
	ck_assert_msg(rc == 0, "%s ran past %d s; killed. Its output ends:\n%s", script,
	    deadline_s, output + (len > PY_TAIL ? len - PY_TAIL : 0));
	ck_assert_msg(!(WIFEXITED(st) && WEXITSTATUS(st) == PY_SKIP),
	    "%s skipped itself (exit %d) after the runner's probe said it can run here:\n%s",
	    script, PY_SKIP, output + (len > PY_TAIL ? len - PY_TAIL : 0));
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	    "%s %s %d. Its output ends:\n%s", script,
	    WIFEXITED(st) ? "exited" : "was killed by signal",
	    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
	    output + (len > PY_TAIL ? len - PY_TAIL : 0));
}

/* Runs script to the end and asserts that it passed. */
static void
py_script_passes(const char *script, int deadline_s)
{
	char	*output;
	size_t	 len;
	int	 st, rc;

	rc = py_run(script, NULL, deadline_s, &output, &len, &st);
	ck_assert_msg(output != NULL || rc == -ENOMEM, "running %s: %s", script, strerror(-rc));
	py_assert_passed(script, rc, st, output != NULL ? output : "", len, deadline_s);
	free(output);
}

START_TEST(test_python_client_passes_its_tests)
{
	py_script_passes(PY_CLIENT, PY_DEADLINE_S);
}
END_TEST

/* l3kv.sglang on a stand-in host pool: standard library only, so it runs wherever python3 does. */
START_TEST(test_python_sglang_backend_alone_passes_its_tests)
{
	py_script_passes(PY_SGLANG_ALONE, PY_DEADLINE_S);
}
END_TEST

START_TEST(test_python_torch_geometry_passes_its_tests)
{
	py_script_passes(PY_GEOMETRY, PY_DEADLINE_S);
}
END_TEST

/* The GPU engine; its PY_NOTE lines (seed, timings, inner skips) go to stderr. */
START_TEST(test_python_torch_engine_on_the_gpu)
{
	char		*output, *line, *end;
	size_t		 len;
	int		 st, rc;

	rc = py_run(PY_GPU, NULL, PY_GPU_DEADLINE_S, &output, &len, &st);
	ck_assert_msg(output != NULL || rc == -ENOMEM, "running %s: %s", PY_GPU, strerror(-rc));
	for (line = output; line != NULL && *line != '\0'; line = end != NULL ? end + 1 : NULL) {
		end = strchr(line, '\n');
		if (strncmp(line, PY_NOTE, strlen(PY_NOTE)) == 0)
			fprintf(stderr, "%.*s\n", end != NULL ? (int)(end - line) : (int)strlen(line),
			    line);
	}
	py_assert_passed(PY_GPU, rc, st, output != NULL ? output : "", len, PY_GPU_DEADLINE_S);
	free(output);
}
END_TEST

/*
 * Why the python_gpu suite cannot run here (the script's own reason when
 * it exits 77 to --probe), or NULL. A probe that fails otherwise lets the
 * suite run, so that the failure shows.
 */
const char *
python_gpu_skip_reason(void)
{
	static char	 why[256];
	char		*output, *nl;
	size_t		 len;
	int		 st, rc;

	rc = py_run(PY_GPU, "--probe", PY_PROBE_S, &output, &len, &st);
	why[0] = '\0';
	if (output == NULL)
		return NULL;
	if (rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == PY_EXEC_FAILED &&
	    strstr(output, "exec python3:") != NULL)
		snprintf(why, sizeof(why), "python3 could not be run");
	else if (rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == PY_SKIP) {
		if ((nl = strchr(output, '\n')) != NULL)
			*nl = '\0';
		snprintf(why, sizeof(why), "%s", strncmp(output, "SKIP: ", 6) == 0 ? output + 6 :
		    output);
	}
	free(output);
	return why[0] != '\0' ? why : NULL;
}

START_TEST(test_python_sglang_stack_round_trips_through_l3kvd)
{
	char	*output;
	size_t	 len;
	int	 st, rc;

	rc = py_run_with(py_sglang_python(), PY_SGLANG, NULL, PY_SGLANG_DEADLINE_S, &output, &len,
	    &st);
	ck_assert_msg(output != NULL || rc == -ENOMEM, "running %s: %s", PY_SGLANG, strerror(-rc));
	py_assert_passed(PY_SGLANG, rc, st, output != NULL ? output : "", len,
	    PY_SGLANG_DEADLINE_S);
	free(output);
}
END_TEST

/*
 * Why the python_sglang suite cannot run here, or NULL: the venv's
 * SKIPPED file (written where it could not be made), a missing
 * interpreter, or the script's own reason for --probe.
 */
const char *
python_sglang_skip_reason(void)
{
	static char	 why[512];
	char		 path[PATH_MAX], *output, *nl;
	const char	*python = py_sglang_python();
	size_t		 len;
	FILE		*f;
	int		 st, rc;

	why[0] = '\0';
#ifdef PY_ASAN
	/*
	 * Under ASan the interpreter would carry the preloaded sanitizer
	 * runtimes into torch's and SGLang's native code; the suite runs in
	 * `make check`'s build instead (CI runs both), rather than twice.
	 */
	snprintf(why, sizeof(why), "not under ASan: torch and SGLang run in `make check`'s build");
	return why;
#endif
	snprintf(path, sizeof(path), "%s/SKIPPED", py_sglang_venv());
	if (getenv("L3KV_SGLANG_PYTHON") == NULL && (f = fopen(path, "r")) != NULL) {
		if (fgets(why, sizeof(why), f) == NULL)
			snprintf(why, sizeof(why), "the SGLang venv could not be made");
		fclose(f);
		if ((nl = strchr(why, '\n')) != NULL)
			*nl = '\0';
		return why;
	}
	if (access(python, X_OK) != 0) {
		snprintf(why, sizeof(why), "no SGLang venv interpreter %s (`make check` makes it)",
		    python);
		return why;
	}
	rc = py_run_with(python, PY_SGLANG, "--probe", PY_PROBE_S, &output, &len, &st);
	if (output == NULL)
		return NULL;
	if (rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == PY_SKIP) {
		if ((nl = strchr(output, '\n')) != NULL)
			*nl = '\0';
		snprintf(why, sizeof(why), "%s", strncmp(output, "SKIP: ", 6) == 0 ? output + 6 :
		    output);
	}
	free(output);
	return why[0] != '\0' ? why : NULL;
}

Suite *
suite_python_sglang(void)
{
	Suite	*s = suite_create("python_sglang");
	TCase	*tc = tcase_create("stack");

	tcase_set_timeout(tc, PY_SGLANG_DEADLINE_S + 30);
	tcase_add_test(tc, test_python_sglang_stack_round_trips_through_l3kvd);
	suite_add_tcase(s, tc);
	return s;
}

Suite *
suite_python(void)
{
	Suite	*s = suite_create("python");
	TCase	*tc = tcase_create("client");

	tcase_set_timeout(tc, PY_DEADLINE_S + 30);
	tcase_add_test(tc, test_python_client_passes_its_tests);
	tcase_add_test(tc, test_python_torch_geometry_passes_its_tests);
	tcase_add_test(tc, test_python_sglang_backend_alone_passes_its_tests);
	suite_add_tcase(s, tc);
	return s;
}

Suite *
suite_python_gpu(void)
{
	Suite	*s = suite_create("python_gpu");
	TCase	*tc = tcase_create("torch");

	tcase_set_timeout(tc, PY_GPU_DEADLINE_S + 30);
	tcase_add_test(tc, test_python_torch_engine_on_the_gpu);
	suite_add_tcase(s, tc);
	return s;
}
