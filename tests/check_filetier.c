/*
 * The file tier on its own: a real event_base, real files in a mkdtemp
 * directory, the module's own threads. Round trips (io_uring and O_DIRECT,
 * and the preadv fallback), restarts on a used directory, every way a file
 * can go bad after it was indexed (deleted, truncated, payload or header
 * flipped, foreign), a writer killed mid-write, ENOSPC on a 1 MiB tmpfs,
 * two tiers sharing a directory, capacity eviction around pins, and the
 * startup scan's treatment of junk. Every test removes its directory and
 * ends with the file descriptors it started with.
 */
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"
#include "tests.h"

#define KIB		1024ULL
#define MIB		(1024ULL * 1024)

static char	tdir[PATH_MAX];		/* the test's mkdtemp directory */
static char	troot[PATH_MAX];	/* tdir/cache: the tier's root */
static int	fds_before;

static const uint8_t fp_a[16] = { 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
	0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe };
static const uint8_t fp_b[16] = { 0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
	0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf };
#define NS_A	"decode/test-model-0123456789abcdef1032547698badcfe"
#define NS_B	"decode/test-model-b0b1b2b3b4b5b6b7b8b9babbbcbdbebf"

static void
setup(void)
{
	log_set_level(LOG_LEVEL_WARN);	/* a scan's summary per namespace is info */
	fds_before = test_fd_count();
	ck_assert_ptr_nonnull(test_mkdtemp(tdir, sizeof(tdir)));
	snprintf(troot, sizeof(troot), "%s/cache", tdir);
}

static void
teardown(void)
{
	test_rmtree(tdir);
	ck_assert_int_eq(test_fd_count(), fds_before);
}

/* A tier over troot with the namespaces scanned; tweak may adjust params. */
static struct filetier *
ft_open(struct event_base *base, const struct filetier_params *tweak, uint64_t *found)
{
	struct filetier_params	 p;
	struct filetier		*ft = NULL;
	uint64_t		 n = 0, nb = 0;
	char			 err[256] = "";

	if (tweak != NULL)
		p = *tweak;
	else
		filetier_params_default(&p);
	p.root = troot;
	ck_assert_msg(filetier_new(base, &p, &ft, err, sizeof(err)) == 0, "filetier_new: %s", err);
	ck_assert_msg(filetier_scan(ft, NS_A, fp_a, &n, err, sizeof(err)) == 0, "scan: %s", err);
	ck_assert_msg(filetier_scan(ft, NS_B, fp_b, &nb, err, sizeof(err)) == 0, "scan: %s", err);
	if (found != NULL)
		*found = n + nb;
	return ft;
}

static void
params_fast(struct filetier_params *p)
{
	filetier_params_default(p);
	p->tmp_stale_s = 0;
}

static void
key_of(struct obj_key *k, const uint8_t *fp, uint32_t n)
{
	uint32_t	x = n * 2654435761U + 7, j;

	memset(k, 0, sizeof(*k));
	memcpy(k->fingerprint, fp, 16);
	k->pool = 1;
	k->shard = 3;
	for (j = 0; j < sizeof(k->hash); j++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		k->hash[j] = (uint8_t)x;
	}
	memcpy(k->hash + 28, &n, sizeof(n));
}

/* Bytes that name their object: a different n gives different bytes everywhere. */
static void
fill(uint8_t *buf, uint64_t len, uint32_t n)
{
	uint64_t	i, x = n * 0x9e3779b97f4a7c15ULL + 17;

	for (i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(buf + i, &x, len - i < 8 ? len - i : 8);
	}
}

static int
intact(const uint8_t *buf, uint64_t len, uint32_t n)
{
	uint8_t	*want = malloc(len);
	int	 ok;

	ck_assert_ptr_nonnull(want);
	fill(want, len, n);
	ok = memcmp(buf, want, len) == 0;
	free(want);
	return ok;
}

static void *
abuf(uint64_t len)
{
	void	*p = aligned_alloc(4096, FILETIER_READ_SIZE(len));

	ck_assert_ptr_nonnull(p);
	memset(p, 0xee, FILETIER_READ_SIZE(len));
	return p;
}

/* Completion bookkeeping: one result per job, a counter per test. */
struct result {
	int		*count;
	int		 done;
	int		 status;
	uint64_t	 checksum;
};

static void
on_done(struct filetier_job *job)
{
	struct result	*r = job->arg;

	r->done = 1;
	r->status = job->status;
	r->checksum = job->checksum;
	(*r->count)++;
}

static void
tick_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	(void)arg;
}

/* Runs the loop until *count reaches want; fails the test after 8 s. */
static void
loop_until(struct event_base *base, const int *count, int want)
{
	struct timeval	 tv = { 0, 10000 };
	struct event	*tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
	time_t		 t0 = time(NULL);

	ck_assert_ptr_nonnull(tick);
	event_add(tick, &tv);
	while (*count < want) {
		ck_assert_msg(time(NULL) - t0 < 8, "timed out: %d of %d completions", *count, want);
		event_base_loop(base, EVLOOP_ONCE);
	}
	event_free(tick);
}

/* Runs the loop until the tier has nothing in flight (unlinks included). */
static void
loop_drain(struct event_base *base, struct filetier *ft)
{
	struct timeval	 tv = { 0, 5000 };
	struct event	*tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
	time_t		 t0 = time(NULL);

	ck_assert_ptr_nonnull(tick);
	event_add(tick, &tv);
	while (filetier_inflight(ft) > 0) {
		ck_assert_msg(time(NULL) - t0 < 8, "timed out draining %u jobs", filetier_inflight(ft));
		event_base_loop(base, EVLOOP_ONCE);
	}
	event_free(tick);
}

/* Writes object n of len bytes and waits: the completion's status. */
static int
write_wait(struct event_base *base, struct filetier *ft, const uint8_t *fp, uint32_t n,
    uint64_t len)
{
	struct obj_key	 k;
	struct result	 r = { 0 };
	uint8_t		*data = malloc(len);
	int		 count = 0, rc;

	ck_assert_ptr_nonnull(data);
	fill(data, len, n);
	key_of(&k, fp, n);
	r.count = &count;
	rc = filetier_write(ft, &k, data, len, checksum_obj(data, len), on_done, &r);
	if (rc == 0) {
		loop_until(base, &count, 1);
		rc = r.status;
	}
	free(data);
	return rc;
}

/* Reads object n and waits; on success checks every byte. */
static int
read_wait(struct event_base *base, struct filetier *ft, const uint8_t *fp, uint32_t n)
{
	struct obj_key	 k;
	struct result	 r = { 0 };
	uint64_t	 len;
	uint8_t		*dst;
	int		 count = 0, rc;

	key_of(&k, fp, n);
	if ((rc = filetier_lookup(ft, &k, NULL, &len)) != 0)
		return rc;
	dst = abuf(len);
	r.count = &count;
	rc = filetier_read(ft, &k, dst, FILETIER_READ_SIZE(len), on_done, &r, NULL);
	if (rc == 0) {
		loop_until(base, &count, 1);
		rc = r.status;
	}
	if (rc == 0) {
		ck_assert_msg(intact(dst, len, n), "object %u: bytes differ", n);
		ck_assert_msg(r.checksum == checksum_obj(dst, len), "object %u: checksum", n);
	}
	free(dst);
	return rc;
}

/* The object file's path, made here independently of the module. */
static void
obj_path(const char *ns, const uint8_t *fp, uint32_t n, char *buf, size_t len)
{
	struct obj_key	k;
	char		hex[65];
	int		i;

	key_of(&k, fp, n);
	for (i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", k.hash[i]);
	snprintf(buf, len, "%s/%s/%02x-%04x/%02x/%s.obj", troot, ns, k.pool, k.shard, k.hash[0], hex);
}

static int
file_exists(const char *path)
{
	struct stat	st;

	return lstat(path, &st) == 0;
}

static off_t
file_size(const char *path)
{
	struct stat	st;

	return stat(path, &st) == 0 ? st.st_size : -1;
}

static void
flip_byte(const char *path, off_t off)
{
	uint8_t	b;
	int	fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static int	walk_tmp, walk_obj;

static int
walk_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	const char	*base = path + ftw->base;

	(void)st;
	if (flag != FTW_F)
		return 0;
	if (strncmp(base, ".tmp-", 5) == 0)
		walk_tmp++;
	else if (strlen(base) > 4 && strcmp(base + strlen(base) - 4, ".obj") == 0)
		walk_obj++;
	return 0;
}

/* Counts temp files and object files under the root. */
static void
walk(int *tmp, int *obj)
{
	walk_tmp = walk_obj = 0;
	nftw(troot, walk_cb, 16, FTW_PHYS);
	if (tmp != NULL)
		*tmp = walk_tmp;
	if (obj != NULL)
		*obj = walk_obj;
}

static void
check_idle(struct filetier *ft)
{
	struct filetier_stats	st;

	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.pins, 0);
	ck_assert_uint_eq(st.pinned_objects, 0);
	ck_assert_uint_eq(st.writing, 0);
	ck_assert_uint_eq(st.deleting, 0);
	ck_assert_uint_eq(st.dead, 0);
	ck_assert_uint_eq(st.reads_inflight, 0);
	ck_assert_uint_eq(st.writes_inflight, 0);
}

static const uint64_t sizes[] = { 1, 2048, 4096, 36 * KIB, 256 * KIB + 100, 2304 * KIB };
#define NSIZES	(sizeof(sizes) / sizeof(sizes[0]))

static void
round_trip(const struct filetier_params *p, int want_uring)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, p, NULL);
	struct filetier_stats	 st;
	char			 path[PATH_MAX];
	int			 tmp, obj;
	unsigned		 i;

	for (i = 0; i < NSIZES; i++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, i, sizes[i]), 0);
	for (i = 0; i < NSIZES; i++) {
		ck_assert_int_eq(read_wait(base, ft, fp_a, i), 0);
		obj_path(NS_A, fp_a, i, path, sizeof(path));
		ck_assert_int_eq(file_size(path), (off_t)(FILETIER_HDR + sizes[i]));
	}
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, 0);
	ck_assert_int_eq(obj, (int)NSIZES);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.visible, NSIZES);
	ck_assert_uint_eq(st.writes, NSIZES);
	ck_assert_uint_eq(st.reads, NSIZES);
	ck_assert_uint_eq(st.read_failures, 0);
	ck_assert_uint_eq(st.readers_uring, want_uring ? p->readers : 0);
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
}

START_TEST(test_write_then_read_returns_the_exact_bytes)
{
	struct filetier_params	p;

	filetier_params_default(&p);
	round_trip(&p, 1);
}
END_TEST

START_TEST(test_preadv_buffered_readers_return_the_same_bytes)
{
	struct filetier_params	p;

	filetier_params_default(&p);
	p.io_uring = 0;
	p.direct = 0;
	p.fsync = 1;
	round_trip(&p, 0);
}
END_TEST

START_TEST(test_fresh_tier_on_a_used_directory_reads_earlier_objects)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct filetier_stats	 st;
	uint64_t		 found;
	unsigned		 i;

	for (i = 0; i < 20; i++)
		ck_assert_int_eq(write_wait(base, ft, i % 2 ? fp_a : fp_b, i, 36 * KIB + i), 0);
	filetier_free(ft);

	ft = ft_open(base, NULL, &found);
	ck_assert_uint_eq(found, 20);
	for (i = 0; i < 20; i++)
		ck_assert_int_eq(read_wait(base, ft, i % 2 ? fp_a : fp_b, i), 0);
	/* A namespace is one fingerprint: the other's keys are misses. */
	ck_assert_int_eq(read_wait(base, ft, fp_b, 1), -ENOENT);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.scan_objects, 20);
	ck_assert_uint_eq(st.scan_removed, 0);
	ck_assert_uint_eq(st.bytes_used, 20 * (FILETIER_HDR + 36 * KIB) + 190);
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

/* Damages object 0's file after it was indexed; the read must fail with want. */
static void
damaged_with(const struct filetier_params *p, void (*damage)(const char *path), int want,
    int pinned)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, p, NULL);
	struct filetier_stats	 st, before;
	struct obj_key		 k;
	char			 path[PATH_MAX];
	uint32_t		 id;

	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 40000), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 1, 40000), 0);
	filetier_stats(ft, &before);
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_lookup(ft, &k, &id, NULL), 0);
	if (pinned)
		ck_assert_int_eq(filetier_pin(ft, id), 0);
	obj_path(NS_A, fp_a, 0, path, sizeof(path));
	damage(path);

	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), want);
	ck_assert_msg(strlen(filetier_strerror(want)) > 0, "a reason for %d", want);
	/* Out of the index and off the disk: nobody finds it again. */
	ck_assert_int_eq(filetier_lookup(ft, &k, NULL, NULL), -ENOENT);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), -ENOENT);
	ck_assert(!file_exists(path));
	/* The neighbour is untouched. */
	ck_assert_int_eq(read_wait(base, ft, fp_a, 1), 0);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.read_failures, 1);
	ck_assert_uint_eq(st.drops, 1);
	ck_assert_uint_eq(st.visible, before.visible - 1);
	ck_assert_uint_eq(st.bytes_used, before.bytes_used - (FILETIER_HDR + 40000));
	if (pinned) {
		/* The holder's id stays valid until its unpin. */
		ck_assert_uint_eq(st.dead, 1);
		ck_assert_uint_eq(st.pinned_objects, 1);
		ck_assert_int_eq(filetier_pin(ft, id), -ENOENT);
		filetier_unpin(ft, id);
	}
	check_idle(ft);
	/* The key may be published again. */
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 40000), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	filetier_free(ft);
	event_base_free(base);
}

static void
damaged(void (*damage)(const char *path), int want, int pinned)
{
	damaged_with(NULL, damage, want, pinned);
}

static void
do_unlink(const char *path)
{
	ck_assert_int_eq(unlink(path), 0);
}

static void
do_truncate(const char *path)
{
	ck_assert_int_eq(truncate(path, FILETIER_HDR + 20000), 0);
}

static void
do_flip_payload(const char *path)
{
	flip_byte(path, FILETIER_HDR + 39999);
}

static void
do_flip_header(const char *path)
{
	flip_byte(path, 75);	/* the payload length */
}

static void
do_symlink(const char *path)
{
	char	other[PATH_MAX];

	obj_path(NS_A, fp_a, 1, other, sizeof(other));
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(symlink(other, path), 0);
}

/* Object 0 of namespace B, copied over object 0 of namespace A. */
static void
do_foreign(const char *path)
{
	char	cmd[3 * PATH_MAX], other[PATH_MAX];

	obj_path(NS_B, fp_b, 0, other, sizeof(other));
	ck_assert(file_exists(other));
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", other, path);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_deleted_file_fails_the_read_and_leaves_the_tier)
{
	damaged(do_unlink, -ENOENT, 0);
}
END_TEST

START_TEST(test_truncated_file_fails_the_read_and_is_removed)
{
	damaged(do_truncate, -ENODATA, 0);
}
END_TEST

START_TEST(test_preadv_readers_catch_truncated_and_corrupt_files_too)
{
	struct filetier_params	p;

	filetier_params_default(&p);
	p.io_uring = 0;
	damaged_with(&p, do_truncate, -ENODATA, 0);
	test_rmtree(tdir);
	ck_assert_int_eq(mkdir(tdir, 0700), 0);
	damaged_with(&p, do_flip_payload, -EBADMSG, 1);
}
END_TEST

START_TEST(test_payload_byte_flip_fails_the_checksum_and_is_removed)
{
	damaged(do_flip_payload, -EBADMSG, 0);
}
END_TEST

START_TEST(test_header_byte_flip_fails_and_is_removed)
{
	damaged(do_flip_header, -EUCLEAN, 0);
}
END_TEST

START_TEST(test_symlink_in_place_of_an_object_is_refused_and_removed)
{
	damaged(do_symlink, -ELOOP, 0);
}
END_TEST

START_TEST(test_pinned_object_found_corrupt_leaves_the_index_and_keeps_its_pin)
{
	damaged(do_flip_payload, -EBADMSG, 1);
}
END_TEST

START_TEST(test_foreign_fingerprint_file_is_refused_and_removed)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft;
	struct filetier_stats	 st;
	char			 a[PATH_MAX], b[PATH_MAX], cmd[3 * PATH_MAX];
	uint64_t		 found;

	/* At read time: the header names another fingerprint. */
	ft = ft_open(base, NULL, NULL);
	ck_assert_int_eq(write_wait(base, ft, fp_b, 0, 40000), 0);
	filetier_free(ft);
	event_base_free(base);
	damaged(do_foreign, -ESTALE, 0);

	/* At scan time: a foreign file in a namespace directory is a miss, and goes. */
	base = event_base_new();
	obj_path(NS_A, fp_a, 0, a, sizeof(a));
	obj_path(NS_B, fp_b, 0, b, sizeof(b));
	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'", a, b, a);
	ck_assert_int_eq(system(cmd), 0);
	ft = ft_open(base, NULL, &found);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), -ENOENT);
	ck_assert_int_eq(read_wait(base, ft, fp_b, 0), 0);
	ck_assert(!file_exists(a));
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.scan_removed, 1);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

/*
 * The child writes 1 MiB objects as fast as it can until it is killed;
 * object n's bytes are fill(n), so whatever survives can be checked.
 */
#define KILL_LEN	(512 * KIB)
#define KILL_ROUND	10000		/* keys of round r start at r * KILL_ROUND */
#define KILL_MAX	(3 * KILL_ROUND)
#define KILL_BATCH	4

static void __attribute__((noreturn))
kill_child(uint32_t first, int fsync)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft;
	struct obj_key		 k;
	struct result		 r[KILL_BATCH];
	uint8_t			*data[KILL_BATCH];
	int			 count = 0, sent = 0, i;
	uint32_t		 n;

	params_fast(&p);
	p.writers = KILL_BATCH;
	p.fsync = fsync;
	ft = ft_open(base, &p, NULL);
	for (i = 0; i < KILL_BATCH; i++)
		if ((data[i] = malloc(KILL_LEN)) == NULL)
			_exit(2);
	/* Batches of writes in parallel, so that the kill finds several half done. */
	for (n = first; n + KILL_BATCH <= first + KILL_ROUND; n += KILL_BATCH) {
		for (i = 0; i < KILL_BATCH; i++) {
			fill(data[i], KILL_LEN, n + (uint32_t)i);
			key_of(&k, fp_a, n + (uint32_t)i);
			r[i] = (struct result){ .count = &count };
			if (filetier_write(ft, &k, data[i], KILL_LEN,
			    checksum_obj(data[i], KILL_LEN), on_done, &r[i]) != 0)
				_exit(3);
			sent++;
		}
		while (count < sent)
			event_base_loop(base, EVLOOP_ONCE);
	}
	_exit(4);
}

START_TEST(test_writer_killed_mid_write_leaves_no_torn_object)
{
	struct event_base	*base;
	struct filetier		*ft;
	struct filetier_stats	 st;
	struct obj_key		 k;
	uint64_t		 found, seen = 0;
	uint32_t		 n;
	pid_t			 pid;
	int			 status, tmp_before, obj_before, tmp, obj, round;

	/* Killed while writing to the page cache, then while in fdatasync, then again. */
	for (round = 0; round < 3; round++) {
		if ((pid = fork()) == 0)
			kill_child((uint32_t)round * KILL_ROUND, round == 1);
		ck_assert_int_gt(pid, 0);
		usleep(150000 + 50000 * round);
		ck_assert_int_eq(kill(pid, SIGKILL), 0);
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert(WIFSIGNALED(status));
	}
	walk(&tmp_before, &obj_before);
	ck_assert_int_gt(obj_before, 0);

	base = event_base_new();
	ft = ft_open(base, NULL, &found);
	/* tmp_stale_s is 300 by default: a temp file may be a live writer's. */
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, tmp_before);
	filetier_free(ft);

	{
		struct filetier_params p;

		params_fast(&p);
		ft = ft_open(base, &p, &found);
	}
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, 0);
	ck_assert_uint_eq(found, (uint64_t)obj);
	for (n = 0; n < KILL_MAX && seen < found; n++) {
		key_of(&k, fp_a, n);
		if (filetier_lookup(ft, &k, NULL, NULL) != 0)
			continue;
		ck_assert_int_eq(read_wait(base, ft, fp_a, n), 0);
		seen++;
	}
	ck_assert_uint_eq(seen, found);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.read_failures, 0);
	fprintf(stderr, "filetier kill test: %d objects, %d torn temp files removed\n", obj,
	    tmp_before);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_enospc_fails_writes_cleanly_then_evicts_and_reads_go_on)
{
	struct event_base	*base;
	struct filetier		*ft;
	struct filetier_stats	 st;
	struct rlimit		 rl;
	int			 mounted, tmp, obj, want;

	/*
	 * A 1 MiB tmpfs gives a real ENOSPC. It is mounted in a mount
	 * namespace of this test's own, so a failed test cannot leave it
	 * behind. Without the right to mount, a 1 MiB RLIMIT_FSIZE makes
	 * writes fail with EFBIG instead: the same path through the module,
	 * another errno.
	 */
	ck_assert_int_eq(mkdir(troot, 0700), 0);
	mounted = unshare(CLONE_NEWNS) == 0 &&
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
	    mount("tmpfs", troot, "tmpfs", 0, "size=1m") == 0;
	if (!mounted) {
		fprintf(stderr, "filetier ENOSPC test: mount: %s; using RLIMIT_FSIZE\n",
		    strerror(errno));
		signal(SIGXFSZ, SIG_IGN);
		rl.rlim_cur = rl.rlim_max = 1 * MIB;
		ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	}
	want = mounted ? -ENOSPC : -EFBIG;
	base = event_base_new();
	ft = ft_open(base, NULL, NULL);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 64 * KIB), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 1, 2 * MIB), want);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 1), -ENOENT);
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, 0);
	ck_assert_int_eq(obj, 1);
	/* Reads go on, and so do writes that fit. */
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 2, 64 * KIB), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 2), 0);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.write_failures, 1);
	ck_assert_uint_eq(st.write_nospace, mounted ? 1 : 0);
	ck_assert_uint_eq(st.visible, 2);
	ck_assert_uint_eq(st.bytes_used, 2 * (FILETIER_HDR + 64 * KIB));
	if (mounted) {
		char		filler[PATH_MAX];
		uint64_t	cap;
		uint32_t	n;
		int		fd;

		/* Another user of the filesystem: 256 KiB beside the tier. */
		snprintf(filler, sizeof(filler), "%s/filler", troot);
		ck_assert_int_ge(fd = open(filler, O_WRONLY | O_CREAT | O_EXCL, 0600), 0);
		{
			static uint8_t	zeros[256 * KIB];

			ck_assert_int_eq(write(fd, zeros, sizeof(zeros)), (ssize_t)sizeof(zeros));
		}
		ck_assert_int_eq(close(fd), 0);

		/*
		 * Issue 11 item 9: 40 more objects than the 1 MiB can hold. The
		 * ENOSPC above set the capacity eviction keeps to to what fits
		 * (the old tier kept 64 GiB and failed these writes): the least
		 * recently used files go, and every write lands.
		 */
		for (n = 3; n < 43; n++)
			ck_assert_int_eq(write_wait(base, ft, fp_a, n, 64 * KIB), 0);
		ck_assert_int_eq(read_wait(base, ft, fp_a, 42), 0);
		filetier_stats(ft, &st);
		ck_assert_uint_eq(st.write_failures, 1);
		ck_assert_uint_gt(st.evictions, 0);
		ck_assert_uint_eq(st.visible + st.evictions, 42);
		ck_assert_uint_le(st.bytes_capacity_effective, 1 * MIB);
		ck_assert_uint_lt(st.bytes_capacity_effective, st.bytes_capacity);
		walk(&tmp, &obj);
		ck_assert_int_eq(tmp, 0);
		ck_assert_int_eq(obj, (int)st.visible);
		/* The other user leaves: within a second the tier may use that room again. */
		cap = st.bytes_capacity_effective;
		ck_assert_int_eq(unlink(filler), 0);
		usleep(1100 * 1000);
		ck_assert_int_eq(write_wait(base, ft, fp_a, 43, 64 * KIB), 0);
		filetier_stats(ft, &st);
		ck_assert_uint_ge(st.bytes_capacity_effective, cap + 200 * KIB);
		ck_assert_uint_eq(st.write_failures, 1);
	}
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
	if (mounted)
		ck_assert_int_eq(umount(troot), 0);
}
END_TEST

/*
 * Issue 11 item 9: the namespace directory, then the whole root, deleted
 * while the tier runs. Writes used to fail with ENOENT until a restart;
 * now the writer that meets the missing directory makes it again (with
 * its pool directories) and the write lands, readable at once.
 */
START_TEST(test_deleted_namespace_directory_is_made_again_by_the_next_write)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct filetier_stats	 st;
	char			 dir[PATH_MAX];
	int			 tmp, obj;

	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 64 * KIB), 0);
	snprintf(dir, sizeof(dir), "%s/%s", troot, NS_A);
	ck_assert_int_eq(test_rmtree(dir), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 1, 64 * KIB), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 1), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 2, 64 * KIB), 0);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.dirs_recreated, 1);
	ck_assert_uint_eq(st.write_failures, 0);
	/* The root itself goes: made again too. */
	ck_assert_int_eq(test_rmtree(troot), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 3, 64 * KIB), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 3), 0);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.dirs_recreated, 2);
	ck_assert_uint_eq(st.write_failures, 0);
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, 0);
	ck_assert_int_eq(obj, 1);
	/* Object 0's file went with its directory: its read fails it as lost. */
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), -ENOENT);
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

#define SHARE_N		48
#define SHARE_LEN	(256 * KIB + 123)

START_TEST(test_two_tiers_writing_the_same_keys_are_harmless)
{
	struct event_base	*base = event_base_new();
	struct filetier		*a = ft_open(base, NULL, NULL), *b = ft_open(base, NULL, NULL), *c;
	struct result		 rr[SHARE_N], wr[SHARE_N];
	struct obj_key		 k;
	uint8_t			*data[SHARE_N], *dst[SHARE_N];
	uint64_t		 found;
	int			 reads = 0, writes = 0, round, tmp, obj;
	unsigned		 i;

	for (i = 0; i < SHARE_N; i++) {
		data[i] = malloc(SHARE_LEN);
		ck_assert_ptr_nonnull(data[i]);
		fill(data[i], SHARE_LEN, i);
		dst[i] = abuf(SHARE_LEN);
		ck_assert_int_eq(write_wait(base, a, fp_a, i, SHARE_LEN), 0);
	}
	/* b rewrites every key (renames over a's files) while a reads them, three times. */
	for (i = 0; i < SHARE_N; i++) {
		key_of(&k, fp_a, i);
		wr[i] = (struct result){ .count = &writes };
		ck_assert_int_eq(filetier_write(b, &k, data[i], SHARE_LEN,
		    checksum_obj(data[i], SHARE_LEN), on_done, &wr[i]), 0);
	}
	for (round = 0; round < 3; round++) {
		for (i = 0; i < SHARE_N; i++) {
			key_of(&k, fp_a, i);
			rr[i] = (struct result){ .count = &reads };
			ck_assert_int_eq(filetier_read(a, &k, dst[i], FILETIER_READ_SIZE(SHARE_LEN),
			    on_done, &rr[i], NULL), 0);
		}
		loop_until(base, &reads, (round + 1) * SHARE_N);
		for (i = 0; i < SHARE_N; i++) {
			ck_assert_msg(rr[i].status == 0, "round %d object %u: %s", round, i,
			    filetier_strerror(rr[i].status));
			ck_assert(memcmp(dst[i], data[i], SHARE_LEN) == 0);
		}
	}
	loop_until(base, &writes, SHARE_N);
	for (i = 0; i < SHARE_N; i++)
		ck_assert_int_eq(wr[i].status, 0);
	/* Both indexes hold every key; a third tier finds each once, whole. */
	c = ft_open(base, NULL, &found);
	ck_assert_uint_eq(found, SHARE_N);
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, 0);
	ck_assert_int_eq(obj, SHARE_N);
	for (i = 0; i < SHARE_N; i++) {
		ck_assert_int_eq(read_wait(base, c, fp_a, i), 0);
		ck_assert_int_eq(read_wait(base, b, fp_a, i), 0);
		free(data[i]);
		free(dst[i]);
	}
	check_idle(a);
	check_idle(b);
	filetier_free(c);
	filetier_free(b);
	filetier_free(a);
	event_base_free(base);
}
END_TEST

#define CAP_LEN		(60 * KIB)	/* a 64 KiB file */

START_TEST(test_capacity_evicts_lru_but_never_a_pinned_object)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft;
	struct filetier_stats	 st;
	struct obj_key		 k;
	char			 path[PATH_MAX];
	uint32_t		 id0, ids[32];
	size_t			 nids, i;
	unsigned		 n;

	filetier_params_default(&p);
	p.capacity = 1 * MIB;		/* 16 objects */
	ft = ft_open(base, &p, NULL);
	for (n = 0; n < 16; n++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, n, CAP_LEN), 0);
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_lookup(ft, &k, &id0, NULL), 0);
	ck_assert_int_eq(filetier_pin(ft, id0), 0);		/* the oldest, pinned */
	ck_assert_int_eq(read_wait(base, ft, fp_a, 1), 0);	/* the next, used again */
	for (n = 16; n < 19; n++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, n, CAP_LEN), 0);
	loop_drain(base, ft);
	for (n = 0; n < 19; n++) {
		int gone = n >= 2 && n <= 4;

		key_of(&k, fp_a, n);
		obj_path(NS_A, fp_a, n, path, sizeof(path));
		ck_assert_msg((filetier_lookup(ft, &k, NULL, NULL) == 0) == !gone, "object %u", n);
		ck_assert_msg(file_exists(path) == !gone, "object %u on disk", n);
	}
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.evictions, 3);
	ck_assert_uint_eq(st.bytes_used, 1 * MIB);

	/* Everything pinned: a write is refused and nothing is evicted. */
	nids = filetier_lru_order(ft, ids, 32);
	ck_assert_uint_eq(nids, 15);
	for (i = 0; i < nids; i++)
		ck_assert_int_eq(filetier_pin(ft, ids[i]), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 99, CAP_LEN), -ENOSPC);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.evictions, 3);
	ck_assert_uint_eq(st.evict_failures, 1);
	ck_assert_uint_eq(st.visible, 16);
	/* A write larger than the whole capacity is refused outright. */
	ck_assert_int_eq(write_wait(base, ft, fp_a, 98, 2 * MIB), -EFBIG);
	for (i = 0; i < nids; i++)
		filetier_unpin(ft, ids[i]);
	filetier_unpin(ft, id0);
	/*
	 * An unpin is a use: the objects went back in the order they were
	 * unpinned, object 0 last, so the victim is object 5.
	 */
	ck_assert_int_eq(write_wait(base, ft, fp_a, 99, CAP_LEN), 0);
	loop_drain(base, ft);
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_lookup(ft, &k, NULL, NULL), 0);
	key_of(&k, fp_a, 5);
	ck_assert_int_eq(filetier_lookup(ft, &k, NULL, NULL), -ENOENT);
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

static void
write_file(const char *path, const void *buf, size_t len)
{
	int	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

START_TEST(test_scan_skips_and_removes_junk)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct filetier_stats	 st;
	char			 o[6][PATH_MAX], path[PATH_MAX + 32], cmd[3 * PATH_MAX];
	uint64_t		 found;
	int			 i;

	for (i = 0; i < 3; i++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, (uint32_t)i, 5000), 0);
	filetier_free(ft);
	for (i = 0; i < 6; i++)
		obj_path(NS_A, fp_a, (uint32_t)i, o[i], sizeof(o[i]));

	/* In object 0's directory: a torn temp file, a stray file, a directory. */
	snprintf(path, sizeof(path), "%.*s/.tmp-0123456789abcdef", (int)(strrchr(o[0], '/') - o[0]),
	    o[0]);
	write_file(path, "torn", 4);
	snprintf(path, sizeof(path), "%.*s/README", (int)(strrchr(o[0], '/') - o[0]), o[0]);
	write_file(path, "hi", 2);
	snprintf(path, sizeof(path), "%.*s/sub", (int)(strrchr(o[0], '/') - o[0]), o[0]);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	/* Object 1: a damaged header. Object 3: object 2's file under 3's name. */
	flip_byte(o[1], 20);
	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'", o[3], o[2], o[3]);
	ck_assert_int_eq(system(cmd), 0);
	/* Object 4: object 2's file with a byte appended. Object 5: a symlink. */
	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s' && printf x >> '%s'"
	    " && mkdir -p \"$(dirname '%s')\" && ln -s '%s' '%s'", o[4], o[2], o[4], o[4], o[5],
	    o[2], o[5]);
	ck_assert_int_eq(system(cmd), 0);
	/* Above the object directories: left alone. */
	snprintf(path, sizeof(path), "%s/%s/notes.txt", troot, NS_A);
	write_file(path, "keep", 4);
	snprintf(path, sizeof(path), "%s/%s/01-0003/zz", troot, NS_A);
	write_file(path, "keep", 4);
	params_fast(&p);
	ft = ft_open(base, &p, &found);
	ck_assert_uint_eq(found, 2);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 2), 0);
	for (i = 1; i < 6; i++) {
		if (i == 2)
			continue;
		ck_assert_int_eq(read_wait(base, ft, fp_a, (uint32_t)i), -ENOENT);
		ck_assert_msg(!file_exists(o[i]), "object %d's file is still there", i);
	}
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.scan_removed, 6);	/* temp, README, 1, 3, 4, 5 */
	ck_assert_uint_eq(st.scan_skipped, 3);	/* sub, notes.txt, zz */
	snprintf(path, sizeof(path), "%s/%s/notes.txt", troot, NS_A);
	ck_assert(file_exists(path));
	snprintf(path, sizeof(path), "%.*s/sub", (int)(strrchr(o[0], '/') - o[0]), o[0]);
	ck_assert(file_exists(path));
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_restart_lru_order_follows_write_time)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct timespec		 ts[2];
	struct obj_key		 k;
	char			 path[PATH_MAX];
	uint32_t		 ids[8], id;
	unsigned		 n;

	for (n = 0; n < 5; n++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, n, 100), 0);
	filetier_free(ft);
	/* Object 4 is the oldest write, object 0 the newest. */
	for (n = 0; n < 5; n++) {
		obj_path(NS_A, fp_a, n, path, sizeof(path));
		ts[0].tv_sec = ts[1].tv_sec = 1700000000 - (time_t)n * 60;
		ts[0].tv_nsec = ts[1].tv_nsec = 0;
		ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
	}
	ft = ft_open(base, NULL, NULL);
	ck_assert_uint_eq(filetier_lru_order(ft, ids, 8), 5);
	for (n = 0; n < 5; n++) {
		key_of(&k, fp_a, 4 - n);
		ck_assert_int_eq(filetier_lookup(ft, &k, &id, NULL), 0);
		ck_assert_uint_eq(ids[n], id);
	}
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_lookup_has_no_side_effects)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct filetier_stats	 before, after;
	struct obj_key		 k;
	uint32_t		 o1[8], o2[8], id;
	uint64_t		 len;
	size_t			 n1, n2;
	unsigned		 n;

	for (n = 0; n < 4; n++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, n, 1000 + n), 0);
	n1 = filetier_lru_order(ft, o1, 8);
	filetier_stats(ft, &before);
	for (n = 0; n < 4; n++) {
		key_of(&k, fp_a, n);
		ck_assert_int_eq(filetier_lookup(ft, &k, &id, &len), 0);
		ck_assert_uint_eq(len, 1000 + n);
	}
	key_of(&k, fp_a, 77);
	ck_assert_int_eq(filetier_lookup(ft, &k, &id, &len), -ENOENT);
	n2 = filetier_lru_order(ft, o2, 8);
	filetier_stats(ft, &after);
	ck_assert_uint_eq(n1, n2);
	ck_assert(memcmp(o1, o2, n1 * sizeof(*o1)) == 0);
	ck_assert(memcmp(&before, &after, sizeof(before)) == 0);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_bad_writes_and_reads_are_refused_with_nothing_changed)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft;
	struct filetier_stats	 st;
	struct result		 r[4];
	struct obj_key		 k;
	uint8_t			 data[100], *dst = abuf(8192);
	int			 count = 0, tmp, obj, i;
	uint8_t			 fp_c[16];

	filetier_params_default(&p);
	p.write_queue = 2;
	ft = ft_open(base, &p, NULL);
	fill(data, sizeof(data), 0);
	for (i = 0; i < 4; i++)
		r[i] = (struct result){ .count = &count };
	/* The third write while two are queued: refused, not queued. */
	for (i = 0; i < 3; i++) {
		key_of(&k, fp_a, (uint32_t)i);
		ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data),
		    checksum_obj(data, sizeof(data)), on_done, &r[i]), i < 2 ? 0 : -EAGAIN);
	}
	/* A key being written or present is refused: one writer per key. */
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data), 0, on_done, &r[3]), -EEXIST);
	loop_until(base, &count, 2);
	ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data), 0, on_done, &r[3]), -EEXIST);
	/* Unscanned namespace, padding, sizes, arguments. */
	memset(fp_c, 0xcc, sizeof(fp_c));
	key_of(&k, fp_c, 0);
	ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data), 0, on_done, &r[3]), -ESRCH);
	key_of(&k, fp_a, 5);
	k.pad = 1;
	ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data), 0, on_done, &r[3]), -EINVAL);
	k.pad = 0;
	ck_assert_int_eq(filetier_write(ft, &k, data, 0, 0, on_done, &r[3]), -EINVAL);
	ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data), 0, NULL, NULL), -EINVAL);
	ck_assert_int_eq(filetier_write(ft, &k, data, FILETIER_OBJ_MAX + 1, 0, on_done, &r[3]),
	    -EFBIG);
	/* Bytes that do not match their checksum are never made durable. */
	r[3] = (struct result){ .count = &count };
	ck_assert_int_eq(filetier_write(ft, &k, data, sizeof(data), 12345, on_done, &r[3]), 0);
	loop_until(base, &count, 3);
	ck_assert_int_eq(r[3].status, -EBADMSG);
	ck_assert_int_eq(filetier_lookup(ft, &k, NULL, NULL), -ENOENT);
	/* Reads: a miss, a misaligned or short destination. */
	ck_assert_int_eq(filetier_read(ft, &k, dst, 8192, on_done, &r[3], NULL), -ENOENT);
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_read(ft, &k, dst + 512, 4096, on_done, &r[3], NULL), -EINVAL);
	ck_assert_int_eq(filetier_read(ft, &k, dst, 99, on_done, &r[3], NULL), -EMSGSIZE);
	ck_assert_int_eq(filetier_read(ft, &k, dst, 4096, NULL, NULL, NULL), -EINVAL);
	walk(&tmp, &obj);
	ck_assert_int_eq(tmp, 0);
	ck_assert_int_eq(obj, 2);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.visible, 2);
	ck_assert_uint_eq(st.writes_refused, 1);
	ck_assert_uint_eq(st.writes_present, 2);
	ck_assert_uint_eq(st.write_failures, 1);
	ck_assert_uint_eq(st.bytes_used, 2 * (FILETIER_HDR + sizeof(data)));
	check_idle(ft);
	free(dst);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_namespace_names_are_checked_before_any_path_is_made)
{
	static const char *const bad[] = {
		"", "decode", "decode/", "/test-model-0123456789abcdef1032547698badcfe",
		"../test-model-0123456789abcdef1032547698badcfe",
		"./test-model-0123456789abcdef1032547698badcfe",
		"decode/../test-model-0123456789abcdef1032547698badcfe",
		"decode/x/test-model-0123456789abcdef1032547698badcfe",
		"decode/te st-0123456789abcdef1032547698badcfe",
		"decode/test-model-0123456789ABCDEF1032547698BADCFE",
		"decode/test-model-0123456789abcdef1032547698badcff",	/* another fingerprint */
		"decode/test-model0123456789abcdef1032547698badcfe",
		"decode/0123456789abcdef1032547698badcfe",
	};
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft = NULL;
	struct stat		 st;
	uint64_t		 n;
	char			 err[256], path[PATH_MAX];
	size_t			 i;
	int			 entries = 0;
	DIR			*d;

	filetier_params_default(&p);
	p.root = troot;
	ck_assert_int_eq(filetier_new(base, &p, &ft, err, sizeof(err)), 0);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		ck_assert_msg(filetier_scan(ft, bad[i], fp_a, &n, err, sizeof(err)) == -EINVAL,
		    "accepted \"%s\"", bad[i]);
		ck_assert_msg(strstr(err, "namespace") != NULL, "no reason for \"%s\"", bad[i]);
	}
	/* Nothing was made: the root is empty, and nothing appeared beside it. */
	ck_assert_ptr_nonnull(d = opendir(troot));
	while (readdir(d) != NULL)
		entries++;
	closedir(d);
	ck_assert_int_eq(entries, 2);
	snprintf(path, sizeof(path), "%s/test-model-0123456789abcdef1032547698badcfe", tdir);
	ck_assert_int_ne(stat(path, &st), 0);
	/* A good name scans; the same again answers from memory. */
	ck_assert_int_eq(filetier_scan(ft, NS_A, fp_a, &n, err, sizeof(err)), 0);
	ck_assert_int_eq(filetier_scan(ft, NS_A, fp_a, &n, err, sizeof(err)), 0);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST


/*
 * Issue 11 item 8: a directory of the tier swapped for a symbolic link
 * to a directory outside the root. Nothing there may be read, created or
 * deleted: not by a read (before: it read the file there, and unlinked it
 * when it was bad), a write (before: it made its object there), an
 * unlink of the tier's own (eviction, drop), nor by a scan that listed
 * the directory before the swap and reopens it by path after.
 */

/* Every file under dir, by path relative to it, size and bytes: a digest of the tree. */
static uint64_t	tree_digest;
static unsigned	tree_files;
static size_t	tree_skip;

static int
tree_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	uint8_t	*buf;
	int	 fd;

	(void)ftw;
	tree_digest = tree_digest * 31 + checksum_obj(path + tree_skip, strlen(path + tree_skip));
	if (flag != FTW_F && flag != FTW_SL)
		return 0;
	tree_files++;
	if (flag == FTW_SL || st->st_size == 0)
		return 0;
	ck_assert_ptr_nonnull(buf = malloc((size_t)st->st_size));
	ck_assert_int_ge(fd = open(path, O_RDONLY), 0);
	ck_assert_int_eq(read(fd, buf, (size_t)st->st_size), st->st_size);
	close(fd);
	tree_digest = tree_digest * 31 + checksum_obj(buf, (uint64_t)st->st_size);
	free(buf);
	return 0;
}

static uint64_t
tree_of(const char *dir, unsigned *files)
{
	tree_digest = 17;
	tree_files = 0;
	tree_skip = strlen(dir);
	ck_assert_int_eq(nftw(dir, tree_cb, 16, FTW_PHYS), 0);
	*files = tree_files;
	return tree_digest;
}

static void
put_file(const char *dir, const char *name, const char *text)
{
	char	path[PATH_MAX];
	int	fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	ck_assert_int_ge(fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600), 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/*
 * Junk that a scan removes from a leaf directory of its own: a stale temp
 * file and a file named like an object that is not one. Outside the
 * tier, it must stay.
 */
static void
plant_junk(const char *leaf, const struct obj_key *k)
{
	char	name[80];
	int	i;

	put_file(leaf, ".tmp-00000000deadbeef", "a stale temp file");
	for (i = 0; i < 32; i++)
		snprintf(name + 2 * i, 3, "%02x", i == 0 ? k->hash[0] : 0x5a);
	strcat(name, ".obj");
	put_file(leaf, name, "not an object");
	put_file(leaf, "notes.txt", "an operator's notes");
}

/* Moves troot/rel to tdir/outside/rel's base name and puts a link to it in its place. */
static void
swap_for_link(const char *rel, char *target, size_t len)
{
	char		 from[PATH_MAX];
	const char	*base = strrchr(rel, '/');

	snprintf(from, sizeof(from), "%s/%s", troot, rel);
	snprintf(target, len, "%s/outside/%s", tdir, base != NULL ? base + 1 : rel);
	ck_assert_int_eq(rename(from, target), 0);
	ck_assert_int_eq(symlink(target, from), 0);
}

/* The link's undoing: the directory is back in the tier. */
static void
unswap(const char *rel, const char *target)
{
	char	from[PATH_MAX];

	snprintf(from, sizeof(from), "%s/%s", troot, rel);
	ck_assert_int_eq(unlink(from), 0);
	ck_assert_int_eq(rename(target, from), 0);
}

/* A key of object n moved into the leaf directory of k. */
static void
key_beside(struct obj_key *out, const struct obj_key *k, uint32_t n)
{
	key_of(out, k->fingerprint, n);
	out->hash[0] = k->hash[0];
}

static int
write_key_wait(struct event_base *base, struct filetier *ft, const struct obj_key *k,
    uint32_t n)
{
	struct result	 r = { 0 };
	uint8_t		*data = malloc(40000);
	int		 count = 0, rc;

	ck_assert_ptr_nonnull(data);
	fill(data, 40000, n);
	r.count = &count;
	rc = filetier_write(ft, k, data, 40000, checksum_obj(data, 40000), on_done, &r);
	if (rc == 0) {
		loop_until(base, &count, 1);
		rc = r.status;
	}
	free(data);
	return rc;
}

/*
 * level: 0 the pool directory, 1 the leaf directory of object 0's key is
 * the link; walk: paths walked a component at a time, as on kernels
 * without openat2 (and readers on preadv).
 */
static void
symlinked_dir(int level, int walk)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft;
	struct obj_key		 k0, kb, kn;
	uint64_t		 digest, n;
	unsigned		 files, files2, i;
	uint32_t		 id;
	char			 rel[PATH_MAX], target[PATH_MAX], outside[PATH_MAX], leaf[PATH_MAX];
	char			 err[256];

	params_fast(&p);
	p.openat2 = !walk;
	ft = ft_open(base, &p, NULL);
	key_of(&k0, fp_a, 0);
	key_beside(&kb, &k0, 50);
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, i, 40000), 0);
	ck_assert_int_eq(write_key_wait(base, ft, &kb, 50), 0);
	if (level == 0)
		snprintf(rel, sizeof(rel), NS_A "/%02x-%04x", k0.pool, k0.shard);
	else
		snprintf(rel, sizeof(rel), NS_A "/%02x-%04x/%02x", k0.pool, k0.shard, k0.hash[0]);
	snprintf(outside, sizeof(outside), "%s/outside", tdir);
	ck_assert_int_eq(mkdir(outside, 0700), 0);
	swap_for_link(rel, target, sizeof(target));
	if (level == 0)
		snprintf(leaf, sizeof(leaf), "%s/%02x", target, k0.hash[0]);
	else
		snprintf(leaf, sizeof(leaf), "%s", target);
	plant_junk(leaf, &k0);
	digest = tree_of(outside, &files);

	/* A read through the link fails, and nothing there is unlinked, bad or not. */
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), -ELOOP);
	ck_assert_int_eq(filetier_lookup(ft, &k0, NULL, NULL), -ENOENT);
	/* A write into it fails and makes nothing there. */
	key_beside(&kn, &k0, 60);
	ck_assert_int_lt(write_key_wait(base, ft, &kn, 60), 0);
	/* The tier's own unlink (a drop, as an eviction would) goes nowhere through it. */
	ck_assert_int_eq(filetier_lookup(ft, &kb, &id, NULL), 0);
	filetier_drop(ft, id);
	loop_drain(base, ft);
	ck_assert_uint_eq(tree_of(outside, &files2), digest);
	ck_assert_uint_eq(files2, files);
	filetier_free(ft);

	/* A fresh tier's scan, the link in place: skipped, the target untouched. */
	ft = ft_open(base, &p, NULL);
	ck_assert_uint_eq(tree_of(outside, &files2), digest);
	filetier_free(ft);

	/*
	 * A scan that listed the real directory, which is swapped for the link
	 * before the scan reads it (testing.scan_delay_ms holds the scan before
	 * each leaf directory).
	 */
	unswap(rel, target);
	p.scan_delay_ms = 300;
	p.root = troot;
	ck_assert_int_eq(filetier_new(base, &p, &ft, err, sizeof(err)), 0);
	ck_assert_int_eq(filetier_scan_start(ft, NS_A, fp_a, err, sizeof(err)), 0);
	usleep(100 * 1000);
	swap_for_link(rel, target, sizeof(target));
	while (filetier_scan_state(ft, fp_a, &n) == 1)
		event_base_loop(base, EVLOOP_ONCE);
	ck_assert_uint_eq(tree_of(outside, &files2), digest);
	ck_assert_uint_eq(files2, files);
	filetier_free(ft);
	event_base_free(base);
}

START_TEST(test_symlinked_pool_dir_leads_nothing_outside_the_tier)
{
	symlinked_dir(0, 0);
}
END_TEST

START_TEST(test_symlinked_leaf_dir_leads_nothing_outside_the_tier)
{
	symlinked_dir(1, 0);
}
END_TEST

START_TEST(test_symlinked_dirs_lead_nothing_outside_without_openat2)
{
	symlinked_dir(0, 1);
	test_rmtree(tdir);
	ck_assert_int_eq(mkdir(tdir, 0700), 0);
	symlinked_dir(1, 1);
}
END_TEST

/*
 * The namespace's directory, or its role's, a link to a directory outside
 * the root: the namespace cannot be registered (the error says why), a
 * write to it is refused, and nothing under the link's target changes.
 */
START_TEST(test_symlinked_namespace_dir_is_refused_and_its_target_untouched)
{
	static const char *const rels[] = { NS_A, "decode" };
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft;
	struct obj_key		 k0;
	uint64_t		 digest, n;
	unsigned		 files, files2, i;
	char			 target[PATH_MAX], outside[PATH_MAX], leaf[PATH_MAX], err[256];
	int			 rc;
	uint8_t			 data[4096];

	params_fast(&p);
	p.root = troot;
	ft = ft_open(base, &p, NULL);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 40000), 0);
	filetier_free(ft);
	key_of(&k0, fp_a, 0);
	snprintf(outside, sizeof(outside), "%s/outside", tdir);
	ck_assert_int_eq(mkdir(outside, 0700), 0);
	for (i = 0; i < 2; i++) {
		swap_for_link(rels[i], target, sizeof(target));
		snprintf(leaf, sizeof(leaf), "%s/%s%02x-%04x/%02x", target,
		    i == 0 ? "" : "test-model-0123456789abcdef1032547698badcfe/", k0.pool, k0.shard,
		    k0.hash[0]);
		plant_junk(leaf, &k0);
		digest = tree_of(outside, &files);
		ck_assert_int_eq(filetier_new(base, &p, &ft, err, sizeof(err)), 0);
		err[0] = '\0';
		rc = filetier_scan(ft, NS_A, fp_a, &n, err, sizeof(err));
		ck_assert_msg(rc == -ELOOP || rc == -ENOTDIR, "scan through a link: %d %s", rc, err);
		ck_assert_msg(strstr(err, "symbolic link") != NULL, "%s", err);
		ck_assert_int_eq(filetier_lookup(ft, &k0, NULL, NULL), -ENOENT);
		memset(data, 1, sizeof(data));
		ck_assert_int_eq(filetier_write(ft, &k0, data, sizeof(data),
		    checksum_obj(data, sizeof(data)), on_done, NULL), -ESRCH);
		filetier_free(ft);
		ck_assert_uint_eq(tree_of(outside, &files2), digest);
		ck_assert_uint_eq(files2, files);
		unswap(rels[i], target);
		/* The junk was planted inside what is now the tier again: clear it for the next. */
		test_rmtree(tdir);
		ck_assert_int_eq(mkdir(tdir, 0700), 0);
		ck_assert_int_eq(mkdir(outside, 0700), 0);
		ft = ft_open(base, &p, NULL);
		ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 40000), 0);
		filetier_free(ft);
	}
	event_base_free(base);
}
END_TEST

/*
 * An object file that is a link to a valid copy outside the tier: the
 * scan removes the link and indexes nothing for it, and the copy (its
 * target) stays, byte for byte.
 */
START_TEST(test_symlinked_object_is_removed_and_its_target_untouched)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft;
	uint64_t		 digest, found;
	unsigned		 files, files2;
	char			 path[PATH_MAX], outside[PATH_MAX], copy[PATH_MAX], cmd[3 * PATH_MAX];

	ft = ft_open(base, NULL, NULL);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 40000), 0);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 1, 40000), 0);
	filetier_free(ft);
	obj_path(NS_A, fp_a, 0, path, sizeof(path));
	snprintf(outside, sizeof(outside), "%s/outside", tdir);
	snprintf(copy, sizeof(copy), "%s/copy.obj", outside);
	ck_assert_int_eq(mkdir(outside, 0700), 0);
	snprintf(cmd, sizeof(cmd), "mv '%s' '%s'", path, copy);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(symlink(copy, path), 0);
	digest = tree_of(outside, &files);
	ft = ft_open(base, NULL, &found);
	ck_assert_uint_eq(found, 1);
	ck_assert(!file_exists(path));
	ck_assert_int_eq(read_wait(base, ft, fp_a, 1), 0);
	filetier_free(ft);
	ck_assert_uint_eq(tree_of(outside, &files2), digest);
	ck_assert_uint_eq(files2, 1);
	event_base_free(base);
}
END_TEST


/*
 * Issue 11 item 3, in the module: a detached namespace closes its
 * directory and keeps its objects indexed; a job that names it later
 * (an eviction's unlink, a write completing) opens it for as long as it
 * runs; an idle namespace holding no object is forgotten for a new one
 * past max_namespaces, and one holding objects is not.
 */
START_TEST(test_detached_namespace_keeps_its_objects_and_no_descriptor)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier_stats	 st;
	struct filetier		*ft;
	char			 path[PATH_MAX], err[256];
	uint64_t		 n;
	uint32_t		 i;
	int			 fds;
	static const uint8_t	 fp_c[16] = { 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7,
		0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf };

	filetier_params_default(&p);
	p.capacity = 1 * MIB;
	p.max_namespaces = 2;
	p.fd_cache = 0;		/* descriptors counted here are the namespaces' alone */
	ft = ft_open(base, &p, NULL);
	for (i = 0; i < 8; i++)
		ck_assert_int_eq(write_wait(base, ft, fp_a, i, 40000), 0);
	fds = test_fd_count();
	filetier_ns_detach(ft, fp_a);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.namespaces_open, 1);
	ck_assert_uint_eq(st.namespaces, 2);
	ck_assert_int_eq(test_fd_count(), fds - 1);
	/* Still indexed, and still readable: a read opens the directory again. */
	ck_assert_int_eq(read_wait(base, ft, fp_a, 3), 0);
	loop_drain(base, ft);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.namespaces_open, 1);
	/* Namespace B's writes evict A's oldest objects: their unlinks reach A's directory. */
	for (i = 0; i < 20; i++)
		ck_assert_int_eq(write_wait(base, ft, fp_b, i, 40000), 0);
	loop_drain(base, ft);
	filetier_stats(ft, &st);
	ck_assert_uint_ge(st.evictions, 5);
	ck_assert_uint_eq(st.namespaces_open, 1);
	obj_path(NS_A, fp_a, 0, path, sizeof(path));
	ck_assert(!file_exists(path));
	ck_assert_int_eq(test_fd_count(), fds - 1);
	/* A third namespace: A still holds objects, B is attached: refused, nothing made. */
	ck_assert_int_eq(filetier_scan(ft, "decode/test-model-c0c1c2c3c4c5c6c7c8c9cacbcccdcecf", fp_c,
	    &n, err, sizeof(err)), -EUSERS);
	ck_assert_msg(strstr(err, "limits.max_namespaces") != NULL, "%s", err);
	snprintf(path, sizeof(path), "%s/decode/test-model-c0c1c2c3c4c5c6c7c8c9cacbcccdcecf", troot);
	ck_assert(!file_exists(path));
	/* B detached and emptied (its objects dropped): it is forgotten for C. */
	filetier_ns_detach(ft, fp_b);
	for (i = 0; i < 20; i++) {
		struct obj_key	k;
		uint32_t	id;

		key_of(&k, fp_b, i);
		if (filetier_lookup(ft, &k, &id, NULL) == 0)
			filetier_drop(ft, id);
	}
	loop_drain(base, ft);
	ck_assert_int_eq(filetier_scan(ft, "decode/test-model-c0c1c2c3c4c5c6c7c8c9cacbcccdcecf", fp_c,
	    &n, err, sizeof(err)), 0);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.namespaces, 2);
	ck_assert_uint_eq(st.namespaces_forgotten, 1);
	ck_assert_uint_eq(st.namespaces_open, 1);
	/* A, attached again, serves what it kept without a scan. */
	ck_assert_int_eq(filetier_scan_state(ft, fp_a, &n), 0);
	ck_assert_int_eq(filetier_scan(ft, NS_A, fp_a, &n, err, sizeof(err)), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 7), 0);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.namespaces_open, 2);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST


/* Out of descriptors, a namespace cannot be registered: no directory is left behind for it. */
START_TEST(test_namespace_not_registered_leaves_no_directory)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft;
	struct rlimit		 rl, low;
	char			 path[PATH_MAX], err[256];
	uint64_t		 n;
	int			 fd, rc;
	static const uint8_t	 fp_c[16] = { 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7,
		0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf };

	ft = ft_open(base, NULL, NULL);
	/* The lowest free descriptor number becomes the limit: no new one can be made. */
	ck_assert_int_ge(fd = open("/dev/null", O_RDONLY | O_CLOEXEC), 0);
	close(fd);
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	low = rl;
	low.rlim_cur = (rlim_t)fd;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	rc = filetier_scan(ft, "prefill/test-model-c0c1c2c3c4c5c6c7c8c9cacbcccdcecf", fp_c, &n, err,
	    sizeof(err));
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_msg(rc == -EMFILE, "registered without descriptors: %d %s", rc, err);
	snprintf(path, sizeof(path), "%s/prefill", troot);
	ck_assert(!file_exists(path));
	/* With descriptors again, it registers. */
	ck_assert_int_eq(filetier_scan(ft, "prefill/test-model-c0c1c2c3c4c5c6c7c8c9cacbcccdcecf", fp_c,
	    &n, err, sizeof(err)), 0);
	ck_assert(file_exists(path));
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

#define MANY_N		300
#define MANY_LEN	(36 * KIB)

START_TEST(test_many_reads_in_flight_land_the_right_bytes)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct result		*r = calloc(MANY_N, sizeof(*r));
	struct obj_key		 k;
	uint8_t			*data = malloc(MANY_LEN), *dst;
	int			 count = 0;
	unsigned		 i;

	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_nonnull(data);
	for (i = 0; i < MANY_N; i++) {
		fill(data, MANY_LEN, i);
		key_of(&k, fp_a, i);
		r[i].count = &count;
		ck_assert_int_eq(filetier_write(ft, &k, data, MANY_LEN, checksum_obj(data, MANY_LEN),
		    on_done, &r[i]), 0);
		/* The payload must stay put until its write is done. */
		loop_until(base, &count, (int)i + 1);
	}
	dst = aligned_alloc(4096, (size_t)MANY_N * MANY_LEN);
	ck_assert_ptr_nonnull(dst);
	count = 0;
	for (i = 0; i < MANY_N; i++) {
		key_of(&k, fp_a, i);
		ck_assert_int_eq(filetier_read(ft, &k, dst + (size_t)i * MANY_LEN, MANY_LEN, on_done,
		    &r[i], NULL), 0);
	}
	loop_until(base, &count, MANY_N);
	for (i = 0; i < MANY_N; i++) {
		ck_assert_int_eq(r[i].status, 0);
		ck_assert_msg(intact(dst + (size_t)i * MANY_LEN, MANY_LEN, i), "object %u", i);
	}
	check_idle(ft);
	free(dst);
	free(data);
	free(r);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_cancelled_reads_end_cancelled_and_unpinned)
{
	struct event_base	*base = event_base_new();
	struct filetier_params	 p;
	struct filetier		*ft;
	struct filetier_stats	 st;
	struct filetier_job	*jobs[64];
	struct result		 r[64];
	struct obj_key		 k;
	uint8_t			*dst = abuf(MIB);
	int			 count = 0, cancelled = 0, i;

	filetier_params_default(&p);
	p.readers = 1;
	p.read_depth = 1;
	ft = ft_open(base, &p, NULL);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, MIB), 0);
	key_of(&k, fp_a, 0);
	/* One reader, one read at a time: most of these are still queued. */
	for (i = 0; i < 64; i++) {
		r[i] = (struct result){ .count = &count };
		ck_assert_int_eq(filetier_read(ft, &k, dst, MIB, on_done, &r[i], &jobs[i]), 0);
	}
	for (i = 0; i < 64; i++)
		atomic_store(&jobs[i]->cancel, 1);
	loop_until(base, &count, 64);
	for (i = 0; i < 64; i++) {
		ck_assert(r[i].status == 0 || r[i].status == -ECANCELED);
		cancelled += r[i].status == -ECANCELED;
	}
	ck_assert_int_ge(cancelled, 60);
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.reads_cancelled, (uint64_t)cancelled);
	ck_assert_uint_eq(st.visible, 1);
	check_idle(ft);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	free(dst);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

START_TEST(test_free_with_jobs_in_flight_leaks_nothing)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct result		 r[40];
	struct obj_key		 k;
	uint8_t			*dst = abuf(256 * KIB), *data = malloc(256 * KIB);
	int			 count = 0, i;

	ck_assert_ptr_nonnull(data);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 256 * KIB), 0);
	key_of(&k, fp_a, 0);
	for (i = 0; i < 20; i++) {
		r[i] = (struct result){ .count = &count };
		ck_assert_int_eq(filetier_read(ft, &k, dst, 256 * KIB, on_done, &r[i], NULL), 0);
	}
	fill(data, 256 * KIB, 0);
	for (i = 20; i < 40; i++) {
		r[i] = (struct result){ .count = &count };
		key_of(&k, fp_a, (uint32_t)i);
		ck_assert_int_eq(filetier_write(ft, &k, data, 256 * KIB,
		    checksum_obj(data, 256 * KIB), on_done, &r[i]), 0);
	}
	/* No completion runs after free, and no thread touches dst after it returned. */
	filetier_free(ft);
	ck_assert_int_eq(count, 0);
	free(dst);
	free(data);
	event_base_free(base);
}
END_TEST

START_TEST(test_drop_takes_the_object_and_its_file_away)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct filetier_stats	 st;
	struct obj_key		 k;
	char			 path[PATH_MAX];
	uint32_t		 id;

	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 3000), 0);
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_lookup(ft, &k, &id, NULL), 0);
	ck_assert_int_eq(filetier_pin(ft, id), 0);
	filetier_drop(ft, id);
	filetier_drop(ft, id);		/* idempotent */
	ck_assert_int_eq(filetier_lookup(ft, &k, NULL, NULL), -ENOENT);
	/* Until its unlink ran, the key cannot be written again. */
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 3000), -EBUSY);
	loop_drain(base, ft);
	obj_path(NS_A, fp_a, 0, path, sizeof(path));
	ck_assert(!file_exists(path));
	filetier_stats(ft, &st);
	ck_assert_uint_eq(st.dead, 1);
	ck_assert_uint_eq(st.drops, 1);
	ck_assert_uint_eq(st.bytes_used, 0);
	filetier_unpin(ft, id);
	check_idle(ft);
	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 3000), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

/* Descriptors this process holds on files that no longer have a name (check's own too). */
static int
held_deleted(void)
{
	DIR		*d = opendir("/proc/self/fd");
	struct dirent	*de;
	char		 link[PATH_MAX + 32], target[PATH_MAX];
	ssize_t		 n;
	int		 held = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)) != NULL) {
		snprintf(link, sizeof(link), "/proc/self/fd/%s", de->d_name);
		if ((n = readlink(link, target, sizeof(target) - 1)) <= 0)
			continue;
		target[n] = '\0';
		held += strstr(target, " (deleted)") != NULL;
	}
	closedir(d);
	return held;
}

/* A file renamed over the object's: all zeros, no header. */
static void
do_replace_by_rename(const char *path)
{
	char	tmp[PATH_MAX + 8];
	int	fd;

	snprintf(tmp, sizeof(tmp), "%s.new", path);
	ck_assert_int_ge(fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640), 0);
	ck_assert_int_eq(ftruncate(fd, FILETIER_HDR + 40000), 0);
	close(fd);
	ck_assert_int_eq(rename(tmp, path), 0);
}

/*
 * Object 0 is read twice (the second time through the open-file cache),
 * then damaged: the next read fails with want, as a first read would,
 * and no descriptor keeps the old file.
 */
static void
damaged_after_read(void (*damage)(const char *path), int want)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	char			 path[PATH_MAX];
	int			 held = held_deleted();

	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 40000), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	obj_path(NS_A, fp_a, 0, path, sizeof(path));
	damage(path);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), want);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), -ENOENT);
	ck_assert(!file_exists(path));
	ck_assert_int_eq(held_deleted(), held);
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
	test_rmtree(tdir);
	ck_assert_int_eq(mkdir(tdir, 0700), 0);
}

START_TEST(test_cached_descriptor_never_outlives_its_file)
{
	damaged_after_read(do_unlink, -ENOENT);
	damaged_after_read(do_replace_by_rename, -EUCLEAN);
	damaged_after_read(do_symlink, -ELOOP);
	damaged_after_read(do_truncate, -ENODATA);
	damaged_after_read(do_flip_payload, -EBADMSG);
}
END_TEST

/* The tier's own unlinks (drop, eviction) close a cached descriptor first. */
START_TEST(test_dropped_object_leaves_no_cached_descriptor)
{
	struct event_base	*base = event_base_new();
	struct filetier		*ft = ft_open(base, NULL, NULL);
	struct obj_key		 k;
	uint32_t		 id;
	int			 held = held_deleted();

	ck_assert_int_eq(write_wait(base, ft, fp_a, 0, 3000), 0);
	ck_assert_int_eq(read_wait(base, ft, fp_a, 0), 0);
	key_of(&k, fp_a, 0);
	ck_assert_int_eq(filetier_lookup(ft, &k, &id, NULL), 0);
	filetier_drop(ft, id);
	loop_drain(base, ft);
	ck_assert_int_eq(held_deleted(), held);
	check_idle(ft);
	filetier_free(ft);
	event_base_free(base);
}
END_TEST

Suite *
suite_filetier(void)
{
	Suite	*s = suite_create("filetier");
	TCase	*tc = tcase_create("filetier");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_write_then_read_returns_the_exact_bytes);
	tcase_add_test(tc, test_preadv_buffered_readers_return_the_same_bytes);
	tcase_add_test(tc, test_fresh_tier_on_a_used_directory_reads_earlier_objects);
	tcase_add_test(tc, test_deleted_file_fails_the_read_and_leaves_the_tier);
	tcase_add_test(tc, test_truncated_file_fails_the_read_and_is_removed);
	tcase_add_test(tc, test_preadv_readers_catch_truncated_and_corrupt_files_too);
	tcase_add_test(tc, test_payload_byte_flip_fails_the_checksum_and_is_removed);
	tcase_add_test(tc, test_header_byte_flip_fails_and_is_removed);
	tcase_add_test(tc, test_symlink_in_place_of_an_object_is_refused_and_removed);
	tcase_add_test(tc, test_pinned_object_found_corrupt_leaves_the_index_and_keeps_its_pin);
	tcase_add_test(tc, test_foreign_fingerprint_file_is_refused_and_removed);
	tcase_add_test(tc, test_writer_killed_mid_write_leaves_no_torn_object);
	tcase_add_test(tc, test_enospc_fails_writes_cleanly_then_evicts_and_reads_go_on);
	tcase_add_test(tc, test_two_tiers_writing_the_same_keys_are_harmless);
	tcase_add_test(tc, test_capacity_evicts_lru_but_never_a_pinned_object);
	tcase_add_test(tc, test_deleted_namespace_directory_is_made_again_by_the_next_write);
	tcase_add_test(tc, test_scan_skips_and_removes_junk);
	tcase_add_test(tc, test_restart_lru_order_follows_write_time);
	tcase_add_test(tc, test_lookup_has_no_side_effects);
	tcase_add_test(tc, test_bad_writes_and_reads_are_refused_with_nothing_changed);
	tcase_add_test(tc, test_namespace_names_are_checked_before_any_path_is_made);
	tcase_add_test(tc, test_symlinked_pool_dir_leads_nothing_outside_the_tier);
	tcase_add_test(tc, test_symlinked_leaf_dir_leads_nothing_outside_the_tier);
	tcase_add_test(tc, test_symlinked_dirs_lead_nothing_outside_without_openat2);
	tcase_add_test(tc, test_symlinked_namespace_dir_is_refused_and_its_target_untouched);
	tcase_add_test(tc, test_symlinked_object_is_removed_and_its_target_untouched);
	tcase_add_test(tc, test_detached_namespace_keeps_its_objects_and_no_descriptor);
	tcase_add_test(tc, test_namespace_not_registered_leaves_no_directory);
	tcase_add_test(tc, test_many_reads_in_flight_land_the_right_bytes);
	tcase_add_test(tc, test_cancelled_reads_end_cancelled_and_unpinned);
	tcase_add_test(tc, test_free_with_jobs_in_flight_leaks_nothing);
	tcase_add_test(tc, test_drop_takes_the_object_and_its_file_away);
	tcase_add_test(tc, test_cached_descriptor_never_outlives_its_file);
	tcase_add_test(tc, test_dropped_object_leaves_no_cached_descriptor);
	suite_add_tcase(s, tc);
	return s;
}
