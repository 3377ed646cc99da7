/*
 * The systemd notification protocol: one datagram to $NOTIFY_SOCKET.
 * Written by hand rather than linking libsystemd because it is a single
 * sendmsg, and l3kvd must also run where systemd is not.
 */
#include <sys/socket.h>
#include <sys/un.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
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
