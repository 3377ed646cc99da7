/*
 * The file tier's writers: threads that take unlinks first, then writes.
 * A write goes to a temp file in the object's leaf directory (optionally
 * fdatasync'd) and is renamed into place, so that a reader sees the old
 * complete file, the new complete file, or nothing; any failure unlinks
 * what it made. A namespace directory deleted under a running tier is
 * made again behind the same descriptor. Finished jobs go back to the
 * loop through filetier_post (filetier.c).
 */
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/uio.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "filetier.h"

#define FILETIER_FILE_MODE	0640

/* Writer threads: writes, renames and unlinks with plain system calls. */

static uint64_t
filetier_rand(uint64_t *s)
{
	/* xorshift64*: temp names need to differ, not to be secret. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

/*
 * Makes dirfd's directory again at path (relative to at) when it was
 * deleted: an operator's rm -r, a cleaner. dup3 puts the new directory
 * behind the same descriptor number atomically, so a thread using it
 * meanwhile works in the old directory or the new one, never on a closed
 * or reused number. 1: made again; 0: it was there; or -errno.
 */
static int
filetier_dir_remake(int at, const char *path, int dirfd)
{
	struct stat	st;
	char		err[64];
	int		fd, rc;

	if (fstat(dirfd, &st) != 0)
		return -errno;
	if (st.st_nlink > 0)
		return 0;	/* another writer made it again first */
	if ((rc = filetier_mkdir_p(at, path, err, sizeof(err))) != 0)
		return rc;
	/* The root may be a link (config/README.md); nothing below it is followed. */
	if (at == AT_FDCWD) {
		if ((fd = openat(at, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			return -errno;
	} else if ((fd = filetier_open_beneath(at, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0)) < 0)
		return fd;
	rc = dup3(fd, dirfd, O_CLOEXEC) < 0 ? -errno : 1;
	close(fd);
	return rc;
}

/*
 * A namespace directory deleted under a running tier: made again, with
 * the root above it if that went too, so that writes land again. The
 * loop reports it (filetier_dirs_report).
 */
static int
filetier_ns_remake(struct filetier *ft, struct filetier_ns *ns)
{
	int	rc;

	pthread_mutex_lock(&ft->dir_lock);
	if ((rc = filetier_dir_remake(AT_FDCWD, ft->root, ft->rootfd)) >= 0 &&
	    (rc = filetier_dir_remake(ft->rootfd, ns->name, ns->dirfd)) > 0)
		atomic_fetch_add(&ft->dirs_recreated, 1);
	pthread_mutex_unlock(&ft->dir_lock);
	return rc < 0 ? rc : 0;
}

static int
filetier_pwrite_all(int fd, const void *hdr, const void *data, uint64_t len)
{
	struct iovec	iov[2];
	uint64_t	off = 0, total = FILETIER_HDR + len, skip;
	ssize_t		n;
	int		i;

	while (off < total) {
		/* The rest of the header, then the rest of the payload. */
		i = 0;
		if (off < FILETIER_HDR) {
			iov[i].iov_base = (uint8_t *)(uintptr_t)hdr + off;
			iov[i++].iov_len = FILETIER_HDR - off;
		}
		skip = off > FILETIER_HDR ? off - FILETIER_HDR : 0;
		iov[i].iov_base = (uint8_t *)(uintptr_t)data + skip;
		iov[i++].iov_len = len - skip;
		if ((n = pwritev(fd, iov, i, (off_t)off)) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		off += (uint64_t)n;
	}
	return 0;
}

/*
 * Writes one object: temp file, bytes, optional fdatasync, rename into
 * place, optional fsync of the directories that changed. Any failure
 * unlinks what it made, so nothing of a failed write is ever visible.
 * Everything happens inside the leaf directory, opened with no link
 * followed: the temp file, the rename and the unlink name one component.
 */
static int
filetier_write_file(struct filetier *ft, struct filetier_job *job, uint64_t *rng, uint8_t *hdr)
{
	struct filetier_ns	*ns = job->ns;
	char			 path[FILETIER_OBJ_PATH], tmp[32];
	const char		*name = path + FILETIER_OBJ_NAME;
	int			 fd = -1, lfd, pfd = -1, rc, tries, made = 0;

	/* A DRAM object that no longer matches its checksum is not made durable. */
	if (checksum_obj(job->buf, job->len) != job->checksum)
		return -EBADMSG;
	filetier_hdr_build(hdr, &job->key, job->len, job->checksum);
	filetier_obj_path(&job->key, path);
	lfd = filetier_leaf_open(ns->dirfd, &job->key, 1, &made, ft->p.fsync ? &pfd : NULL);
	if (lfd == -ENOENT) {
		/* The namespace directory itself is gone: made again, then once more. */
		if ((rc = filetier_ns_remake(ft, ns)) != 0)
			return rc;
		lfd = filetier_leaf_open(ns->dirfd, &job->key, 1, &made, ft->p.fsync ? &pfd : NULL);
	}
	if (lfd < 0)
		return lfd;
	for (tries = 0; tries < 8 && fd < 0; tries++) {
		snprintf(tmp, sizeof(tmp), FILETIER_TMP_PREFIX "%016llx",
		    (unsigned long long)filetier_rand(rng));
		fd = openat(lfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
		    FILETIER_FILE_MODE);
		if (fd < 0 && errno != EEXIST) {
			rc = -errno;
			goto out;
		}
	}
	if (fd < 0) {
		rc = -EEXIST;
		goto out;
	}
	rc = filetier_pwrite_all(fd, hdr, job->buf, job->len);
	if (rc == 0 && ft->p.fsync && fdatasync(fd) != 0)
		rc = -errno;
	/* NFS and FUSE report write errors (ENOSPC, EDQUOT) at close. */
	if (close(fd) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(lfd, tmp, lfd, name) != 0)
		rc = -errno;
	if (rc != 0) {
		unlinkat(lfd, tmp, 0);
		goto out;
	}
	if (ft->p.fsync) {
		rc = fsync(lfd) == 0 ? 0 : -errno;
		if (rc == 0 && (made & 2))
			rc = fsync(pfd) == 0 ? 0 : -errno;
		if (rc == 0 && (made & 1))
			rc = fsync(ns->dirfd) == 0 ? 0 : -errno;
		if (rc != 0)
			/* Not durable as configured: not visible either. */
			unlinkat(lfd, name, 0);
	}
out:
	if (pfd >= 0)
		close(pfd);
	close(lfd);
	return rc;
}

void *
filetier_writer_main(void *arg)
{
	struct filetier		*ft = arg;
	struct filetier_job_list batch;
	struct filetier_job	*job;
	uint8_t			 hdr[FILETIER_HDR];
	uint64_t		 rng = 0;

	if (getrandom(&rng, sizeof(rng), GRND_NONBLOCK) != sizeof(rng))
		rng = (uint64_t)time(NULL);
	rng ^= (uint64_t)(uintptr_t)&rng;
	if (rng == 0)
		rng = 1;
	TAILQ_INIT(&batch);
	for (;;) {
		pthread_mutex_lock(&ft->lock);
		while (!ft->stop && TAILQ_EMPTY(&ft->deletes) && TAILQ_EMPTY(&ft->writes))
			pthread_cond_wait(&ft->wcond, &ft->lock);
		if (ft->stop) {
			/* Queued jobs are dropped by filetier_free: nothing of them exists yet. */
			pthread_mutex_unlock(&ft->lock);
			return NULL;
		}
		/* Deletions first: they give back the room that writes wait for. */
		if ((job = TAILQ_FIRST(&ft->deletes)) != NULL)
			TAILQ_REMOVE(&ft->deletes, job, entry);
		else {
			job = TAILQ_FIRST(&ft->writes);
			TAILQ_REMOVE(&ft->writes, job, entry);
		}
		pthread_mutex_unlock(&ft->lock);

		if (job->kind == FILETIER_JOB_WRITE)
			job->status = filetier_write_file(ft, job, &rng, hdr);
		else {
			filetier_fdc_forget(ft->fdc, job->ns, &job->key);
			job->status = filetier_unlink_obj(job->ns->dirfd, &job->key);
		}
		TAILQ_INSERT_TAIL(&batch, job, entry);
		filetier_post(ft, &batch);
	}
}
