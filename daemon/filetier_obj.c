/*
 * The file tier's on-disk format: pure functions, called by every thread
 * of the family (filetier.h). An object's key becomes its path below the
 * namespace directory, all hex made here: <pool:2>-<shard:4>/<hash[0]:2>/
 * <hash:64>.obj; a namespace name becomes <role>/<model-fingerprint> only
 * after it is checked again here. An object file opens with a 4096-byte
 * header block (magic, version, key, payload length and checksum, its own
 * checksum), built and checked here for writers, readers, the scan and
 * the fuzzer. Every path is walked by descriptor with no symbolic link
 * followed (openat2, or O_NOFOLLOW per component on older kernels), so
 * that nothing outside the root is ever read, made or removed.
 */
#include <sys/stat.h>
#include <sys/syscall.h>

#include <linux/openat2.h>

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "filetier.h"

#define FILETIER_MAGIC		"l3kvobj"	/* 8 bytes with its NUL */
#define FILETIER_VERSION	1
#define FILETIER_HDR_CSUM_OFF	96		/* the header checksum covers bytes before it */
#define FILETIER_DIR_MODE	0750		/* KV bytes are derived from prompts */

/* Keys and paths: pure functions, called by every thread. */

static const char filetier_hexd[] = "0123456789abcdef";

static void
filetier_hex(char *out, const uint8_t *in, size_t n)
{
	size_t	i;

	for (i = 0; i < n; i++) {
		out[2 * i] = filetier_hexd[in[i] >> 4];
		out[2 * i + 1] = filetier_hexd[in[i] & 15];
	}
	out[2 * n] = '\0';
}

int
filetier_unhex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;	/* upper case too: names are made lower case, one spelling only */
}

/* n bytes from 2n lowercase hex digits; -1 on anything else. */
int
filetier_unhex(uint8_t *out, const char *in, size_t n)
{
	size_t	i;
	int	hi, lo;

	for (i = 0; i < n; i++) {
		if ((hi = filetier_unhex_digit(in[2 * i])) < 0 ||
		    (lo = filetier_unhex_digit(in[2 * i + 1])) < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

/* "pp-ssss/hh/<64 hex>.obj", by hand: every read and write makes one. */
void
filetier_obj_path(const struct obj_key *k, char *buf)
{
	uint8_t	ps[3] = { k->pool, (uint8_t)(k->shard >> 8), (uint8_t)k->shard };

	filetier_hex(buf, ps, 1);
	buf[2] = '-';
	filetier_hex(buf + 3, ps + 1, 2);
	buf[7] = '/';
	filetier_hex(buf + 8, k->hash, 1);
	buf[10] = '/';
	filetier_hex(buf + 11, k->hash, sizeof(k->hash));
	memcpy(buf + 75, ".obj", 5);
}

/*
 * Paths below a namespace are walked by descriptor and never through a
 * symbolic link: a directory of the tier swapped for a link (by another
 * user of a shared filesystem, or an operator's mistake) must not lead a
 * read, a write, a rename or an unlink outside the root. openat2 says so
 * in one call (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: a link anywhere in
 * the path is ELOOP); kernels without it (before 5.6) get one openat per
 * component with O_NOFOLLOW. A link found fails with ELOOP or ENOTDIR.
 */
_Atomic int	filetier_has_openat2 = 1;

/*
 * A directory's openat with O_NOFOLLOW failed: a link there is ELOOP, as
 * openat2 says it (O_DIRECTORY makes the kernel answer ENOTDIR).
 */
int
filetier_dir_errno(int dirfd, const char *name, int err)
{
	struct stat	st;

	if (err == ENOTDIR && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISLNK(st.st_mode))
		return -ELOOP;
	return -err;
}

static int
filetier_open_walk(int dirfd, const char *path, int flags, mode_t mode)
{
	char		 comp[FILETIER_OBJ_PATH];
	const char	*p = path, *slash;
	int		 cur = dirfd, fd;

	while ((slash = strchr(p, '/')) != NULL) {
		if ((size_t)(slash - p) >= sizeof(comp) || slash == p) {
			fd = -EINVAL;
			goto out;
		}
		memcpy(comp, p, (size_t)(slash - p));
		comp[slash - p] = '\0';
		fd = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			fd = filetier_dir_errno(cur, comp, errno);
			goto out;
		}
		if (cur != dirfd)
			close(cur);
		cur = fd;
		p = slash + 1;
	}
	if ((fd = openat(cur, p, flags | O_NOFOLLOW, mode)) < 0)
		fd = filetier_dir_errno(cur, p, errno);
out:
	if (cur != dirfd)
		close(cur);
	return fd;
}

/* A descriptor of path under dirfd, no link followed; -errno. Thread-safe. */
int
filetier_open_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how	how;
	long		fd;

	if (atomic_load_explicit(&filetier_has_openat2, memory_order_relaxed)) {
		memset(&how, 0, sizeof(how));
		how.flags = (uint64_t)(flags | O_NOFOLLOW);
		how.mode = (flags & O_CREAT) ? mode : 0;
		how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
		if ((fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how))) >= 0)
			return (int)fd;
		if (errno != ENOSYS)
			return -errno;
		atomic_store(&filetier_has_openat2, 0);
	}
	return filetier_open_walk(dirfd, path, flags, mode);
}

/*
 * The object's leaf directory "pp-ssss/hh", opened with no link followed;
 * create makes the missing ones, *made getting 1 (pool) | 2 (leaf) for
 * them. *poolfd, when asked for, gets the pool directory too. -errno.
 */
int
filetier_leaf_open(int nsfd, const struct obj_key *k, int create, int *made, int *poolfd)
{
	char	pool[8], leaf[3], path[FILETIER_OBJ_PATH];
	int	pfd, lfd = -1;

	if (poolfd != NULL)
		*poolfd = -1;
	else {
		/* The common case, an existing leaf: one call (openat2 walks both components). */
		filetier_obj_path(k, path);
		path[10] = '\0';
		lfd = filetier_open_beneath(nsfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
		if (lfd >= 0 || lfd != -ENOENT || !create)
			return lfd;
	}
	snprintf(pool, sizeof(pool), "%02x-%04x", k->pool, k->shard);
	snprintf(leaf, sizeof(leaf), "%02x", k->hash[0]);
	pfd = openat(nsfd, pool, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0 && errno == ENOENT && create) {
		if (mkdirat(nsfd, pool, FILETIER_DIR_MODE) == 0)
			*made |= 1;
		else if (errno != EEXIST)
			return -errno;
		pfd = openat(nsfd, pool, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (pfd < 0)
		return filetier_dir_errno(nsfd, pool, errno);
	lfd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (lfd < 0 && errno == ENOENT && create) {
		if (mkdirat(pfd, leaf, FILETIER_DIR_MODE) == 0)
			*made |= 2;
		else if (errno != EEXIST) {
			lfd = -errno;
			close(pfd);
			return lfd;
		}
		lfd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (lfd < 0)
		lfd = filetier_dir_errno(pfd, leaf, errno);
	if (poolfd != NULL && lfd >= 0)
		*poolfd = pfd;
	else
		close(pfd);
	return lfd;
}

/* Unlinks the object's file, no link followed on the way: 0, or -errno (ENOENT is 0). */
int
filetier_unlink_obj(int nsfd, const struct obj_key *k)
{
	char	path[FILETIER_OBJ_PATH];
	int	lfd, rc = 0;

	if ((lfd = filetier_leaf_open(nsfd, k, 0, NULL, NULL)) < 0)
		return lfd == -ENOENT ? 0 : lfd;
	filetier_obj_path(k, path);
	if (unlinkat(lfd, path + FILETIER_OBJ_NAME, 0) != 0 && errno != ENOENT)
		rc = -errno;
	close(lfd);
	return rc;
}

static void
filetier_le64(uint8_t *p, uint64_t v)
{
	int	i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
filetier_get64(const uint8_t *p)
{
	uint64_t	v = 0;
	int		i;

	for (i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t
filetier_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * The header block, little-endian:
 *	 0  8	magic "l3kvobj\0"
 *	 8  4	format version (1)
 *	12  4	header length = payload offset (4096)
 *	16 16	namespace fingerprint
 *	32  1	pool	33  1  zero	34  2  shard
 *	36  4	flags (0)
 *	40 32	page hash
 *	72  8	payload length
 *	80  8	payload checksum (checksum_obj)
 *	88  8	written at, Unix ns (informative)
 *	96  8	XXH3-64 of bytes 0..95
 *     104	zeros to 4096
 */
void
filetier_hdr_build(uint8_t *h, const struct obj_key *k, uint64_t len, uint64_t csum)
{
	struct timespec	ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	memset(h, 0, FILETIER_HDR);
	memcpy(h, FILETIER_MAGIC, 8);
	h[8] = FILETIER_VERSION;
	h[12] = FILETIER_HDR & 0xff;
	h[13] = FILETIER_HDR >> 8;
	memcpy(h + 16, k->fingerprint, 16);
	h[32] = k->pool;
	h[34] = (uint8_t)k->shard;
	h[35] = (uint8_t)(k->shard >> 8);
	memcpy(h + 40, k->hash, 32);
	filetier_le64(h + 72, len);
	filetier_le64(h + 80, csum);
	filetier_le64(h + 88, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
	filetier_le64(h + FILETIER_HDR_CSUM_OFF, XXH3_64bits(h, FILETIER_HDR_CSUM_OFF));
}

/*
 * Checks a header against the key expected: 0 with the payload's length
 * and checksum, -EUCLEAN for a damaged or unknown header, -ESTALE for a
 * sound header of another object (another fingerprint, pool, shard or
 * page: a file copied or renamed by someone else).
 */
int
filetier_hdr_check(const uint8_t *h, const struct obj_key *k, uint64_t *len, uint64_t *csum)
{
	if (memcmp(h, FILETIER_MAGIC, 8) != 0 || filetier_get32(h + 8) != FILETIER_VERSION ||
	    filetier_get32(h + 12) != FILETIER_HDR || h[33] != 0 || filetier_get32(h + 36) != 0 ||
	    filetier_get64(h + FILETIER_HDR_CSUM_OFF) != XXH3_64bits(h, FILETIER_HDR_CSUM_OFF))
		return -EUCLEAN;
	*len = filetier_get64(h + 72);
	*csum = filetier_get64(h + 80);
	if (*len == 0 || *len > FILETIER_OBJ_MAX)
		return -EUCLEAN;
	if (memcmp(h + 16, k->fingerprint, 16) != 0 || h[32] != k->pool ||
	    (uint16_t)(h[34] | h[35] << 8) != k->shard || memcmp(h + 40, k->hash, 32) != 0)
		return -ESTALE;
	return 0;
}

/*
 * The header decoder on its own, for the fuzzer: n bytes of a file's
 * start checked against the key expected, as a read or a scan checks
 * them. 0 with the payload's length and checksum, -ENODATA (short),
 * -EUCLEAN (damaged or unknown), -ESTALE (sound, another key).
 */
int
filetier_hdr_parse(const uint8_t *h, size_t n, const struct obj_key *k, uint64_t *len,
    uint64_t *csum)
{
	if (n < FILETIER_HDR_USED)
		return -ENODATA;
	return filetier_hdr_check(h, k, len, csum);
}

/* The header block of an object, as a write makes it (FILETIER_HDR bytes at h). */
void
filetier_hdr_make(uint8_t *h, const struct obj_key *k, uint64_t len, uint64_t csum)
{
	filetier_hdr_build(h, k, len, csum);
}

const char *
filetier_strerror(int status)
{
	switch (status) {
	case 0:		return "ok";
	case -ENOENT:	return "the object file is missing";
	case -ENODATA:	return "the object file is truncated";
	case -EUCLEAN:	return "the object header is damaged";
	case -ESTALE:	return "the object file belongs to another key or fingerprint";
	case -EBADMSG:	return "the object payload fails its checksum";
	case -ELOOP:	return "the object path is a symbolic link";
	case -ECANCELED: return "cancelled";
	}
	return strerror(-status);
}

static int
filetier_name_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	    c == '.' || c == '-' || c == '_';
}

/*
 * A namespace name is "role/model-<32 hex>" with the hex equal to the
 * fingerprint, every character safe, exactly one slash and no "." or
 * ".." component: it becomes two directory names, so it is checked here
 * even though namespace.c made it.
 */
int
filetier_ns_name_check(const char *name, const uint8_t fp[16], char *err, size_t errlen)
{
	const char	*slash, *rest;
	char		 hex[33];
	size_t		 n, i, rl;

	n = strnlen(name, PROTO_NSNAME_LEN);
	if (n == 0 || n >= PROTO_NSNAME_LEN || (slash = strchr(name, '/')) == NULL ||
	    strchr(slash + 1, '/') != NULL)
		goto bad;
	rl = (size_t)(slash - name);
	rest = slash + 1;
	if (rl == 0 || (rl == 1 && name[0] == '.') || (rl == 2 && name[0] == '.' && name[1] == '.'))
		goto bad;
	for (i = 0; i < n; i++)
		if (name + i != slash && !filetier_name_char_ok(name[i]))
			goto bad;
	filetier_hex(hex, fp, 16);
	if (strlen(rest) < 33 || rest[strlen(rest) - 33] != '-' ||
	    strcmp(rest + strlen(rest) - 32, hex) != 0) {
		snprintf(err, errlen, "file tier: namespace %.*s does not end in its fingerprint %s",
		    (int)n, name, hex);
		return -EINVAL;
	}
	return 0;
bad:
	snprintf(err, errlen, "file tier: namespace name \"%.*s\" is not role/model-fingerprint",
	    (int)strnlen(name, PROTO_NSNAME_LEN), name);
	return -EINVAL;
}

/* mkdir(1) -p relative to dirfd (or AT_FDCWD) for a path of checked components. */
int
filetier_mkdir_p(int dirfd, const char *path, char *err, size_t errlen)
{
	char	buf[PATH_MAX], *p;

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) {
		snprintf(err, errlen, "file tier: path %s is too long", path);
		return -ENAMETOOLONG;
	}
	for (p = buf + 1; ; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		if (p[-1] != '/') {
			char c = *p;

			*p = '\0';
			if (mkdirat(dirfd, buf, FILETIER_DIR_MODE) != 0 && errno != EEXIST) {
				int rc = -errno;

				snprintf(err, errlen, "file tier: mkdir %s: %s", buf, strerror(-rc));
				return rc;
			}
			*p = c;
		}
		if (*p == '\0')
			return 0;
	}
}

/*
 * Warns about a tier directory that someone else could change under the
 * daemon: owned by another user, or writable by others. Nothing is
 * refused (a shared filesystem may map owners oddly), but the operator
 * is told which directory and why.
 */
void
filetier_dir_check(int fd, const char *root, const char *rel)
{
	struct stat	st;

	if (fstat(fd, &st) != 0)
		return;
	if (st.st_uid != geteuid())
		log_warn("filetier", "%s%s%s is owned by uid %u, not by this daemon's %u: that user "
		    "can change what the tier serves", root, rel[0] != '\0' ? "/" : "", rel,
		    (unsigned)st.st_uid, (unsigned)geteuid());
	if ((st.st_mode & S_IWOTH) != 0)
		log_warn("filetier", "%s%s%s is writable by others (mode %04o): anyone can change what "
		    "the tier serves", root, rel[0] != '\0' ? "/" : "", rel,
		    (unsigned)(st.st_mode & 07777));
}

/* One directory below dirfd, made if create and missing (*made then 1), never a link. */
int
filetier_dir_open(int dirfd, const char *name, int create, int *made)
{
	int	fd;

	*made = 0;
	if ((fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >= 0)
		return fd;
	if (errno != ENOENT || !create)
		return filetier_dir_errno(dirfd, name, errno);
	if (mkdirat(dirfd, name, FILETIER_DIR_MODE) == 0)
		*made = 1;
	else if (errno != EEXIST)
		return -errno;
	if ((fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return -errno;
	return fd;
}
