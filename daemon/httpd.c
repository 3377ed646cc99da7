/*
 * metrics.listen's HTTP server: /metrics (prom.c's exposition), /health
 * (liveness: answered while the loop runs) and /ready (200 while the
 * daemon accepts engines and its tiers are up, 503 with the reason). It
 * is libevent's evhttp on the daemon's own loop, so a scrape reads the
 * counters with no lock; what it costs the engine sockets is the time to
 * print them (bounded: prom.c), and nothing a client sends can make it
 * more.
 *
 * Whoever reaches the port is treated as hostile: headers are bounded
 * (HTTPD_HEADERS_MAX), bodies too (HTTPD_BODY_MAX), an idle connection
 * is closed after HTTPD_IDLE_S, every connection after HTTPD_CONN_MS
 * whatever it sends (a slow trickle of header bytes resets evhttp's idle
 * timer, not this one), and no more than HTTPD_CONNS_MAX are open at
 * once, so the port cannot take the file descriptors the engine socket
 * needs. Only GET and HEAD are served (405 otherwise), on the three paths
 * (404 otherwise); every reply closes its connection.
 *
 * evhttp (libevent 2.1) has neither a connection limit nor a hook when a
 * connection goes, so the server makes each connection's bufferevent
 * itself (evhttp_set_bevcb) and keeps a reference to it: the socket stays
 * open, and its number unused by anything else, until this module lets
 * go, which it does once evhttp has freed the connection (its callbacks
 * are cleared then). A sweep once a second (at once for a connection over
 * the limit) shuts down the sockets past their time, which evhttp sees as
 * the peer gone, and lets go of the freed ones.
 */
#include <sys/socket.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "daemon.h"

#define HTTPD_CONNS_MAX		32
#define HTTPD_CONN_MS		10000	/* a connection's whole life */
#define HTTPD_IDLE_S		5	/* evhttp's read and write timeout */
#define HTTPD_HEADERS_MAX	8192	/* request line and headers */
#define HTTPD_BODY_MAX		1024
#define HTTPD_SWEEP_MS		1000

struct httpd_conn {
	struct bufferevent	*bev;		/* a reference of ours */
	uint64_t		 until;		/* server_now_ms: shut down then; 0: at once */
	int			 shut;
	TAILQ_ENTRY(httpd_conn)	 entry;
};
TAILQ_HEAD(httpd_conn_list, httpd_conn);

struct httpd {
	struct server		*server;
	struct evhttp		*http;
	struct event		*sweep;
	struct httpd_conn_list	 conns;
	unsigned		 nconns;
	char			 address[80];
};

static void
httpd_sweep_arm(struct httpd *h, int now)
{
	struct timeval	tv = { 0, now ? 0 : HTTPD_SWEEP_MS * 1000 };

	if (now)
		event_del(h->sweep);
	else if (evtimer_pending(h->sweep, NULL))
		return;
	evtimer_add(h->sweep, &tv);
}

/* Whether evhttp has let go of a connection's bufferevent (bufferevent_free clears them). */
static int
httpd_conn_freed(const struct httpd_conn *hc)
{
	bufferevent_event_cb	ecb = NULL;

	bufferevent_getcb(hc->bev, NULL, NULL, &ecb, NULL);
	return ecb == NULL;
}

/* Lets go of a connection evhttp has freed: our reference was the last, the socket closes. */
static void
httpd_conn_drop(struct httpd *h, struct httpd_conn *hc)
{
	TAILQ_REMOVE(&h->conns, hc, entry);
	h->nconns--;
	bufferevent_decref(hc->bev);
	free(hc);
}

static void
httpd_sweep_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct httpd		*h = arg;
	struct httpd_conn	*hc, *next;
	uint64_t		 now = server_now_ms();
	evutil_socket_t		 sfd;

	(void)fd;
	(void)ev;
	for (hc = TAILQ_FIRST(&h->conns); hc != NULL; hc = next) {
		next = TAILQ_NEXT(hc, entry);
		if (httpd_conn_freed(hc)) {
			httpd_conn_drop(h, hc);
			continue;
		}
		if (!hc->shut && now >= hc->until) {
			hc->shut = 1;
			if (hc->until != 0)
				metrics.http_conns_expired++;
			/* evhttp reads EOF and frees the connection; the next sweep lets go. */
			if ((sfd = bufferevent_getfd(hc->bev)) >= 0)
				shutdown(sfd, SHUT_RDWR);
		}
	}
	if (h->nconns > 0)
		httpd_sweep_arm(h, 0);
}

/* evhttp's bevcb: each new connection's bufferevent, made and tracked here. */
static struct bufferevent *
httpd_bev_cb(struct event_base *base, void *arg)
{
	struct httpd		*h = arg;
	struct httpd_conn	*hc, *next;
	struct bufferevent	*bev;

	/* Those evhttp let go of do not count against the limit. */
	for (hc = TAILQ_FIRST(&h->conns); hc != NULL; hc = next) {
		next = TAILQ_NEXT(hc, entry);
		if (httpd_conn_freed(hc))
			httpd_conn_drop(h, hc);
	}
	if ((bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE)) == NULL)
		return NULL;
	if ((hc = calloc(1, sizeof(*hc))) == NULL) {
		bufferevent_free(bev);
		return NULL;	/* evhttp makes its own; this one goes untracked */
	}
	bufferevent_incref(bev);
	hc->bev = bev;
	if (h->nconns >= HTTPD_CONNS_MAX) {
		hc->until = 0;		/* shut down at the next turn */
		metrics.http_conns_refused++;
	} else
		hc->until = server_now_ms() + HTTPD_CONN_MS;
	TAILQ_INSERT_TAIL(&h->conns, hc, entry);
	h->nconns++;
	httpd_sweep_arm(h, hc->until == 0);
	return bev;
}

/*
 * Sends b (which may be NULL). evhttp 2.1 sends a body after HEAD too: a
 * HEAD gets the GET's Content-Length and no body.
 */
static void
httpd_send(struct evhttp_request *req, int code, const char *reason, struct evbuffer *b)
{
	char	len[32];

	if (b != NULL && evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
		snprintf(len, sizeof(len), "%zu", evbuffer_get_length(b));
		evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Length", len);
		evbuffer_drain(b, evbuffer_get_length(b));
	}
	evhttp_send_reply(req, code, reason, b);
}

static void
httpd_reply(struct evhttp_request *req, int code, const char *reason, const char *body)
{
	struct evbuffer	*b = evbuffer_new();

	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
	    "text/plain; charset=utf-8");
	if (b != NULL && body != NULL)
		evbuffer_add(b, body, strlen(body));
	httpd_send(req, code, reason, b);
	if (b != NULL)
		evbuffer_free(b);
}

static void
httpd_metrics(struct httpd *h, struct evhttp_request *req)
{
	struct evbuffer	*b = evbuffer_new();
	uint64_t	 t0 = metrics_now_ns();
	int		 rc;

	rc = b != NULL ? prom_write(h->server, b) : -ENOMEM;
	metrics.http_scrape_ns = metrics_now_ns() - t0;
	if (rc != 0) {
		if (b != NULL)
			evbuffer_free(b);
		httpd_reply(req, HTTP_INTERNAL, "Internal Server Error", "out of memory\n");
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
	    "text/plain; version=0.0.4; charset=utf-8");
	httpd_send(req, HTTP_OK, "OK", b);
	evbuffer_free(b);
}

static void
httpd_request_cb(struct evhttp_request *req, void *arg)
{
	struct httpd			*h = arg;
	const struct evhttp_uri		*uri = evhttp_request_get_evhttp_uri(req);
	enum evhttp_cmd_type		 cmd = evhttp_request_get_command(req);
	struct evkeyvalq		*out = evhttp_request_get_output_headers(req);
	const char			*path = uri != NULL ? evhttp_uri_get_path(uri) : NULL;
	char				 why[200], line[208];

	evhttp_add_header(out, "Connection", "close");
	evhttp_add_header(out, "Cache-Control", "no-store");
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
		metrics.http_rejected++;
		evhttp_add_header(out, "Allow", "GET, HEAD");
		httpd_reply(req, 405, "Method Not Allowed", "only GET and HEAD are served\n");
		return;
	}
	if (path != NULL && strcmp(path, "/metrics") == 0) {
		metrics.http_requests[0]++;
		httpd_metrics(h, req);
	} else if (path != NULL && strcmp(path, "/health") == 0) {
		metrics.http_requests[1]++;
		httpd_reply(req, HTTP_OK, "OK", "ok\n");
	} else if (path != NULL && strcmp(path, "/ready") == 0) {
		metrics.http_requests[2]++;
		if (prom_ready(h->server, why, sizeof(why)))
			httpd_reply(req, HTTP_OK, "OK", "ready\n");
		else {
			snprintf(line, sizeof(line), "%s\n", why);
			httpd_reply(req, 503, "Service Unavailable", line);
		}
	} else {
		metrics.http_requests[3]++;
		httpd_reply(req, HTTP_NOTFOUND, "Not Found",
		    "not found: the paths are /metrics, /health and /ready\n");
	}
}

/* HOST:PORT, [V6]:PORT or :PORT (the loopback) into host and port. */
static int
httpd_parse(const char *listen, char *host, size_t hostlen, uint16_t *port, char *err,
    size_t errlen)
{
	const char	*colon = strrchr(listen, ':');
	char		*end;
	unsigned long	 p;
	size_t		 n;

	if (colon == NULL)
		goto bad;
	p = strtoul(colon + 1, &end, 10);
	if (colon[1] == '\0' || *end != '\0' || p < 1 || p > 65535)
		goto bad;
	n = (size_t)(colon - listen);
	if (n >= 2 && listen[0] == '[' && listen[n - 1] == ']') {
		listen++;
		n -= 2;
	}
	if (n >= hostlen)
		goto bad;
	if (n == 0)
		snprintf(host, hostlen, "127.0.0.1");
	else {
		memcpy(host, listen, n);
		host[n] = '\0';
	}
	*port = (uint16_t)p;
	return 0;
bad:
	snprintf(err, errlen, "metrics.listen: %s is not HOST:PORT", listen);
	return -EINVAL;
}

/* The address a socket is bound to, as "host:port" ("[v6]:port"). */
static void
httpd_sockname(evutil_socket_t fd, char *out, size_t len)
{
	struct sockaddr_storage	 ss;
	socklen_t		 sl = sizeof(ss);
	char			 a[INET6_ADDRSTRLEN];

	out[0] = '\0';
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
		return;
	if (ss.ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)&ss;

		inet_ntop(AF_INET, &sin->sin_addr, a, sizeof(a));
		snprintf(out, len, "%s:%u", a, (unsigned)ntohs(sin->sin_port));
	} else if (ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)&ss;

		inet_ntop(AF_INET6, &sin6->sin6_addr, a, sizeof(a));
		snprintf(out, len, "[%s]:%u", a, (unsigned)ntohs(sin6->sin6_port));
	}
}

/*
 * Starts serving on listen (metrics.listen, not ""): *out gets the server;
 * 0 or -errno with err filled (a name that does not resolve, an address
 * in use). httpd_free undoes it.
 */
int
httpd_new(struct server *s, const char *listen, struct httpd **out, char *err, size_t errlen)
{
	struct evhttp_bound_socket	*bound;
	struct httpd			*h;
	char				 host[64];
	uint16_t			 port;
	int				 rc;

	*out = NULL;
	if ((rc = httpd_parse(listen, host, sizeof(host), &port, err, errlen)) != 0)
		return rc;
	if ((h = calloc(1, sizeof(*h))) == NULL) {
		snprintf(err, errlen, "metrics.listen: out of memory");
		return -ENOMEM;
	}
	h->server = s;
	TAILQ_INIT(&h->conns);
	if ((h->http = evhttp_new(s->base)) == NULL ||
	    (h->sweep = evtimer_new(s->base, httpd_sweep_cb, h)) == NULL) {
		snprintf(err, errlen, "metrics.listen: out of memory");
		httpd_free(h);
		return -ENOMEM;
	}
	evhttp_set_max_headers_size(h->http, HTTPD_HEADERS_MAX);
	evhttp_set_max_body_size(h->http, HTTPD_BODY_MAX);
	evhttp_set_timeout(h->http, HTTPD_IDLE_S);
	/* Every method reaches httpd_request_cb, which answers 405: evhttp's own answer is 501. */
	evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
	    EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
	    EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	evhttp_set_bevcb(h->http, httpd_bev_cb, h);
	evhttp_set_gencb(h->http, httpd_request_cb, h);
	errno = 0;
	if ((bound = evhttp_bind_socket_with_handle(h->http, host, port)) == NULL) {
		rc = errno != 0 ? -errno : -EADDRNOTAVAIL;
		snprintf(err, errlen, "metrics.listen: cannot listen on %s: %s", listen,
		    strerror(-rc));
		httpd_free(h);
		return rc;
	}
	httpd_sockname(evhttp_bound_socket_get_fd(bound), h->address, sizeof(h->address));
	log_info("httpd", "serving /metrics, /health and /ready on http://%s", h->address);
	*out = h;
	return 0;
}

/*
 * reload.c's hook for "metrics.": metrics.listen changed. The new address
 * is bound before the old server closes, so a failure leaves the old one
 * serving (and the key is refused with err); where the two conflict (the
 * same port on another address of this host), the old one closes first
 * and is bound again when the new one cannot be.
 */
int
httpd_reload(struct server *s, const struct config *prev, char *err, size_t errlen)
{
	struct httpd	*h = NULL;
	char		 again[256];
	int		 rc;

	if (s->cfg->metrics_listen[0] != '\0' &&
	    (rc = httpd_new(s, s->cfg->metrics_listen, &h, err, errlen)) != 0) {
		if (rc != -EADDRINUSE || s->httpd == NULL)
			return rc;
		httpd_free(s->httpd);
		s->httpd = NULL;
		if ((rc = httpd_new(s, s->cfg->metrics_listen, &h, err, errlen)) != 0) {
			if (prev->metrics_listen[0] != '\0' && httpd_new(s, prev->metrics_listen,
			    &s->httpd, again, sizeof(again)) != 0)
				log_warn("httpd", "%s (bound again: %s)", again, prev->metrics_listen);
			return rc;
		}
	}
	httpd_free(s->httpd);
	s->httpd = h;
	if (h == NULL)
		log_info("httpd", "metrics.listen is off: /metrics no longer served");
	return 0;
}

const char *
httpd_address(const struct httpd *h)
{
	return h != NULL ? h->address : "";
}

/* Closes the port and every connection. Idempotent on NULL. */
void
httpd_free(struct httpd *h)
{
	struct httpd_conn	*hc;

	if (h == NULL)
		return;
	/* evhttp frees its connections (and their bufferevents, ours still referenced). */
	if (h->http != NULL)
		evhttp_free(h->http);
	while ((hc = TAILQ_FIRST(&h->conns)) != NULL) {
		TAILQ_REMOVE(&h->conns, hc, entry);
		bufferevent_decref(hc->bev);
		free(hc);
	}
	if (h->sweep != NULL)
		event_free(h->sweep);
	free(h);
}
