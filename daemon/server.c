/*
 * The server: the listening Unix socket, admission of peers, signals and
 * the shutdown drain, around the one libevent loop that owns all state.
 *
 * The socket is created carefully, because operators run l3kvd next to
 * engines that may still hold an old path: a lock file beside the socket
 * serialises daemons on one path; a live daemon answering on it is a
 * refusal to start; a stale socket (nobody answers) is removed; anything
 * else at the path is left alone and is a refusal. The socket is bound
 * under a tight umask and then given its configured mode and group, so it
 * is never reachable with wider permissions than asked for.
 */
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "daemon.h"

#define SERVER_BACKLOG	512
/* Out of fds: how long accepting pauses, and how often that is logged. */
#define SERVER_NOFD_PAUSE_MS	100
#define SERVER_NOFD_LOG_MS	10000

static int server_lock_fd = -1;

static void	server_conn_closed(struct conn *, void *);

uint64_t
server_now_ms(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t
server_now_ns(void)
{
	struct timespec	ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int
server_sockaddr(const char *path, struct sockaddr_un *sun, char *err, size_t errlen)
{
	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sun->sun_path)) {
		snprintf(err, errlen, "socket path %s is too long", path);
		return -ENAMETOOLONG;
	}
	memcpy(sun->sun_path, path, strlen(path));
	return 0;
}

/* Creates the socket's directory if it is missing (one level). */
static int
server_mkdir(const char *path, char *err, size_t errlen)
{
	char	copy[CONFIG_PATH_MAX], *dir;
	int	rc;

	snprintf(copy, sizeof(copy), "%s", path);
	dir = dirname(copy);
	if (mkdir(dir, 0755) == 0) {
		log_info("server", "created directory %s", dir);
		return 0;
	}
	if (errno == EEXIST)
		return 0;
	rc = -errno;
	snprintf(err, errlen, "mkdir %s: %s", dir, strerror(-rc));
	return rc;
}

/*
 * Takes the lock beside the socket; fails if another l3kvd holds it. The
 * lock file is never unlinked: removing it would let two daemons lock two
 * different files of the same name.
 */
static int
server_lock(const char *path, char *err, size_t errlen)
{
	char	lock[CONFIG_PATH_MAX + 8];
	int	fd, rc;

	snprintf(lock, sizeof(lock), "%s.lock", path);
	if ((fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "open %s: %s", lock, strerror(-rc));
		return rc;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		rc = -errno;
		snprintf(err, errlen, "another l3kvd holds %s", lock);
		close(fd);
		return rc == -EWOULDBLOCK ? -EADDRINUSE : rc;
	}
	server_lock_fd = fd;
	return 0;
}

/* Refuses a live socket, removes a stale one, refuses a non-socket. */
static int
server_clear_path(const char *path, const struct sockaddr_un *sun, char *err, size_t errlen)
{
	struct stat	st;
	int		fd, rc;

	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s exists and is not a socket; not touching it", path);
		return -EEXIST;
	}
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return -errno;
	rc = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
	close(fd);
	if (rc == 0) {
		snprintf(err, errlen, "a live daemon answers on %s", path);
		return -EADDRINUSE;
	}
	if (unlink(path) < 0 && errno != ENOENT) {
		rc = -errno;
		snprintf(err, errlen, "removing stale socket %s: %s", path, strerror(-rc));
		return rc;
	}
	log_info("server", "removed stale socket %s", path);
	return 0;
}

static int
server_listen(struct server *s, char *err, size_t errlen)
{
	struct config		*cfg = s->cfg;
	struct sockaddr_un	 sun;
	struct group		*gr;
	mode_t			 old;
	gid_t			 gid = (gid_t)-1;
	int			 fd, rc;

	if ((rc = server_sockaddr(cfg->socket_path, &sun, err, errlen)) != 0)
		return rc;
	if (cfg->socket_group[0] != '\0') {
		if ((gr = getgrnam(cfg->socket_group)) == NULL) {
			snprintf(err, errlen, "socket.group: no group named %s", cfg->socket_group);
			return -ENOENT;
		}
		gid = gr->gr_gid;
	}
	if ((rc = server_mkdir(cfg->socket_path, err, errlen)) != 0)
		return rc;
	if ((rc = server_lock(cfg->socket_path, err, errlen)) != 0)
		return rc;
	if ((rc = server_clear_path(cfg->socket_path, &sun, err, errlen)) != 0)
		return rc;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "socket: %s", strerror(-rc));
		return rc;
	}
	old = umask(0177);
	rc = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
	umask(old);
	if (rc < 0) {
		rc = -errno;
		snprintf(err, errlen, "bind %s: %s", cfg->socket_path, strerror(-rc));
		goto fail;
	}
	if (gid != (gid_t)-1 && chown(cfg->socket_path, (uid_t)-1, gid) < 0) {
		rc = -errno;
		snprintf(err, errlen, "chown %s to group %s: %s", cfg->socket_path,
		    cfg->socket_group, strerror(-rc));
		goto fail_unlink;
	}
	if (chmod(cfg->socket_path, (mode_t)cfg->socket_mode) < 0) {
		rc = -errno;
		snprintf(err, errlen, "chmod %s: %s", cfg->socket_path, strerror(-rc));
		goto fail_unlink;
	}
	if (listen(fd, SERVER_BACKLOG) < 0) {
		rc = -errno;
		snprintf(err, errlen, "listen: %s", strerror(-rc));
		goto fail_unlink;
	}
	s->listen_fd = fd;
	return 0;

fail_unlink:
	unlink(cfg->socket_path);
fail:
	close(fd);
	return rc;
}

/* Whether a peer's credentials are on the allow-list. */
static int
server_peer_allowed(struct server *s, uid_t uid, gid_t gid)
{
	size_t	i;

	if (uid == 0 || uid == geteuid())
		return 1;
	for (i = 0; i < s->cfg->nallow_uids; i++)
		if (s->cfg->allow_uids[i] == uid)
			return 1;
	for (i = 0; i < s->cfg->nallow_gids; i++)
		if (s->cfg->allow_gids[i] == gid)
			return 1;
	return 0;
}

unsigned
server_conns_of_uid(struct server *s, uid_t uid)
{
	struct conn	*c;
	unsigned	 n = 0;

	TAILQ_FOREACH(c, &s->conns, entry)
		if (c->uid == uid)
			n++;
	return n;
}

/*
 * Refuses a peer with one ERROR frame sent straight on the socket (it is
 * small enough to fit the socket buffer), then lets it linger
 * (conn_linger) so that the peer reads the frame even if it is writing
 * its HELLO meanwhile; with linger 0 (no fd to spare) it is closed.
 */
static void
server_refuse(struct server *s, int fd, unsigned status, const char *msg, int linger)
{
	struct {
		struct proto_hdr	h;
		char			msg[PROTO_ERRMSG_MAX];
	} f;
	size_t	len = strlen(msg) < PROTO_ERRMSG_MAX ? strlen(msg) : PROTO_ERRMSG_MAX;

	proto_hdr_init(&f.h, PROTO_T_ERROR, (uint32_t)len, 0);
	f.h.flags = PROTO_F_REPLY;
	f.h.status = (uint16_t)status;
	memcpy(f.msg, msg, len);
	if (send(fd, &f, sizeof(f.h) + len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		log_debug("server", "refusal not delivered: %s", strerror(errno));
	if (linger)
		conn_linger(s, fd);
	else {
		shutdown(fd, SHUT_WR);
		close(fd);
	}
}

static void
server_accept_resume_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct server	*s = arg;

	(void)fd;
	(void)ev;
	if (s->listen_fd >= 0 && event_add(s->ev_listen, NULL) != 0)
		log_warn("server", "cannot resume accepting");
}

/*
 * accept() failed with EMFILE or ENFILE: a peer waits in the backlog and
 * no fd is there for it. The spare fd is given up to accept it and refuse
 * it with a frame (instead of leaving it to hang), then taken back; and
 * accepting pauses SERVER_NOFD_PAUSE_MS, because the listening socket
 * stays readable and would otherwise spin the loop. Logged once per
 * SERVER_NOFD_LOG_MS with the count since.
 */
static void
server_accept_nofd(struct server *s, int err)
{
	struct timeval	tv = { 0, SERVER_NOFD_PAUSE_MS * 1000 };
	uint64_t	now = server_now_ms();
	int		fd = -1;

	if (s->spare_fd >= 0) {
		close(s->spare_fd);
		s->spare_fd = -1;
		fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	}
	if (fd >= 0) {
		metrics.connections_no_fd++;
		metrics.connections_limited++;
		s->nofd_unlogged++;
		server_refuse(s, fd, PROTO_S_LIMIT, "the daemon is out of file descriptors", 0);
	}
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (now - s->nofd_logged_ms >= SERVER_NOFD_LOG_MS || s->nofd_logged_ms == 0) {
		log_warn("server", "accept: %s: %llu connections refused since the last such "
		    "message; accepting pauses %u ms at a time%s", strerror(err),
		    (unsigned long long)s->nofd_unlogged, SERVER_NOFD_PAUSE_MS,
		    s->spare_fd < 0 ? "; no spare fd to refuse with" : "");
		s->nofd_logged_ms = now;
		s->nofd_unlogged = 0;
	}
	event_del(s->ev_listen);
	if (s->ev_accept_pause == NULL || evtimer_add(s->ev_accept_pause, &tv) != 0)
		event_add(s->ev_listen, NULL);	/* better to spin than to stop serving */
}

static void
server_accept_cb(evutil_socket_t lfd, short ev, void *arg)
{
	struct server	*s = arg;
	struct conn	*c;
	struct ucred	 cred;
	socklen_t	 len;
	char		 msg[128];
	int		 fd, i;

	(void)ev;
	/* A bounded batch per wakeup keeps accepts from starving frames. */
	for (i = 0; i < 64; i++) {
		fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				server_accept_nofd(s, errno);
			else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("server", "accept: %s", strerror(errno));
			return;
		}
		len = sizeof(cred);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
			log_warn("server", "SO_PEERCRED: %s", strerror(errno));
			close(fd);
			continue;
		}
		if (!server_peer_allowed(s, cred.uid, cred.gid)) {
			metrics.connections_denied++;
			log_warn("server", "denied pid %d uid %u gid %u: not in access.allow_uids or "
			    "access.allow_gids", (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
			snprintf(msg, sizeof(msg), "uid %u is not allowed", (unsigned)cred.uid);
			server_refuse(s, fd, PROTO_S_DENIED, msg, 1);
			continue;
		}
		if (s->nconns >= s->cfg->max_connections ||
		    server_conns_of_uid(s, cred.uid) >= s->cfg->max_connections_per_uid) {
			metrics.connections_limited++;
			log_warn("server", "refused pid %d uid %u: connection limit (%u total, %u per uid)",
			    (int)cred.pid, (unsigned)cred.uid, s->cfg->max_connections,
			    s->cfg->max_connections_per_uid);
			snprintf(msg, sizeof(msg), "connection limit reached for uid %u",
			    (unsigned)cred.uid);
			server_refuse(s, fd, PROTO_S_LIMIT, msg, 1);
			continue;
		}
		if ((c = conn_new(s, fd, cred.uid, cred.gid, cred.pid, PROTO_CHAN_ENGINE,
		    dispatch_frame, server_conn_closed, s)) == NULL) {
			log_warn("server", "out of memory for a connection");
			server_refuse(s, fd, PROTO_S_NO_MEMORY, "out of memory", 1);
			continue;
		}
		TAILQ_INSERT_TAIL(&s->conns, c, entry);
		s->nconns++;
		metrics.connections_accepted++;
		log_debug("server", "accepted pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
	}
}

/* The systemd watchdog: a ping from the loop itself, so that a wedged loop stops them. */
static void
server_watchdog_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	(void)arg;
	metrics.watchdog_pings++;
	notify_send("WATCHDOG=1");
}

/* Pings at half of $WATCHDOG_USEC, as sd_watchdog_enabled(3) advises; none without it. */
static int
server_watchdog(struct server *s, char *err, size_t errlen)
{
	struct timeval	tv;
	uint64_t	usec = notify_watchdog_usec() / 2;

	if (usec == 0)
		return 0;
	tv.tv_sec = (time_t)(usec / 1000000);
	tv.tv_usec = (suseconds_t)(usec % 1000000);
	s->ev_watchdog = event_new(s->base, -1, EV_PERSIST, server_watchdog_cb, s);
	if (s->ev_watchdog == NULL || event_add(s->ev_watchdog, &tv) != 0) {
		snprintf(err, errlen, "cannot register the watchdog timer");
		return -ENOMEM;
	}
	log_info("server", "systemd watchdog: WATCHDOG=1 every %llu ms",
	    (unsigned long long)(usec / 1000));
	return 0;
}

static void
server_finish(struct server *s)
{
	log_info("server", "stopped");
	event_base_loopexit(s->base, NULL);
}

/* Copy jobs in flight on both engines, file tier I/O, and write-throughs waiting for it. */
unsigned
server_copies_inflight(const struct server *s)
{
	return (s->copy != NULL ? copy_inflight(s->copy) : 0) + cuda_inflight(s->cuda) +
	    (s->file != NULL ? filetier_inflight(s->file) : 0) + publish_backlog_waiting(s) +
	    peer_inflight(s);
}

/* Ends a drain once the last connection and the last copy are gone. */
void
server_maybe_finish(struct server *s)
{
	if (s->stopping && s->nconns == 0 && server_copies_inflight(s) == 0)
		server_finish(s);
}

/*
 * conn.c's closed callback for an engine connection: its session ends
 * (the one teardown path), then it leaves the list, which may end a drain.
 */
static void
server_conn_closed(struct conn *c, void *arg)
{
	struct server	*s = arg;

	dispatch_session_end(c, NULL);
	TAILQ_REMOVE(&s->conns, c, entry);
	s->nconns--;
	server_maybe_finish(s);
}

static void
server_drain_timeout_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct server	*s = arg;

	(void)fd;
	(void)ev;
	log_warn("server", "drain took longer than %u ms; exiting with %u connections open",
	    s->cfg->drain_ms, s->nconns);
	server_finish(s);
}

/*
 * SIGTERM/SIGINT: stop accepting, let every connection finish what it
 * has in flight and flush its replies, then leave the loop (bounded by
 * shutdown.drain_ms).
 */
static void
server_signal_cb(evutil_socket_t sig, short ev, void *arg)
{
	struct server	*s = arg;
	struct conn	*c, *next;
	struct timeval	 tv;

	(void)ev;
	if (s->stopping)
		return;
	s->stopping = 1;
	log_info("server", "%s: stopping; draining %u connections", strsignal((int)sig),
	    s->nconns);
	notify_send("STOPPING=1");
	event_del(s->ev_listen);
	event_del(s->ev_accept_pause);
	peer_stop(s);
	close(s->listen_fd);
	s->listen_fd = -1;
	unlink(s->cfg->socket_path);
	if (s->nconns == 0 && server_copies_inflight(s) == 0) {
		server_finish(s);
		return;
	}
	tv.tv_sec = s->cfg->drain_ms / 1000;
	tv.tv_usec = (s->cfg->drain_ms % 1000) * 1000;
	s->ev_drain = evtimer_new(s->base, server_drain_timeout_cb, s);
	if (s->ev_drain != NULL)
		evtimer_add(s->ev_drain, &tv);
	/*
	 * Every connection closes once its replies are flushed; its session's
	 * copies are cancelled, and the loop ends when the last completion ran.
	 */
	for (c = TAILQ_FIRST(&s->conns); c != NULL; c = next) {
		next = TAILQ_NEXT(c, entry);
		conn_close(c);
	}
}

/*
 * Makes the server: the DRAM tier, the file tier where tiers.file.path is
 * set, the host copy engine, the cuda copy
 * engine where ngpu GPUs were found (copy_engine auto or cuda), the
 * socket and the signals. 0 or -errno with err filled; server_free
 * undoes any part.
 */
/*
 * Raises the soft open-file limit to the hard one: the file tier's
 * open-file cache takes up to half of it, and connections and memory fds
 * the rest. The unit sets both (LimitNOFILE=); a shell's soft 1024 would
 * leave the cache next to nothing.
 */
static void
server_raise_nofile(void)
{
	struct rlimit	rl;
	rlim_t		was;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	was = rl.rlim_cur;
	/* unlimited is not a value the kernel takes for files: fs.nr_open's default */
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
		log_warn("server", "open-file limit %llu: raising it to %llu: %s",
		    (unsigned long long)was, (unsigned long long)rl.rlim_cur, strerror(errno));
		return;
	}
	log_info("server", "open-file limit raised from %llu to %llu", (unsigned long long)was,
	    (unsigned long long)rl.rlim_cur);
}

int
server_init(struct server *s, struct config *cfg, int ngpu, char *err, size_t errlen)
{
	int	rc;

	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	s->listen_fd = -1;
	s->spare_fd = -1;
	TAILQ_INIT(&s->conns);
	TAILQ_INIT(&s->lingering);
	TAILQ_INIT(&s->namespaces);
	TAILQ_INIT(&s->groups);
	s->started_ms = server_now_ms();
	dispatch_init();
	signal(SIGPIPE, SIG_IGN);
	server_raise_nofile();
	/* What a lease's end means above lease.c, which never calls up by name. */
	lease_set_hooks(&(struct lease_hooks){ .group_fail = restore_fail_group,
	    .admission_gone = admission_lease_gone });
	if ((s->base = event_base_new()) == NULL) {
		snprintf(err, errlen, "event_base_new failed");
		return -ENOMEM;
	}
	if ((rc = dram_new(&s->dram, cfg->dram_size, err, errlen)) != 0)
		return rc;
	if (cfg->file_path[0] != '\0') {
		struct filetier_params	fp;

		filetier_params_default(&fp);
		fp.root = cfg->file_path;
		fp.capacity = cfg->file_capacity;
		fp.fsync = cfg->file_fsync;
		fp.readers = cfg->file_readers;
		fp.read_depth = cfg->file_read_depth;
		fp.fd_cache = cfg->file_fd_cache;
		fp.scan_delay_ms = cfg->test_scan_delay_ms;
		fp.read_delay_ms = cfg->test_read_delay_ms;
		fp.max_namespaces = cfg->max_namespaces;
		if ((rc = filetier_new(s->base, &fp, &s->file, err, errlen)) != 0)
			return rc;
		log_info("server", "file tier at %s, capacity %llu bytes, %u readers x %u reads, "
		    "open-file cache %u%s", cfg->file_path, (unsigned long long)cfg->file_capacity,
		    cfg->file_readers, cfg->file_read_depth, cfg->file_fd_cache,
		    cfg->file_fsync ? ", fsync" : "");
	}
	rc = copy_engine_new(s->base, (int)cfg->copy_workers, cfg->test_copy_delay_ms, &s->copy,
	    err, errlen);
	if (rc != 0)
		return rc;
	s->cuda_none = cfg->copy_engine == CONFIG_COPY_HOST ? "copy_engine is host" : "no GPU";
	if (ngpu > 0 && cfg->copy_engine != CONFIG_COPY_HOST) {
		rc = cuda_engine_new(s->base, s->dram, ngpu, cfg->test_cuda_engines_per_gpu,
		    &s->cuda, err, errlen);
		if (rc != 0 && cfg->copy_engine == CONFIG_COPY_CUDA)
			return rc;
		if (rc != 0) {
			log_warn("server", "%s; copy_engine auto: GPU memory will be refused", err);
			s->cuda_none = "the GPU could not be set up: see the daemon's log";
			err[0] = '\0';
		}
	}
	s->gpu_present = s->cuda != NULL;
	/*
	 * Signals before the socket: a client (a test) may connect and send
	 * SIGTERM at once, and until libevent handles it the handler of a
	 * library loaded at start runs (libfabric's psm, libinfinipath, calls
	 * exit(1)), not our drain.
	 */
	s->ev_sigterm = evsignal_new(s->base, SIGTERM, server_signal_cb, s);
	s->ev_sigint = evsignal_new(s->base, SIGINT, server_signal_cb, s);
	if (s->ev_sigterm == NULL || s->ev_sigint == NULL || event_add(s->ev_sigterm, NULL) != 0 ||
	    event_add(s->ev_sigint, NULL) != 0) {
		snprintf(err, errlen, "cannot register events");
		return -ENOMEM;
	}
	if ((rc = reload_init(s, err, errlen)) != 0 || (rc = server_watchdog(s, err, errlen)) != 0 ||
	    (rc = peer_init(s, err, errlen)) != 0)
		return rc;
	/*
	 * /metrics, /health, /ready (httpd.c), before the engine socket: a
	 * port that cannot be bound stops the start before any engine could
	 * connect. It serves through the drain too.
	 */
	reload_set_hook("metrics.", httpd_reload);
	if (cfg->metrics_listen[0] != '\0' &&
	    (rc = httpd_new(s, cfg->metrics_listen, &s->httpd, err, errlen)) != 0)
		return rc;
	if ((rc = server_listen(s, err, errlen)) != 0)
		return rc;
	s->ev_listen = event_new(s->base, s->listen_fd, EV_READ | EV_PERSIST, server_accept_cb, s);
	s->ev_accept_pause = evtimer_new(s->base, server_accept_resume_cb, s);
	/* Kept for the moment fds run out: see server_accept_nofd(). */
	if ((s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "open /dev/null: %s", strerror(-rc));
		return rc;
	}
	if (s->ev_listen == NULL || s->ev_accept_pause == NULL || event_add(s->ev_listen, NULL) != 0) {
		snprintf(err, errlen, "cannot register events");
		return -ENOMEM;
	}
	return 0;
}

int
server_run(struct server *s)
{
	log_info("server", "listening on %s (mode %04o), role %s, copy engine %s",
	    s->cfg->socket_path, s->cfg->socket_mode, s->cfg->role,
	    s->gpu_present ? "cuda" : "host");
	notify_send("READY=1");
	if (event_base_dispatch(s->base) < 0)
		return -EIO;
	return 0;
}

/* Frees what server_init() made, in reverse order. Idempotent. */
void
server_free(struct server *s)
{
	struct conn	*c;

	httpd_free(s->httpd);
	s->httpd = NULL;
	/* Workers first: nothing may still write into engine memory or the arena. */
	copy_engine_free(s->copy);
	s->copy = NULL;
	/*
	 * GPU ops cancelled and waited for; regions of sessions still held by
	 * a dropped completion stay open until exit.
	 */
	cuda_engine_free(s->cuda);
	s->cuda = NULL;
	while ((c = TAILQ_FIRST(&s->conns)) != NULL)
		conn_free(c);
	peer_free(s);
	/* After the connections, which may have left sockets lingering. */
	conn_linger_free_all(s);
	/*
	 * After the leases (they unpin file objects) and before the arena
	 * (writers read object bytes from it): joins the file tier's threads;
	 * writes still queued are dropped and never become visible.
	 */
	publish_backlog_free(s);
	filetier_free(s->file);
	s->file = NULL;
	dram_free(s->dram);
	s->dram = NULL;
	reload_free(s);
	if (s->ev_watchdog != NULL)
		event_free(s->ev_watchdog);
	s->ev_watchdog = NULL;
	if (s->ev_drain != NULL)
		event_free(s->ev_drain);
	if (s->ev_sigint != NULL)
		event_free(s->ev_sigint);
	if (s->ev_sigterm != NULL)
		event_free(s->ev_sigterm);
	if (s->ev_listen != NULL)
		event_free(s->ev_listen);
	if (s->ev_accept_pause != NULL)
		event_free(s->ev_accept_pause);
	s->ev_drain = s->ev_sigint = s->ev_sigterm = s->ev_listen = s->ev_accept_pause = NULL;
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	s->spare_fd = -1;
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		unlink(s->cfg->socket_path);
		s->listen_fd = -1;
	}
	if (s->base != NULL)
		event_base_free(s->base);
	s->base = NULL;
	if (server_lock_fd >= 0)
		close(server_lock_fd);
	server_lock_fd = -1;
}
