/*
 * libFuzzer harness for the file tier's object header decoder
 * (filetier_hdr_parse, what every read and scan applies to a file's first
 * block): any bytes, as the start of an object file.
 *
 * Beyond "no crash, no sanitizer report", it checks what the tier relies
 * on: the decoder answers 0 or one of its three statuses; a header it
 * accepts has a payload length in (0, FILETIER_OBJ_MAX]; and a header made
 * by the writer from the input's key, length and checksum decodes to
 * exactly those, while any byte of its checked part changed (one the
 * input picks) is refused, and another key's is -ESTALE.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

int	LLVMFuzzerTestOneInput(const uint8_t *, size_t);

/* The bytes a header checks: up to and including its checksum. */
#define FUZZ_HDR_CHECKED	104

static uint64_t
fuzz_u64(const uint8_t *p)
{
	uint64_t	v;

	memcpy(&v, p, sizeof(v));
	return v;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t	 h[FILETIER_HDR];
	struct obj_key	 k, other;
	uint64_t	 len, csum, want_len;
	size_t		 n = size < sizeof(h) ? size : sizeof(h);
	int		 rc;

	/* The key the input itself names (so that both 0 and -ESTALE are reachable). */
	memset(&k, 0, sizeof(k));
	if (size >= 72) {
		memcpy(k.fingerprint, data + 16, 16);
		k.pool = data[32];
		k.shard = (uint16_t)(data[34] | data[35] << 8);
		memcpy(k.hash, data + 40, 32);
	}
	memset(h, 0, sizeof(h));
	memcpy(h, data, n);
	rc = filetier_hdr_parse(h, n, &k, &len, &csum);
	if (rc != 0 && rc != -ENODATA && rc != -EUCLEAN && rc != -ESTALE)
		abort();
	if (rc == 0 && (len == 0 || len > FILETIER_OBJ_MAX))
		abort();

	/* Round trip of a header made from the input. */
	if (size < 72 + 17)
		return 0;
	want_len = fuzz_u64(data + 72) % FILETIER_OBJ_MAX + 1;
	filetier_hdr_make(h, &k, want_len, fuzz_u64(data + 80));
	if (filetier_hdr_parse(h, sizeof(h), &k, &len, &csum) != 0 || len != want_len ||
	    csum != fuzz_u64(data + 80))
		abort();
	if (filetier_hdr_parse(h, FUZZ_HDR_CHECKED - 1, &k, &len, &csum) != -ENODATA)
		abort();
	other = k;
	other.hash[data[88] % sizeof(other.hash)] ^= 1;
	if (filetier_hdr_parse(h, sizeof(h), &other, &len, &csum) != -ESTALE)
		abort();
	h[data[88] % FUZZ_HDR_CHECKED] ^= (uint8_t)(data[88] | 1);
	if (filetier_hdr_parse(h, sizeof(h), &k, &len, &csum) == 0)
		abort();
	return 0;
}
