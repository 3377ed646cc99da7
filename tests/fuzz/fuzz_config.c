/*
 * libFuzzer harness for config_load_string(): any bytes, as a config.
 *
 * Beyond "no crash, no leak, no sanitizer report", it checks what the
 * daemon relies on: a load returns 0 or -EINVAL, a failure always leaves
 * a one-line message that starts with the name, and a success leaves
 * every string terminated and every count within its array. A second
 * load into a 7-byte buffer exercises truncation.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

int	LLVMFuzzerTestOneInput(const uint8_t *, size_t);

static void
fuzz_check(const struct config *cfg, int rc, const char *err)
{
	if (rc == -EINVAL) {
		if (strncmp(err, "fuzz.json:", 10) != 0 || strchr(err, '\n') != NULL)
			abort();
		return;
	}
	if (rc != 0)
		abort();
	if (memchr(cfg->socket_path, '\0', sizeof(cfg->socket_path)) == NULL ||
	    cfg->socket_path[0] == '\0' ||
	    memchr(cfg->socket_group, '\0', sizeof(cfg->socket_group)) == NULL ||
	    memchr(cfg->role, '\0', sizeof(cfg->role)) == NULL ||
	    memchr(cfg->model, '\0', sizeof(cfg->model)) == NULL ||
	    memchr(cfg->metrics_listen, '\0', sizeof(cfg->metrics_listen)) == NULL)
		abort();
	if (cfg->nallow_uids > CONFIG_IDS_MAX || cfg->nallow_gids > CONFIG_IDS_MAX)
		abort();
	if (cfg->socket_mode > 0777 || cfg->max_frame < PROTO_FRAME_MIN ||
	    cfg->max_frame > PROTO_FRAME_MAX || cfg->log_level < LOG_LEVEL_ERROR ||
	    cfg->log_level > LOG_LEVEL_DEBUG)
		abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config	 cfg;
	char		*text, err[CONFIG_ERR_MAX], small[7];
	int		 rc;

	/* config_load_string() takes a C string: stop at the first NUL. */
	if ((text = malloc(size + 1)) == NULL)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';

	rc = config_load_string(&cfg, text, "fuzz.json", err, sizeof(err));
	fuzz_check(&cfg, rc, err);
	if (config_load_string(&cfg, text, "fuzz.json", small, sizeof(small)) != rc)
		abort();
	if (rc != 0 && strlen(small) != sizeof(small) - 1)
		abort();
	free(text);
	return 0;
}
