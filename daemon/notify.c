/*
 * The systemd notification protocol: one datagram to $NOTIFY_SOCKET.
 * Written by hand rather than linking libsystemd because it is a single
 * sendmsg, and l3kvd must also run where systemd is not.
 *
 * Also what the watchdog (WatchdogSec= in the unit) and reloads need:
 * the interval systemd asks pings at ($WATCHDOG_USEC, for this process
 * only when $WATCHDOG_PID names it), and CLOCK_MONOTONIC in
 * microseconds, which RELOADING=1 carries as MONOTONIC_USEC= so that
 * systemd 253's Type=notify-reload can tell this reload from an older one.
 */
#include <sys/socket.h>
#include <sys/un.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

/* Sends state ("READY=1", "STOPPING=1"); 0 when unset, else 0 or -errno. */
int
notify_send(const char *state)
{
	struct sockaddr_un	 sun;
	const char		*path = getenv("NOTIFY_SOCKET");
	socklen_t		 len;
	size_t			 plen;
	int			 fd, rc = 0;

	if (path == NULL || *path == '\0')
		return 0;
	plen = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || plen >= sizeof(sun.sun_path))
		return -EINVAL;
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, plen);
	if (path[0] == '@')
		sun.sun_path[0] = '\0';	/* abstract namespace */
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen);
	if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
		return -errno;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sun, len) < 0)
		rc = -errno;
	close(fd);
	if (rc != 0)
		log_warn("notify", "%s to %s: %s", state, path, strerror(-rc));
	return rc;
}

/* notify_send() of a formatted state ("RELOADING=1\nMONOTONIC_USEC=..."). */
int
notify_sendf(const char *fmt, ...)
{
	char	buf[256];
	va_list	ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return notify_send(buf);
}

uint64_t
notify_watchdog_usec(void)
{
	const char		*s = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	char			*end;
	unsigned long long	 v;

	if (s == NULL || *s == '\0')
		return 0;
	/* Set by systemd for the main process; a child it was inherited by must not ping. */
	if (pid != NULL && *pid != '\0') {
		errno = 0;
		v = strtoull(pid, &end, 10);
		if (errno != 0 || *end != '\0' || v != (unsigned long long)getpid())
			return 0;
	}
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v == 0) {
		log_warn("notify", "WATCHDOG_USEC=%s is not a number of microseconds; no watchdog", s);
		return 0;
	}
	return (uint64_t)v;
}

uint64_t
notify_monotonic_usec(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}
