/*
 * Logging to stderr, one line per event: a UTC timestamp, the level, the
 * subsystem and the message. systemd's journal adds its own timestamp,
 * but operators also run l3kvd by hand, and a line that says when is
 * worth the few bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"

static int log_level = LOG_LEVEL_INFO;

static const char *const log_names[] = {
	[LOG_LEVEL_ERROR] = "error",
	[LOG_LEVEL_WARN] = "warn",
	[LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_DEBUG] = "debug",
};

void
log_init(int level)
{
	log_level = level;
	/* Line buffering keeps lines whole when stderr is a pipe or file. */
	setvbuf(stderr, NULL, _IOLBF, 0);
}

void
log_set_level(int level)
{
	log_level = level;
}

int
log_get_level(void)
{
	return log_level;
}

int
log_level_parse(const char *name, int *level)
{
	int	i;

	for (i = LOG_LEVEL_ERROR; i <= LOG_LEVEL_DEBUG; i++) {
		if (strcmp(name, log_names[i]) == 0) {
			*level = i;
			return 0;
		}
	}
	return -1;
}

const char *
log_level_name(int level)
{
	if (level < LOG_LEVEL_ERROR || level > LOG_LEVEL_DEBUG)
		return "?";
	return log_names[level];
}

static void
log_vmsg(int level, const char *subsys, const char *fmt, va_list ap)
{
	struct timespec	ts;
	struct tm	tm;
	char		when[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	flockfile(stderr);
	fprintf(stderr, "%s.%03ldZ %s %s: ", when, ts.tv_nsec / 1000000,
	    log_level_name(level), subsys);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	funlockfile(stderr);
}

void
log_msg(int level, const char *subsys, const char *fmt, ...)
{
	va_list	ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	log_vmsg(level, subsys, fmt, ap);
	va_end(ap);
}

void
fatalx(const char *subsys, const char *fmt, ...)
{
	va_list	ap;

	va_start(ap, fmt);
	log_vmsg(LOG_LEVEL_ERROR, subsys, fmt, ap);
	va_end(ap);
	exit(1);
}
