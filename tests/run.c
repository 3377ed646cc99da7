/*
 * The one test runner: adds every suite this machine can run, runs them
 * with check, and closes with a plain "N passed, N failed, N skipped"
 * line. Suites tagged gpu, rdma or slow are added only where the
 * hardware is (or L3KV_SLOW=1), gpu_torch where there is a GPU and
 * python3 has torch with CUDA, sglang where `make check` made SGLang's
 * venv, nosan (deb) where the runner is not an ASan build; a suite left
 * out is printed as skipped with its reason, never counted as passed.
 *
 * L3KV_SUITE=name runs one suite; CK_RUN_CASE/CK_RUN_SUITE also work.
 */
#include <sys/wait.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "tests.h"

/* A runner built with ASan (`make asan`): suites tagged nosan test nothing it instruments. */
#if defined(__SANITIZE_ADDRESS__)
#define RUNNER_SAN	1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RUNNER_SAN	1
#endif
#endif
#ifndef RUNNER_SAN
#define RUNNER_SAN	0
#endif

struct runner_suite {
	const char	*name;
	Suite		*(*make)(void);
	const char	*tag;		/* NULL, "gpu", "gpu_torch", "sglang", "rdma", "slow", "root",
					   "nosan",
					   "prometheus" */
};

static const struct runner_suite runner_suites[] = {
	{ "proto",	suite_proto,	NULL },
	{ "config",	suite_config,	NULL },
	{ "dram",	suite_dram,	NULL },
	{ "copy",	suite_copy,	NULL },
	{ "daemon",	suite_daemon,	NULL },
	{ "client",	suite_client,	NULL },
	{ "attach",	suite_attach,	NULL },
	{ "cache",	suite_cache,	NULL },
	{ "hybrid",	suite_hybrid,	NULL },
	{ "filetier",	suite_filetier,	NULL },
	{ "filetier_daemon", suite_filetier_daemon, NULL },
	{ "service",	suite_service,	NULL },
	{ "ctl",	suite_ctl,	NULL },
	{ "python",	suite_python,	NULL },
	{ "fabric",	suite_fabric,	NULL },
	{ "etcd",	suite_etcd,	NULL },
	{ "gpu_host",	suite_gpu_host,	NULL },
	{ "deb",	suite_deb,	"nosan" },
	{ "metrics_http", suite_metrics_http, NULL },
	{ "metrics_prom", suite_metrics_prom, "prometheus" },
	{ "root",	suite_root,	"root" },
	{ "gpu",	suite_gpu,	"gpu" },
	{ "python_gpu",	suite_python_gpu, "gpu_torch" },
	{ "python_sglang", suite_python_sglang, "sglang" },
};

/*
 * Whether a GPU is usable, asked once, in a child: CUDA does not survive
 * fork(), and check forks every test from this process, which must
 * therefore never touch CUDA itself. NULL when one is, else why not.
 */
static const char *
runner_gpu_reason(void)
{
	static char	why[256];
	static int	asked;
	char		desc[200] = "";
	int		p[2], st = 0, n = -1;
	ssize_t		r;
	pid_t		pid;

	if (asked)
		return why[0] != '\0' ? why : NULL;
	asked = 1;
	snprintf(why, sizeof(why), "GPU probe failed");
	if (pipe(p) != 0 || (pid = fork()) < 0)
		return why;
	if (pid == 0) {
		close(p[0]);
		n = kernels_device_count(desc, sizeof(desc));
		if (write(p[1], &n, sizeof(n)) != sizeof(n) || write(p[1], desc, sizeof(desc)) < 0)
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	r = read(p[0], &n, sizeof(n));
	if (r == sizeof(n) && read(p[0], desc, sizeof(desc) - 1) < 0)
		desc[0] = '\0';
	close(p[0]);
	waitpid(pid, &st, 0);
	if (r != sizeof(n))
		snprintf(why, sizeof(why), "GPU probe died (status %#x)", st);
	else if (n <= 0)
		snprintf(why, sizeof(why), "no GPU on this machine: %s", desc);
	else
		why[0] = '\0';
	return why[0] != '\0' ? why : NULL;
}

/* Why a tagged suite cannot run here, or NULL when it can. */
static const char *
runner_skip_reason(const char *tag)
{
	if (tag == NULL)
		return NULL;
	if (strcmp(tag, "slow") == 0)
		return getenv("L3KV_SLOW") ? NULL : "slow suite: set L3KV_SLOW=1";
	if (strcmp(tag, "root") == 0)
		return geteuid() == 0 ? NULL : "needs root to connect as a foreign uid";
	if (strcmp(tag, "gpu") == 0)
		return runner_gpu_reason();
	if (strcmp(tag, "gpu_torch") == 0)
		return runner_gpu_reason() != NULL ? runner_gpu_reason() : python_gpu_skip_reason();
	if (strcmp(tag, "sglang") == 0)
		return python_sglang_skip_reason();
	if (strcmp(tag, "prometheus") == 0)
		return metrics_prom_skip_reason();
	if (strcmp(tag, "rdma") == 0)
		return "no RDMA provider on this machine";
	if (strcmp(tag, "nosan") == 0)
		return RUNNER_SAN ? "sanitizer build: it builds its own packages, uninstrumented; "
		    "`make check` runs it" : NULL;
	return "unknown tag";
}

int
main(void)
{
	const char	*only = getenv("L3KV_SUITE");
	SRunner		*sr = NULL;
	size_t		 i;
	int		 failed, run, skipped = 0;

	for (i = 0; i < sizeof(runner_suites) / sizeof(runner_suites[0]); i++) {
		const struct runner_suite *rs = &runner_suites[i];
		const char *why;

		if (only != NULL && strcmp(only, rs->name) != 0)
			continue;
		if ((why = runner_skip_reason(rs->tag)) != NULL) {
			printf("SKIPPED suite %s: %s\n", rs->name, why);
			skipped++;
			continue;
		}
		if (sr == NULL)
			sr = srunner_create(rs->make());
		else
			srunner_add_suite(sr, rs->make());
	}
	if (sr == NULL) {
		printf("0 passed, 0 failed, %d skipped\n", skipped);
		return only != NULL ? 1 : 0;
	}
	skipped += test_skipped;
	srunner_run_all(sr, CK_NORMAL);
	run = srunner_ntests_run(sr);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	printf("%d passed, %d failed, %d skipped\n", run - failed, failed, skipped);
	return failed == 0 ? 0 : 1;
}
