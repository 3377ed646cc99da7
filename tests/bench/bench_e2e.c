/*
 * End-to-end GPU restore benchmark (issue 5): the latency an engine sees
 * for a 4096-token MLA FP8 restore (64 pages of 64 tokens x 61 layers x
 * 576 B = 2.25 MB objects) through a real l3kvd with copy_engine cuda,
 * socket round trips included, against one pinned cudaMemcpy of the same
 * bytes; and the same for 1024 tokens (16 pages).
 *
 * The daemon is exec'd first, on a mkdtemp socket; only then does this
 * process touch CUDA (CUDA does not survive fork, and exec leaves nothing
 * of it behind; whether there is a GPU at all is asked by a child that
 * exits at once). It then plays the engine: one layer_first device
 * buffer of E2E_POOL pages (per layer: pages x tokens x 576 B) filled
 * with random bytes, exported with a legacy CUDA IPC handle, attached
 * through libl3kv as an L3KV_MEM_CUDA_IPC region; pages 0..63 published.
 * Each run times ADMIT + RESTORE + RELEASE (blocking libl3kv calls, one
 * round trip each) into random destination pages among the other ones,
 * and the RESTORE alone. The last run of each size is checked byte for
 * byte (the whole region copied back: every destination page equal to
 * its published source, the sources unchanged), then STATS: no lease or
 * pin left, every page counted. SIGTERM must end the daemon with 0.
 *
 *   bench_e2e [-n RUNS] [-w WARMUPS] [-d DRAM_SIZE] [L3KVD]
 *
 * L3KVD: argv, else $L3KV_BUILD/l3kvd, else l3kvd beside this binary.
 * Prints a markdown table on stdout, progress on stderr. Exits 0; 2
 * without a GPU (or on bad usage); 1 on any failure: before the table
 * nothing is printed; after it (STATS, the daemon's exit) the figures
 * stand and stderr says what failed. The whole run takes ~10 s.
 */
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kernels.h"
#include "l3kv.h"
#include "bench.h"

#define E2E_TOKENS	64U
#define E2E_LAYERS	61U
#define E2E_TBYTES	576U
#define E2E_BLOCK	((size_t)E2E_TOKENS * E2E_TBYTES)	/* one page of one layer */
#define E2E_OBJ		(E2E_BLOCK * E2E_LAYERS)		/* 2.25 MB */
#define E2E_POOL	256U	/* region pages: 64 sources, destinations among the rest */
#define E2E_SRC		64U	/* pages published: 4096 tokens */
#define E2E_RUNS_MAX	1000
#define E2E_TIMEOUT_MS	20000

static uint64_t	e2e_rng = 0x9e3779b97f4a7c15ULL;
static pid_t	e2e_daemon_pid;
static int	e2e_timeline;	/* -T: the daemon's timeline of every timed RESTORE */
static unsigned	e2e_spin_us = L3KV_SPIN_AUTO;	/* -S: l3kv_set_spin on the engine's connection */

/* The stages of a RESTORE's timeline: STATS "copy"."last_restore" keys, then the client's. */
static const char *const e2e_stage[] = {
	"arrive", "handled", "submit", "first_issue", "gpu_dma_start", "last_issue",
	"gpu_dma_end", "gpu_csum_start", "gpu_csum_end", "gpu_verified", "gpu_end", "notify", "done",
	"reply",
};
#define E2E_NSTAGES	(sizeof(e2e_stage) / sizeof(e2e_stage[0]))
static const char *const e2e_stage_what[E2E_NSTAGES + 1] = {
	"the daemon's read callback that took the request",
	"restore_request() (the frame decoded, the lease found)",
	"the job handed to the copy engine (checks done)",
	"the first chunk issued (its DMA queued)",
	"GPU: the first DMA starts",
	"the last chunk issued",
	"GPU: the last DMA ends",
	"GPU: the last chunk's kernels start (past the DMA's event)",
	"GPU: its checksum kernel ended",
	"GPU: the last chunk's checksums verified",
	"GPU: the last chunk scattered into the region",
	"the last chunk's notification (host callback / waiter thread)",
	"the loop saw the op done",
	"the reply written to the socket",
	"the client has the reply",
};

static uint64_t
e2e_rnd(void)
{
	return bench_xorshift(&e2e_rng);
}

static void
e2e_fill(uint8_t *p, size_t n)
{
	uint64_t	v;

	for (; n >= 8; n -= 8, p += 8) {
		v = e2e_rnd();
		memcpy(p, &v, 8);
	}
	for (v = e2e_rnd(); n > 0; n--, v >>= 8)
		*p++ = (uint8_t)v;
}

/* Fails the run; the daemon (if any) dies with us through PR_SET_PDEATHSIG. */
static void
e2e_die(const char *what, int rc, const char *err)
{
	fprintf(stderr, "bench_e2e: %s: %d (%s)%s%s\n", what, rc, strerror(rc < 0 ? -rc : rc),
	    err != NULL && *err ? ": " : "", err != NULL ? err : "");
	if (e2e_daemon_pid > 0)
		kill(e2e_daemon_pid, SIGKILL);
	exit(1);
}

static int
e2e_cmp(const void *a, const void *b)
{
	double	x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Sorts v; the median and the nearest-rank 90th percentile. */
static void
e2e_stats(double *v, int n, double *median, double *p90)
{
	int	k = (n * 9 + 9) / 10 - 1;

	qsort(v, (size_t)n, sizeof(*v), e2e_cmp);
	*median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
	*p90 = v[k < 0 ? 0 : k];
}

/*
 * Whether there is a GPU, asked in a child so that this process has not
 * touched CUDA when it forks the daemon. Returns the device count (0:
 * none, desc says why), or -errno.
 */
static int
e2e_gpu_probe(char *desc, size_t len)
{
	ssize_t	got;
	pid_t	pid;
	int	p[2], st = 0, n;

	if (pipe(p) != 0)
		return -errno;
	if ((pid = fork()) < 0)
		return -errno;
	if (pid == 0) {
		char	d[256] = "";

		close(p[0]);
		n = kernels_device_count(d, sizeof(d));
		if (write(p[1], d, strlen(d)) < 0)
			_exit(255);
		_exit(n < 0 ? 255 : n > 100 ? 100 : n);
	}
	close(p[1]);
	got = read(p[0], desc, len - 1);
	desc[got > 0 ? got : 0] = '\0';
	close(p[0]);
	if (waitpid(pid, &st, 0) != pid)
		return -errno;
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 255)
		return -EIO;
	return WEXITSTATUS(st);
}

/* The daemon: its temporary directory, socket, config and log. */
struct e2e_daemon {
	char	dir[PATH_MAX - 32];
	char	sock[PATH_MAX];
	char	config[PATH_MAX];
	char	log[PATH_MAX];
	pid_t	pid;
};

/* Prints the last lines of the daemon's log to stderr. */
static void
e2e_log_tail(const struct e2e_daemon *d)
{
	char	buf[1200];
	size_t	n;
	FILE	*f;

	if ((f = fopen(d->log, "r")) == NULL)
		return;
	if (fseek(f, -(long)(sizeof(buf) - 1), SEEK_END) != 0)
		rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	fprintf(stderr, "bench_e2e: l3kvd log (%s) ends:\n%s\n", d->log, buf);
}

static int
e2e_log_has(const struct e2e_daemon *d, const char *needle)
{
	char	line[4096];
	int	found = 0;
	FILE	*f;

	if ((f = fopen(d->log, "r")) == NULL)
		return 0;
	while (!found && fgets(line, sizeof(line), f) != NULL)
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

/* Starts bin on a new socket; waits (up to 30 s) until it answers. */
static void
e2e_daemon_start(struct e2e_daemon *d, const char *bin, const char *dram)
{
	const char	*tmp = getenv("TMPDIR");
	struct l3kv	*k = NULL;
	double		 t0 = bench_now();
	FILE		*f;
	int		 fd, rc = -ETIMEDOUT;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "%s/l3kv-e2e-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
	if (mkdtemp(d->dir) == NULL)
		e2e_die("mkdtemp", -errno, d->dir);
	snprintf(d->sock, sizeof(d->sock), "%s/l3kvd.sock", d->dir);
	snprintf(d->config, sizeof(d->config), "%s/l3kvd.json", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/l3kvd.log", d->dir);
	if ((f = fopen(d->config, "w")) == NULL)
		e2e_die("writing the config", -errno, d->config);
	fprintf(f, "{\n  \"socket\": {\"path\": \"%s\", \"mode\": \"0600\"},\n"
	    "  \"log\": {\"level\": \"info\"},\n  \"copy_engine\": \"cuda\",\n"
	    "  \"tiers\": {\"dram\": {\"size\": \"%s\"}}\n}\n", d->sock, dram);
	if (fclose(f) != 0)
		e2e_die("writing the config", -errno, d->config);

	if ((d->pid = fork()) < 0)
		e2e_die("fork", -errno, NULL);
	if (d->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);	/* never outlives the benchmark */
		if ((fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600)) >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, "l3kvd", "-f", d->config, (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	e2e_daemon_pid = d->pid;
	/* It pins its whole DRAM arena for the GPU before it listens. */
	while (bench_now() - t0 < 30) {
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = e2e_daemon_pid = 0;
			e2e_log_tail(d);
			e2e_die("l3kvd exited at start", -ECHILD, bin);
		}
		if ((rc = l3kv_connect(d->sock, 1000, &k)) == 0)
			break;
		usleep(50000);
	}
	if (rc != 0) {
		e2e_log_tail(d);
		e2e_die("l3kvd never answered on its socket", rc, d->sock);
	}
	l3kv_close(k);
	if (!e2e_log_has(d, "cuda copy engine on GPU 0")) {
		e2e_log_tail(d);
		e2e_die("l3kvd did not start the cuda copy engine", -ENODEV, NULL);
	}
	fprintf(stderr, "bench_e2e: l3kvd up in %.1f s (%s DRAM tier pinned)\n", bench_now() - t0,
	    dram);
}

/* SIGTERM; returns the exit status (-1 unless it exited), the log tail if not 0. */
static int
e2e_daemon_stop(struct e2e_daemon *d)
{
	double	t0 = bench_now();
	pid_t	r = 0;
	int	st = 0;

	kill(d->pid, SIGTERM);
	while ((r = waitpid(d->pid, &st, WNOHANG)) == 0 && bench_now() - t0 < 15)
		usleep(10000);
	if (r == 0) {
		fprintf(stderr, "bench_e2e: l3kvd still running 15 s after SIGTERM; killed\n");
		kill(d->pid, SIGKILL);
		waitpid(d->pid, &st, 0);
		st = -1;
	}
	d->pid = e2e_daemon_pid = 0;
	if (st != -1 && WIFEXITED(st))
		st = WEXITSTATUS(st);
	else
		st = -1;
	if (st != 0)
		e2e_log_tail(d);
	if (getenv("L3KV_KEEP") == NULL) {
		unlink(d->config);
		unlink(d->log);
		unlink(d->sock);
		rmdir(d->dir);
	}
	return st;
}

/* A counter of the daemon's STATS, or -1. */
static long long
e2e_stat(struct l3kv *k, const char *section, const char *key)
{
	json_error_t	 jerr;
	json_t		*j, *v;
	char		*text = NULL;
	long long	 n = -1;

	if (l3kv_stats(k, &text) != 0)
		return -1;
	if ((j = json_loads(text, 0, &jerr)) != NULL) {
		v = json_object_get(json_object_get(j, section), key);
		if (json_is_integer(v))
			n = json_integer_value(v);
		json_decref(j);
	}
	l3kv_free(text);
	return n;
}

/* The engine's side: device memory, its host mirror, the connection. */
struct e2e_engine {
	struct l3kv	*k;
	void		*dev;		/* the region: E2E_POOL pages, layer_first */
	void		*scratch;	/* the pure copy's destination: E2E_SRC objects */
	uint8_t		*src;		/* the region's bytes as filled; registered pinned */
	uint8_t		*back;		/* the region copied back, for the check */
	size_t		 bytes;
	uint8_t		 hashes[E2E_SRC * L3KV_HASH_LEN];
	uint64_t	 request;
	uint64_t	 restored;	/* pages restored, warm-ups included */
};

static void
e2e_engine_new(struct e2e_engine *e, const char *sock)
{
	struct l3kv_publish_result	pr;
	struct l3kv_publish_page	pg[E2E_SRC];
	struct l3kv_attach_args		args;
	struct l3kv_region		reg;
	struct l3kv_pool		pool;
	double				t0;
	char				err[256] = "";
	uint32_t			i, j;
	int				rc;

	memset(e, 0, sizeof(*e));
	e->bytes = (size_t)E2E_POOL * E2E_OBJ;
	e->src = mmap(NULL, e->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	e->back = mmap(NULL, e->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (e->src == MAP_FAILED || e->back == MAP_FAILED)
		e2e_die("mmap", -errno, NULL);
	e2e_fill(e->src, e->bytes);
	if ((rc = kernels_host_register(e->src, e->bytes, err, sizeof(err))) != 0)
		e2e_die("kernels_host_register", rc, err);
	if ((rc = kernels_dev_alloc(e->bytes, &e->dev, err, sizeof(err))) != 0)
		e2e_die("kernels_dev_alloc (region)", rc, err);
	if ((rc = kernels_dev_alloc((size_t)E2E_SRC * E2E_OBJ, &e->scratch, err, sizeof(err))) != 0)
		e2e_die("kernels_dev_alloc (copy destination)", rc, err);
	if ((rc = kernels_copy(e->dev, e->src, e->bytes, err, sizeof(err))) != 0)
		e2e_die("kernels_copy to the device", rc, err);

	pool = (struct l3kv_pool){ "kv", L3KV_POOL_KV, L3KV_HIT_ALL_PAGES, 0, E2E_LAYERS, E2E_OBJ,
	    "latent:576:fp8_e4m3" };
	memset(&reg, 0, sizeof(reg));
	reg.pool = 0;
	reg.kind = L3KV_MEM_CUDA_IPC;
	reg.layout = L3KV_LAYOUT_LAYER_FIRST;
	reg.fd = -1;
	reg.size = e->bytes;
	reg.num_pages = E2E_POOL;
	reg.page_tokens = E2E_TOKENS;
	reg.layers = E2E_LAYERS;
	reg.token_bytes = E2E_TBYTES;
	reg.page_stride = E2E_BLOCK;
	reg.layer_stride = (uint64_t)E2E_POOL * E2E_BLOCK;
	reg.token_stride = E2E_TBYTES;
	if ((rc = kernels_ipc_export(e->dev, reg.handle, err, sizeof(err))) != 0)
		e2e_die("kernels_ipc_export", rc, err);
	memset(&args, 0, sizeof(args));
	args.layout = (struct l3kv_layout){ .model = "bench-e2e-mla", .kv_dtype = "fp8_e4m3",
	    .hash_scheme = "sha256", .hash_len = 32, .tp_size = 1, .dcp_size = 1, .pp_size = 1,
	    .cp_size = 1, .host_layout = L3KV_LAYOUT_PAGE_FIRST, .attention = L3KV_ATTN_MLA,
	    .page_tokens = E2E_TOKENS, .logical_page_tokens = E2E_TOKENS };
	args.pools = &pool;
	args.npools = 1;
	args.regions = &reg;
	args.nregions = 1;
	args.group = "bench-e2e";
	args.group_size = 1;
	args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	args.write = L3KV_WRITE_THROUGH;
	if ((rc = l3kv_connect(sock, 10000, &e->k)) != 0)
		e2e_die("connect", rc, NULL);
	l3kv_set_timeout(e->k, E2E_TIMEOUT_MS);
	if ((rc = l3kv_set_spin(e->k, e2e_spin_us)) != 0)
		e2e_die("l3kv_set_spin", rc, NULL);
	if ((rc = l3kv_attach(e->k, &args, NULL)) != 0)
		e2e_die("ATTACH with a CUDA IPC region", rc, l3kv_last_error(e->k));

	for (i = 0; i < E2E_SRC; i++) {
		for (j = 0; j < L3KV_HASH_LEN; j++)
			pg[i].hash[j] = (uint8_t)(e2e_rnd() | 1);
		memcpy(e->hashes + (size_t)i * L3KV_HASH_LEN, pg[i].hash, L3KV_HASH_LEN);
		pg[i].src_page = i;
	}
	t0 = bench_now();
	if ((rc = l3kv_publish(e->k, 0, pg, E2E_SRC, &pr)) != 0)
		e2e_die("PUBLISH from device memory", rc, l3kv_last_error(e->k));
	if (pr.stored != E2E_SRC || pr.bytes != (uint64_t)E2E_SRC * E2E_OBJ)
		e2e_die("PUBLISH stored too little", -EIO, NULL);
	fprintf(stderr, "bench_e2e: published %u pages (%.1f MB) in %.1f ms\n", E2E_SRC,
	    (double)pr.bytes / 1e6, (bench_now() - t0) * 1e3);
}

/* Picks n distinct destination pages among E2E_SRC..E2E_POOL-1, at random. */
static void
e2e_pick(uint32_t *dst, uint32_t n)
{
	uint32_t	all[E2E_POOL - E2E_SRC], i, j, t;

	for (i = 0; i < E2E_POOL - E2E_SRC; i++)
		all[i] = E2E_SRC + i;
	for (i = 0; i < n; i++) {
		j = i + (uint32_t)(e2e_rnd() % (E2E_POOL - E2E_SRC - i));
		t = all[i], all[i] = all[j], all[j] = t;
		dst[i] = all[i];
	}
}

/*
 * The daemon's timeline of the last RESTORE (STATS "copy"."last_restore"),
 * in us after t_send (the client's send, CLOCK_MONOTONIC like the
 * daemon's); the client's reply at E2E_NSTAGES. A stage the daemon does
 * not know is NAN.
 */
static void
e2e_timeline_of(struct e2e_engine *e, double t_send, double t_reply, double *us)
{
	json_error_t	 jerr;
	json_t		*j, *t, *v;
	char		*text = NULL;
	unsigned	 i;
	int		 rc;

	for (i = 0; i < E2E_NSTAGES; i++)
		us[i] = NAN;
	us[E2E_NSTAGES] = (t_reply - t_send) * 1e6;
	if ((rc = l3kv_stats(e->k, &text)) != 0)
		e2e_die("STATS", rc, l3kv_last_error(e->k));
	if ((j = json_loads(text, 0, &jerr)) == NULL)
		e2e_die("STATS is not JSON", -EINVAL, jerr.text);
	t = json_object_get(json_object_get(j, "copy"), "last_restore");
	for (i = 0; i < E2E_NSTAGES; i++) {
		v = json_object_get(t, e2e_stage[i]);
		if (json_is_integer(v) && json_integer_value(v) > 0)
			us[i] = ((double)json_integer_value(v) * 1e-9 - t_send) * 1e6;
	}
	json_decref(j);
	l3kv_free(text);
}

/*
 * One ADMIT + RESTORE + RELEASE of the first n published pages, or with
 * release (PROTO_RESTORE_F_RELEASE) ADMIT + RESTORE; seconds. With -T,
 * tl (E2E_NSTAGES + 1) gets the RESTORE's timeline.
 */
static void
e2e_restore_once(struct e2e_engine *e, uint32_t n, uint32_t *dst, int release, double *total,
    double *restore, double *tl)
{
	struct l3kv_restore_result	res;
	struct l3kv_restore_args	ra;
	struct l3kv_admit_result	ar;
	struct l3kv_admit_args		aa;
	double				t0, t1, t2, t3;
	int				rc;

	e2e_pick(dst, n);
	memset(&aa, 0, sizeof(aa));
	aa.request_id = ++e->request;
	aa.hashes = e->hashes;
	aa.npages = n;
	aa.reserved_pages = n;
	aa.state_slot = L3KV_SLOT_NONE;
	t0 = bench_now();
	if ((rc = l3kv_admit(e->k, &aa, &ar)) != 0)
		e2e_die("ADMIT", rc, l3kv_last_error(e->k));
	if (ar.admitted_pages != n)
		e2e_die("ADMIT promised too little", -EIO, NULL);
	memset(&ra, 0, sizeof(ra));
	ra.lease = ar.lease;
	ra.pages = dst;
	ra.npages = n;
	ra.region = 0;
	ra.state_region = L3KV_REGION_NONE;
	ra.state_slot = L3KV_SLOT_NONE;
	ra.event_region = L3KV_REGION_NONE;
	ra.flags = release ? L3KV_RESTORE_RELEASE : 0;
	t1 = bench_now();
	if ((rc = l3kv_restore_with(e->k, &ra, E2E_TIMEOUT_MS, &res)) != 0)
		e2e_die("RESTORE into device memory", rc, l3kv_last_error(e->k));
	t2 = bench_now();
	if (res.pages != n || res.partial || res.bytes != (uint64_t)n * E2E_OBJ)
		e2e_die("RESTORE answered with fewer pages", -EIO, NULL);
	if (!release && (rc = l3kv_release(e->k, ar.lease)) != 0)
		e2e_die("RELEASE", rc, l3kv_last_error(e->k));
	t3 = bench_now();
	if (release && (rc = l3kv_release(e->k, ar.lease)) != -ENOENT)
		e2e_die("RELEASE after a RESTORE with the release flag (want -ENOENT)", rc,
		    l3kv_last_error(e->k));
	*total = t3 - t0;
	*restore = t2 - t1;
	e->restored += n;
	if (tl != NULL)
		e2e_timeline_of(e, t1, t2, tl);
}

/* The region copied back: dst[i] holds published page i, the sources are unchanged. */
static void
e2e_verify(struct e2e_engine *e, const uint32_t *dst, uint32_t n)
{
	size_t		ls = (size_t)E2E_POOL * E2E_BLOCK, a, b;
	char		err[256] = "";
	uint32_t	i, l;
	int		rc;

	if ((rc = kernels_copy(e->back, e->dev, e->bytes, err, sizeof(err))) != 0)
		e2e_die("kernels_copy back", rc, err);
	for (l = 0; l < E2E_LAYERS; l++) {
		for (i = 0; i < E2E_SRC; i++) {
			a = l * ls + i * E2E_BLOCK;
			if (memcmp(e->back + a, e->src + a, E2E_BLOCK) != 0) {
				fprintf(stderr, "bench_e2e: source page %u layer %u changed\n", i, l);
				e2e_die("verify", -EIO, NULL);
			}
			if (i >= n)
				continue;
			b = l * ls + dst[i] * E2E_BLOCK;
			if (memcmp(e->back + b, e->src + a, E2E_BLOCK) != 0) {
				fprintf(stderr, "bench_e2e: restored page %u (region page %u) layer %u "
				    "differs from the published one\n", i, dst[i], l);
				e2e_die("verify", -EIO, NULL);
			}
		}
	}
}

/* One line of the table. */
struct e2e_row {
	uint32_t	pages;
	int		release;
	double		total, total90, restore, restore90, copy, copy90;	/* ms */
	double		tl[E2E_NSTAGES + 1];	/* -T: median us after the send */
};

/* The median of the known (not NAN) values of v[0..n), sorted in place; NAN if none. */
static double
e2e_median_known(double *v, int n)
{
	int	i, k = 0;

	for (i = 0; i < n; i++)
		if (!isnan(v[i]))
			v[k++] = v[i];
	if (k == 0)
		return NAN;
	qsort(v, (size_t)k, sizeof(*v), e2e_cmp);
	return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

static void
e2e_measure(struct e2e_engine *e, uint32_t n, int release, int warm, int runs,
    struct e2e_row *row)
{
	double		*tot = calloc((size_t)runs, sizeof(double));
	double		*rst = calloc((size_t)runs, sizeof(double));
	double		*cpy = calloc((size_t)runs, sizeof(double));
	double		*tl = calloc((size_t)runs * (E2E_NSTAGES + 1), sizeof(double));
	double		*col = calloc((size_t)runs, sizeof(double));
	uint32_t	 dst[E2E_SRC];
	size_t		 len = (size_t)n * E2E_OBJ;
	double		 t0, x, y;
	char		 err[256] = "";
	unsigned	 k;
	int		 i, rc;

	if (tot == NULL || rst == NULL || cpy == NULL || tl == NULL || col == NULL)
		e2e_die("calloc", -ENOMEM, NULL);
	for (i = 0; i < warm; i++)
		e2e_restore_once(e, n, dst, release, &x, &y, NULL);
	for (i = 0; i < runs; i++)
		e2e_restore_once(e, n, dst, release, &tot[i], &rst[i],
		    e2e_timeline ? tl + (size_t)i * (E2E_NSTAGES + 1) : NULL);
	e2e_verify(e, dst, n);
	/* The peak: one pinned H2D cudaMemcpy of the same bytes, from this process. */
	for (i = -warm; i < runs; i++) {
		t0 = bench_now();
		if ((rc = kernels_copy(e->scratch, e->src, len, err, sizeof(err))) != 0)
			e2e_die("kernels_copy (pinned H2D)", rc, err);
		if (i >= 0)
			cpy[i] = bench_now() - t0;
	}
	row->pages = n;
	row->release = release;
	e2e_stats(tot, runs, &row->total, &row->total90);
	e2e_stats(rst, runs, &row->restore, &row->restore90);
	e2e_stats(cpy, runs, &row->copy, &row->copy90);
	row->total *= 1e3, row->total90 *= 1e3, row->restore *= 1e3, row->restore90 *= 1e3;
	row->copy *= 1e3, row->copy90 *= 1e3;
	for (k = 0; k <= E2E_NSTAGES; k++) {
		for (i = 0; i < runs; i++)
			col[i] = e2e_timeline ? tl[(size_t)i * (E2E_NSTAGES + 1) + k] : NAN;
		row->tl[k] = e2e_median_known(col, runs);
	}
	free(tot);
	free(rst);
	free(cpy);
	free(tl);
	free(col);
}

static void
e2e_usage(void)
{
	fprintf(stderr, "usage: bench_e2e [-T] [-S SPIN_US] [-n RUNS] [-w WARMUPS] [-d DRAM_SIZE] "
	    "[L3KVD]\n"
	    "  -T: the daemon's timeline of each RESTORE (L3KV_CUDA_TIMELINE=1 for it)\n"
	    "  -S: the engine's blocking calls spin that long before they sleep, or auto (the\n"
	    "      default, L3KV_SPIN_AUTO); 0 sleeps at once (l3kv_set_spin)\n"
	    "  L3KVD defaults to $L3KV_BUILD/l3kvd, else l3kvd beside bench_e2e\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	static const uint32_t	 sizes[2] = { E2E_SRC, E2E_SRC / 4 };
	struct e2e_daemon	 d;
	struct e2e_engine	 e;
	struct e2e_row		 rows[4];
	const char		*dram = "4 GiB", *env;
	char			 bin[PATH_MAX], self[PATH_MAX], desc[256] = "", err[256] = "", spin[96];
	char			*slash;
	long long		 leases, pins, restored;
	ssize_t			 sl;
	double			 t0 = bench_now(), mb;
	int			 runs = 20, warm = 3, c, n, rc, st, bad = 0;
	unsigned		 i, k;

	while ((c = getopt(argc, argv, "TS:n:w:d:h")) != -1) {
		switch (c) {
		case 'S':
			e2e_spin_us = strcmp(optarg, "auto") == 0 ? L3KV_SPIN_AUTO :
			    (unsigned)atoi(optarg);
			break;
		case 'T':
			e2e_timeline = 1;
			break;
		case 'n':
			runs = atoi(optarg);
			break;
		case 'w':
			warm = atoi(optarg);
			break;
		case 'd':
			dram = optarg;
			break;
		default:
			e2e_usage();
		}
	}
	if (runs < 1 || runs > E2E_RUNS_MAX || warm < 0 || warm > E2E_RUNS_MAX || argc - optind > 1)
		e2e_usage();
	if (!kernels_built_with_cuda()) {
		fprintf(stderr, "bench_e2e: no GPU: built without CUDA (no nvcc at build time)\n");
		return 2;
	}
	if ((n = e2e_gpu_probe(desc, sizeof(desc))) <= 0) {
		fprintf(stderr, "bench_e2e: no GPU: %s%s\n", n < 0 ? "probing failed: " : "",
		    desc[0] ? desc : strerror(-n));
		return 2;
	}
	if (optind < argc)
		snprintf(bin, sizeof(bin), "%s", argv[optind]);
	else if ((env = getenv("L3KV_BUILD")) != NULL && *env)
		snprintf(bin, sizeof(bin), "%s/l3kvd", env);
	else if ((sl = readlink("/proc/self/exe", self, sizeof(self) - 1)) > 0 &&
	    (slash = memrchr(self, '/', (size_t)sl)) != NULL) {
		*slash = '\0';
		snprintf(bin, sizeof(bin), "%s/l3kvd", self);
	} else
		snprintf(bin, sizeof(bin), "build/l3kvd");
	if (access(bin, X_OK) != 0)
		e2e_die("no l3kvd to run", -errno, bin);
	e2e_rng ^= (uint64_t)time(NULL) << 16 ^ (uint64_t)getpid();

	/* The daemon first: this process has not touched CUDA yet. */
	if (e2e_timeline)
		setenv("L3KV_CUDA_TIMELINE", "1", 1);
	e2e_daemon_start(&d, bin, dram);
	if ((rc = kernels_init(0, err, sizeof(err))) != 0)
		e2e_die("kernels_init", rc, err);
	e2e_engine_new(&e, d.sock);
	for (i = 0; i < 4; i++) {
		fprintf(stderr, "bench_e2e: %u-token restores%s: %d warm-ups, %d runs\n",
		    sizes[i % 2] * E2E_TOKENS, i >= 2 ? " with the release flag" : "", warm, runs);
		e2e_measure(&e, sizes[i % 2], i >= 2, warm, runs, &rows[i]);
	}

	if (e2e_spin_us == L3KV_SPIN_AUTO)
		snprintf(spin, sizeof(spin), "by L3KV_SPIN_AUTO (%d us around a reply's expected time)",
		    L3KV_SPIN_AUTO_US);
	else
		snprintf(spin, sizeof(spin), "%u us before they sleep", e2e_spin_us);
	printf("## End-to-end MLA FP8 restore through l3kvd, %s\n\n", desc);
	printf("Pages of %u tokens x %u layers x %u B (%.2f MB objects), published from device "
	    "memory and restored into it (legacy CUDA IPC region, layer_first, random "
	    "destinations among %u pages); copy_engine cuda, checksums verified on the GPU; "
	    "%s DRAM tier. Median and p90 of %d runs after %d warm-ups, in ms; GB/s decimal, "
	    "of the medians. end-to-end: ADMIT + RESTORE + RELEASE, three blocking libl3kv "
	    "calls (one Unix-socket round trip each); RESTORE: that call alone; copy: one "
	    "pinned cudaMemcpy H2D of the same bytes from this process; \"+ release flag\": "
	    "ADMIT + RESTORE with L3KV_RESTORE_RELEASE, two round trips. The last run of each "
	    "row was checked byte for byte. Engine: %s%s; the client's blocking calls spin %s "
	    "(l3kv_set_spin).\n\n", E2E_TOKENS, E2E_LAYERS,
	    E2E_TBYTES, (double)E2E_OBJ / 1e6, E2E_POOL - E2E_SRC, dram, runs, warm,
	    getenv("L3KV_CUDA_NOTIFY") != NULL ? "notify by " : "default notify",
	    getenv("L3KV_CUDA_NOTIFY") != NULL ? getenv("L3KV_CUDA_NOTIFY") : "", spin);
	printf("| restore | MB | end-to-end ms (p50) | p90 | RESTORE ms (p50) | p90 | copy ms (p50) "
	    "| p90 | end-to-end / copy | RESTORE / copy | end-to-end GB/s | RESTORE GB/s | "
	    "copy GB/s |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (i = 0; i < 4; i++) {
		const struct e2e_row *r = &rows[i];

		mb = (double)r->pages * E2E_OBJ / 1e6;
		printf("| %u tokens (%u pages)%s | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | "
		    "%.3fx | %.3fx | %.1f | %.1f | %.1f |\n", r->pages * E2E_TOKENS, r->pages,
		    r->release ? ", + release flag" : "", mb,
		    r->total, r->total90, r->restore, r->restore90, r->copy, r->copy90,
		    r->total / r->copy, r->restore / r->copy, mb / r->total, mb / r->restore,
		    mb / r->copy);
	}
	if (e2e_timeline) {
		printf("\nTimeline of a RESTORE (-T: the daemon's GPU stamps on, which add a few us "
		    "of their own), median over the runs, us after the client sent the request; "
		    "the copy column is the cudaMemcpy of the same bytes for scale:\n\n");
		printf("| stage | 4096 tokens | 1024 tokens | 4096, release flag | 1024, release "
		    "flag |\n|---|---|---|---|---|\n");
		for (k = 0; k <= E2E_NSTAGES; k++) {
			printf("| %s (%s) |", k < E2E_NSTAGES ? e2e_stage[k] : "client",
			    e2e_stage_what[k]);
			for (i = 0; i < 4; i++)
				printf(" %.1f |", rows[i].tl[k]);
			printf("\n");
		}
		printf("| copy (one pinned cudaMemcpy) |");
		for (i = 0; i < 4; i++)
			printf(" %.1f |", rows[i].copy * 1e3);
		printf("\n");
	}
	fflush(stdout);

	/* Nothing held, every page counted; then a clean SIGTERM. */
	leases = e2e_stat(e.k, "cache", "leases_open");
	pins = e2e_stat(e.k, "dram", "pins");
	restored = e2e_stat(e.k, "cache", "pages_restored");
	if (leases != 0 || pins != 0 || restored != (long long)e.restored) {
		fprintf(stderr, "bench_e2e: after the runs STATS says leases_open %lld, pins %lld, "
		    "pages_restored %lld (want 0, 0, %llu)\n", leases, pins, restored,
		    (unsigned long long)e.restored);
		bad = 1;
	}
	l3kv_close(e.k);
	if ((st = e2e_daemon_stop(&d)) != 0) {
		fprintf(stderr, "bench_e2e: l3kvd exit status %d after SIGTERM, want 0\n", st);
		bad = 1;
	}
	/* Freed only once the daemon, which had it mapped, is gone. */
	kernels_dev_free(e.dev);
	kernels_dev_free(e.scratch);
	kernels_host_unregister(e.src, err, sizeof(err));
	munmap(e.src, e.bytes);
	munmap(e.back, e.bytes);
	kernels_fini();
	fprintf(stderr, "bench_e2e: %s in %.1f s\n", bad ? "FAILED (the table above stands)" :
	    "done", bench_now() - t0);
	return bad;
}
