/*
 * l3kvd: the decode-side KV-cache daemon. Parses the command line, loads
 * the configuration (a file, or the embedded default), detects the GPU,
 * and runs the server loop in the foreground until SIGTERM or SIGINT;
 * SIGHUP re-reads the file (reload.c).
 * l3kvd never forks or daemonizes: systemd (Type=notify) supervises it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "kernels.h"

static void __attribute__((noreturn))
usage(int code)
{
	fprintf(code == 0 ? stdout : stderr,
	    "usage: l3kvd [-dhnV] [-f config.json]\n"
	    "  -f FILE  configuration file (default: the embedded default config)\n"
	    "  -n       check the configuration, print \"configuration OK\", exit\n"
	    "  -d       debug logging (overrides log.level)\n"
	    "  -V       print the version and exit\n"
	    "  -h       this help\n");
	exit(code);
}

int
main(int argc, char **argv)
{
	static struct config	 cfg;
	struct server		 server;
	const char		*file = NULL;
	char			 err[CONFIG_ERR_MAX], gpu[256];
	int			 ch, check_only = 0, debug = 0, rc, ngpu;

	fabric_init_env();
	while ((ch = getopt(argc, argv, "df:hnV")) != -1) {
		switch (ch) {
		case 'd':
			debug = 1;
			break;
		case 'f':
			file = optarg;
			break;
		case 'h':
			usage(0);
		case 'n':
			check_only = 1;
			break;
		case 'V':
			printf("l3kvd %s (protocol %d)\n", L3KV_VERSION, PROTO_VERSION);
			return 0;
		default:
			usage(2);
		}
	}
	if (optind != argc)
		usage(2);

	if (file != NULL)
		rc = config_load_file(&cfg, file, err, sizeof(err));
	else {
		rc = config_load_string(&cfg, config_default_json(), "(embedded default)", err,
		    sizeof(err));
		if (rc == 0)
			rc = config_apply_env(&cfg, err, sizeof(err));
	}
	if (rc != 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (check_only) {
		printf("configuration OK\n");
		return 0;
	}

	log_init(debug ? LOG_LEVEL_DEBUG : cfg.log_level);
	log_info("main", "l3kvd %s starting (pid %d, config %s)", L3KV_VERSION, (int)getpid(),
	    file != NULL ? file : "embedded default");
	memset(&server, 0, sizeof(server));
	ngpu = cfg.copy_engine == CONFIG_COPY_HOST ? 0 : gpu_detect(gpu, sizeof(gpu));
	if (cfg.copy_engine == CONFIG_COPY_CUDA && ngpu == 0)
		fatalx("main", "copy_engine is cuda but no GPU is usable: %s", gpu);
	if (cfg.copy_engine != CONFIG_COPY_HOST)
		log_info("main", "gpu: %s", gpu);

	if ((rc = server_init(&server, &cfg, ngpu, err, sizeof(err))) != 0) {
		log_error("main", "%s", err);
		server_free(&server);
		return 1;
	}
	/* What SIGHUP and RELOAD re-read: this file (-d still set the first log level). */
	server.config_path = file;
	rc = server_run(&server);
	server_free(&server);
	return rc == 0 ? 0 : 1;
}
