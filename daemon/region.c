/*
 * Engine memory registered at ATTACH. For the host copy engine a region
 * is a memfd (or another shmem file) mapped shared; the daemon writes
 * restored pages into it and reads published pages out of it. GPU memory
 * (CUDA IPC handles, cuMem fds) is opened by cuda.c instead; unmapping
 * goes there too.
 *
 * The daemon must never fault on client memory (docs/contract.md, item
 * 11), and a mapped file that shrinks turns accesses past its end into
 * SIGBUS. So l3kvd seals a region's memfd against shrinking
 * (F_SEAL_SHRINK) when the memfd allows sealing. One that does not (created without
 * MFD_ALLOW_SEALING, as SGLang's shm allocator creates its host pool:
 * F_SEAL_SEAL is set) is accepted unsealed, and protected another way:
 * its size is checked here and, with fstat on a duplicate of its fd,
 * before every copy run (region_check_size), and the host copy engine runs
 * every copy under a SIGBUS guard (copy.c), so a memfd truncated under a
 * copy fails that job (PROTO_S_BAD_REGION), never the daemon. Only the
 * copy workers ever touch a region's bytes; the loop thread never does.
 */
#include <sys/mman.h>
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"

/* Seals fd against shrinking where it can: *sealed 1, or 0 for a memfd that forbids seals. */
static int
region_seal(int fd, int *sealed, char *err, size_t errlen)
{
	int	seals;

	*sealed = 0;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		snprintf(err, errlen, "fd is not a memfd (F_GET_SEALS: %s)", strerror(errno));
		return -EINVAL;
	}
	if (seals & F_SEAL_SHRINK) {
		*sealed = 1;
		return 0;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
		*sealed = 1;
		return 0;
	}
	if (errno != EPERM) {
		snprintf(err, errlen, "F_ADD_SEALS: %s", strerror(errno));
		return -errno;
	}
	/* F_SEAL_SEAL: accepted unsealed, guarded by size checks and copy.c's SIGBUS guard. */
	return 0;
}

/*
 * Whether an unsealed region's memfd still holds what was registered
 * (sealed ones cannot shrink). Any thread: the copy workers call it
 * before each run. 0, or -ERANGE with err filled.
 */
int
region_check_size(const struct region *r, char *err, size_t errlen)
{
	struct stat	st;
	uint64_t	end = r->desc.offset + r->desc.size;

	if (r->map == NULL || r->sealed)
		return 0;
	if (fstat(r->fd, &st) != 0) {
		snprintf(err, errlen, "fstat of a memory region: %s", strerror(errno));
		return -ERANGE;
	}
	if ((uint64_t)st.st_size < end) {
		snprintf(err, errlen, "the engine shrank a memory region's memfd to %lld bytes, "
		    "below the %llu it registered", (long long)st.st_size, (unsigned long long)end);
		return -ERANGE;
	}
	return 0;
}

/*
 * Maps a validated region description over fd (borrowed: the caller
 * closes it). 0 or -errno with err filled.
 */
int
region_map(struct region *r, const struct proto_region *desc, int fd, char *err, size_t errlen)
{
	struct stat	st;
	uint64_t	end, start;
	long		pagesz = sysconf(_SC_PAGESIZE);
	void		*p;
	int		rc, sealed, dfd;

	memset(r, 0, sizeof(*r));
	if (desc->kind != PROTO_MEM_MEMFD) {
		snprintf(err, errlen, "memory kind %u needs the cuda copy engine, not available here",
		    desc->kind);
		return -EOPNOTSUPP;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		snprintf(err, errlen, "fstat: %s", strerror(-rc));
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "fd is not a memfd or regular shared-memory file");
		return -EINVAL;
	}
	if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR) {
		snprintf(err, errlen, "fd must be open read-write");
		return -EACCES;
	}
	if ((rc = region_seal(fd, &sealed, err, errlen)) != 0)
		return rc;
	end = desc->offset + desc->size;	/* proto_region_check ruled out overflow */
	if ((uint64_t)st.st_size < end) {
		snprintf(err, errlen, "offset %llu + size %llu is past the memfd's %lld bytes",
		    (unsigned long long)desc->offset, (unsigned long long)desc->size,
		    (long long)st.st_size);
		return -ERANGE;
	}
	start = desc->offset & ~((uint64_t)pagesz - 1);
	/* Only an unsealed memfd is kept open: its size is checked before copies. */
	if (sealed)
		dfd = -1;
	else if ((dfd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "dup: %s", strerror(-rc));
		return rc;
	}
	p = mmap(NULL, end - start, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (p == MAP_FAILED) {
		rc = -errno;
		if (dfd >= 0)
			close(dfd);
		snprintf(err, errlen, "mmap: %s (the memfd must be open read-write)", strerror(-rc));
		return rc;
	}
	if (!sealed)
		log_debug("region", "memfd of %lld bytes cannot be sealed: mapped unsealed, guarded",
		    (long long)st.st_size);
	r->desc = *desc;
	r->fd = dfd;
	r->sealed = sealed;
	r->map = p;
	r->map_len = end - start;
	r->base = (uint8_t *)p + (desc->offset - start);
	metrics.regions_mapped++;
	metrics.region_bytes_mapped += r->map_len;
	return 0;
}

/* Idempotent. */
void
region_unmap(struct region *r)
{
	if (r->kreg != NULL || r->dev != NULL || r->kev != NULL) {
		cuda_region_close(r);
		return;
	}
	if (r->map == NULL)
		return;
	munmap(r->map, r->map_len);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	metrics.regions_mapped--;
	metrics.region_bytes_mapped -= r->map_len;
	r->map = NULL;
	r->base = NULL;
	r->map_len = 0;
}

/* Every kind but an event registration is memory that pages live in. */
int
region_is_memory(const struct proto_region *d)
{
	return d->kind != PROTO_MEM_CUDA_EVENT;
}

int
region_slot_ok(const struct region *r, uint64_t slot)
{
	return r->desc.layout == PROTO_LAYOUT_SLOTS && slot < r->desc.num_pages;
}
