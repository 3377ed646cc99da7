/*
 * Membership from etcd (the peer tier's optional source of the member
 * list), over etcd's v3 JSON gateway with libevent's evhttp: this daemon
 * holds a key PREFIX/ID under a lease, and watches the prefix. Keys and
 * values travel base64-encoded, as the gateway wants; a member's value is
 * {"id": ID, "addr": "host:port"}.
 *
 * One session, from etcd_session_start to its end:
 *   POST /v3/lease/grant (TTL)  ->  POST /v3/kv/put (our key, the lease)
 *   ->  POST /v3/kv/range (the prefix; its revision)  ->  the view, to fn
 *   ->  POST /v3/watch from revision + 1, a stream held open: each event
 *       batch updates the view and calls fn again;
 * and every TTL/3, POST /v3/lease/keepalive (one request, one answer).
 * Unary requests share one connection; the watch has its own, since its
 * response never ends.
 *
 * Anything that fails (a refused connection, an HTTP error, a lease that
 * expired, a watch that ended or was canceled, an answer we cannot parse)
 * ends the session: both connections are dropped and a new session starts
 * after a backoff (ETCD_BACKOFF_MIN_MS, doubling up to ETCD_BACKOFF_MAX_MS),
 * with a new lease, so a restarted etcd sees us again. Membership is
 * advisory: while there is no session the last view stands and fn is not
 * called; a new session calls fn with its fresh view.
 *
 * etcd is not trusted more than a peer: keys outside the prefix, ids that
 * do not fit or differ from their key, values that are not the JSON above
 * are skipped (and logged), never stored. Loop thread only. The
 * endpoint's host, when a name, resolves through the caller's evdns base
 * (the peer tier's), never blocking the loop; the lease's revoke at close
 * goes where the session's connection went (or to a numeric host).
 */
#include <sys/socket.h>

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "daemon.h"

#define ETCD_BACKOFF_MIN_MS	200
#define ETCD_BACKOFF_MAX_MS	5000
#define ETCD_REQ_TIMEOUT_S	5
#define ETCD_WATCH_TIMEOUT_S	86400
#define ETCD_MEMBERS_MAX	1024
#define ETCD_PREFIX_MAX		256
#define ETCD_BODY_MAX		(4U << 20)	/* a range answer or a watch message */
#define ETCD_REVOKE_MS		500	/* etcd_close's revoke, each of connect and answer */

enum etcd_state {
	ETCD_IDLE = 0,		/* waiting for the backoff timer */
	ETCD_GRANT,
	ETCD_PUT,
	ETCD_RANGE,
	ETCD_WATCHING,
};

struct etcd;

/*
 * A request in flight: which session sent it, on which connection. It is
 * freed by its callback, or, when its connection is freed first (evhttp
 * then drops it without a callback), by etcd_reap.
 */
struct etcd_req {
	TAILQ_ENTRY(etcd_req)	 entry;
	struct etcd		*e;
	struct evhttp_connection *conn;
	uint64_t		 session;
	void			(*done)(struct etcd *, json_t *);
};
TAILQ_HEAD(etcd_reqs, etcd_req);

struct etcd {
	struct event_base	*base;
	struct evdns_base	*dns;		/* the endpoint's name resolves through it */
	char			 host[128];
	unsigned		 port;
	char			 prefix[ETCD_PREFIX_MAX];	/* ends with '/' */
	struct peer_member	 self;
	unsigned		 ttl_s;
	etcd_view_fn		 fn;
	void			*arg;

	enum etcd_state		 state;
	uint64_t		 session;	/* a request whose session ended is ignored */
	struct evhttp_connection *conn;		/* unary requests */
	struct evhttp_connection *wconn;	/* the watch stream */
	struct evbuffer		*wbuf;		/* the watch stream's unparsed bytes */
	int64_t			 lease;
	int64_t			 revision;
	struct event		*retry;
	struct event		*keepalive;
	unsigned		 backoff_ms;

	struct peer_member	*view;		/* sorted by id */
	size_t			 nview;

	struct etcd_reqs	 reqs;
	/*
	 * Connections of ended sessions. A session may end inside one of its
	 * connection's callbacks, where evhttp must not see it freed: they are
	 * freed from a zero timer instead (etcd_reap).
	 */
	struct evhttp_connection *dead[8];
	size_t			 ndead;
	struct event		*reap;
};


static void	etcd_session_start(struct etcd *);

static const struct timeval etcd_now_tv = { 0, 0 };

static struct etcd_req *
etcd_req_new(struct etcd *e, struct evhttp_connection *conn,
    void (*done)(struct etcd *, json_t *))
{
	struct etcd_req	*r;

	if ((r = calloc(1, sizeof(*r))) == NULL)
		return NULL;
	r->e = e;
	r->conn = conn;
	r->session = e->session;
	r->done = done;
	TAILQ_INSERT_TAIL(&e->reqs, r, entry);
	return r;
}

static void
etcd_req_free(struct etcd_req *r)
{
	TAILQ_REMOVE(&r->e->reqs, r, entry);
	free(r);
}

/* Frees a connection outside its callbacks, and the requests it dropped. */
static void
etcd_conn_free(struct etcd *e, struct evhttp_connection *conn)
{
	struct etcd_req	*r, *next;

	evhttp_connection_free(conn);
	for (r = TAILQ_FIRST(&e->reqs); r != NULL; r = next) {
		next = TAILQ_NEXT(r, entry);
		if (r->conn == conn)
			etcd_req_free(r);
	}
}

static void
etcd_reap(struct etcd *e)
{
	while (e->ndead > 0)
		etcd_conn_free(e, e->dead[--e->ndead]);
}

static void
etcd_reap_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	etcd_reap(arg);
}

/* Retires a connection: freed on the next loop turn. */
static void
etcd_conn_retire(struct etcd *e, struct evhttp_connection *conn)
{
	if (conn == NULL)
		return;
	if (e->ndead == sizeof(e->dead) / sizeof(e->dead[0]))
		fatalx("etcd", "more retired connections than sessions can make");
	e->dead[e->ndead++] = conn;
	evtimer_add(e->reap, &etcd_now_tv);
}

/* Base64 (RFC 4648, padded), the gateway's encoding of bytes. */
static const char etcd_b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *
etcd_b64_encode(const void *src, size_t len)
{
	const uint8_t	*s = src;
	char		*out, *o;
	size_t		 i;
	uint32_t	 v;

	if ((out = malloc((len + 2) / 3 * 4 + 1)) == NULL)
		return NULL;
	for (i = 0, o = out; i + 2 < len; i += 3) {
		v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
		*o++ = etcd_b64[v >> 18];
		*o++ = etcd_b64[(v >> 12) & 63];
		*o++ = etcd_b64[(v >> 6) & 63];
		*o++ = etcd_b64[v & 63];
	}
	if (i < len) {
		v = (uint32_t)s[i] << 16 | (i + 1 < len ? (uint32_t)s[i + 1] << 8 : 0);
		*o++ = etcd_b64[v >> 18];
		*o++ = etcd_b64[(v >> 12) & 63];
		*o++ = i + 1 < len ? etcd_b64[(v >> 6) & 63] : '=';
		*o++ = '=';
	}
	*o = '\0';
	return out;
}

static int
etcd_b64_val(char c)
{
	const char	*p;

	if (c == '\0' || (p = strchr(etcd_b64, c)) == NULL)
		return -1;
	return (int)(p - etcd_b64);
}

/* Decodes into a new NUL-terminated buffer (*len without the NUL); NULL if not base64. */
static char *
etcd_b64_decode(const char *s, size_t *len)
{
	size_t		 n = strlen(s), i, o = 0;
	char		*out;
	int		 a, b, c, d;

	if (n % 4 != 0 || (out = malloc(n / 4 * 3 + 1)) == NULL)
		return NULL;
	for (i = 0; i < n; i += 4) {
		a = etcd_b64_val(s[i]);
		b = etcd_b64_val(s[i + 1]);
		c = s[i + 2] == '=' && i + 4 == n ? 0 : etcd_b64_val(s[i + 2]);
		d = s[i + 3] == '=' && i + 4 == n ? 0 : etcd_b64_val(s[i + 3]);
		if (a < 0 || b < 0 || c < 0 || d < 0 || (s[i + 2] == '=' && s[i + 3] != '=')) {
			free(out);
			return NULL;
		}
		out[o++] = (char)(a << 2 | b >> 4);
		if (s[i + 2] != '=')
			out[o++] = (char)((b & 15) << 4 | c >> 2);
		if (s[i + 3] != '=')
			out[o++] = (char)((c & 3) << 6 | d);
	}
	out[o] = '\0';
	*len = o;
	return out;
}

/* An int64 of the gateway's JSON: a string of digits (or a number). */
static int
etcd_json_int(const json_t *v, int64_t *out)
{
	const char	*s;
	char		*end;
	long long	 x;

	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return 0;
	}
	if ((s = json_string_value(v)) == NULL || *s == '\0')
		return -1;
	errno = 0;
	x = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = x;
	return 0;
}

/* Ends the session: drops both connections; a new one starts after the backoff. */
static void
etcd_session_fail(struct etcd *e, const char *why)
{
	struct timeval	tv;

	if (e->state != ETCD_IDLE)
		log_warn("etcd", "%s:%u: %s; keeping the last view (%zu members), retrying in %u ms",
		    e->host, e->port, why, e->nview, e->backoff_ms);
	e->state = ETCD_IDLE;
	e->session++;
	evtimer_del(e->keepalive);
	etcd_conn_retire(e, e->wconn);
	e->wconn = NULL;
	etcd_conn_retire(e, e->conn);
	e->conn = NULL;
	evbuffer_drain(e->wbuf, evbuffer_get_length(e->wbuf));
	tv.tv_sec = e->backoff_ms / 1000;
	tv.tv_usec = (e->backoff_ms % 1000) * 1000;
	evtimer_add(e->retry, &tv);
	e->backoff_ms = e->backoff_ms * 2 > ETCD_BACKOFF_MAX_MS ? ETCD_BACKOFF_MAX_MS :
	    e->backoff_ms * 2;
}

static void
etcd_req_cb(struct evhttp_request *req, void *arg)
{
	struct etcd_req		*r = arg;
	struct etcd		*e = r->e;
	struct evbuffer		*in;
	json_error_t		 jerr;
	json_t			*j = NULL;
	char			*body = NULL;
	size_t			 n;
	int			 code;
	void			(*done)(struct etcd *, json_t *);

	if (r->session != e->session) {
		etcd_req_free(r);
		return;
	}
	code = req != NULL ? evhttp_request_get_response_code(req) : 0;
	if (code == 200) {
		in = evhttp_request_get_input_buffer(req);
		n = evbuffer_get_length(in);
		if (n <= ETCD_BODY_MAX && (body = malloc(n + 1)) != NULL) {
			evbuffer_remove(in, body, n);
			body[n] = '\0';
			j = json_loadb(body, n, JSON_DISABLE_EOF_CHECK, &jerr);
		}
	}
	if (j == NULL || !json_is_object(j) || json_object_get(j, "error") != NULL) {
		char	why[160];

		if (code == 0)
			snprintf(why, sizeof(why), "no answer (connection refused or timed out)");
		else
			snprintf(why, sizeof(why), "HTTP %d%s%.80s", code, body != NULL ? ": " : "",
			    body != NULL ? body : "");
		json_decref(j);
		free(body);
		etcd_req_free(r);
		etcd_session_fail(e, why);
		return;
	}
	free(body);
	done = r->done;
	etcd_req_free(r);
	done(e, j);
	json_decref(j);
}

/* A request with our headers and body (text), on conn; its callback gets r. */
static struct evhttp_request *
etcd_req_make(struct etcd *e, struct etcd_req *r, const char *text,
    void (*cb)(struct evhttp_request *, void *))
{
	struct evhttp_request	*req;

	if ((req = evhttp_request_new(cb, r)) == NULL)
		return NULL;
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host", e->host);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
	evbuffer_add(evhttp_request_get_output_buffer(req), text, strlen(text));
	return req;
}

/* POSTs the JSON body (stolen) to path on the unary connection; done() gets the answer. */
static int
etcd_post(struct etcd *e, const char *path, json_t *body, void (*done)(struct etcd *, json_t *))
{
	struct evhttp_request	*req;
	struct etcd_req		*r;
	char			*text;

	text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (text == NULL)
		return -ENOMEM;
	if (e->conn == NULL) {
		e->conn = evhttp_connection_base_new(e->base, e->dns, e->host, (uint16_t)e->port);
		if (e->conn == NULL) {
			free(text);
			return -ENOMEM;
		}
		evhttp_connection_set_timeout(e->conn, ETCD_REQ_TIMEOUT_S);
		evhttp_connection_set_retries(e->conn, 0);
	}
	if ((r = etcd_req_new(e, e->conn, done)) == NULL ||
	    (req = etcd_req_make(e, r, text, etcd_req_cb)) == NULL) {
		if (r != NULL)
			etcd_req_free(r);
		free(text);
		return -ENOMEM;
	}
	free(text);
	/* On failure evhttp has freed req and will not call back. */
	if (evhttp_make_request(e->conn, req, EVHTTP_REQ_POST, path) != 0) {
		etcd_req_free(r);
		return -EIO;
	}
	return 0;
}

static int
etcd_member_cmp(const void *a, const void *b)
{
	return strcmp(((const struct peer_member *)a)->id, ((const struct peer_member *)b)->id);
}

/*
 * The member of one key/value pair (both base64), or -EINVAL with why:
 * the key must be PREFIX + ID, the value {"id": ID, "addr": ADDR} with
 * both fitting struct peer_member. *id gets the id (from the key) even
 * when the value is bad, for deletes.
 */
static int
etcd_member_parse(const struct etcd *e, const char *k64, const char *v64, struct peer_member *m,
    const char **why)
{
	json_error_t	 jerr;
	json_t		*j = NULL, *jid, *jaddr;
	char		*key, *val = NULL;
	size_t		 klen, vlen, plen = strlen(e->prefix), i;
	int		 rc = -EINVAL;

	memset(m, 0, sizeof(*m));
	*why = "key is not base64";
	if ((key = etcd_b64_decode(k64, &klen)) == NULL)
		return -EINVAL;
	*why = "key outside the prefix, or an id that does not fit";
	if (klen <= plen || klen - plen >= PEER_ID_LEN || memcmp(key, e->prefix, plen) != 0 ||
	    strlen(key) != klen)
		goto out;
	for (i = plen; i < klen; i++)
		if (key[i] <= ' ' || key[i] > '~' || key[i] == '/')
			goto out;
	memcpy(m->id, key + plen, klen - plen);
	if (v64 == NULL) {
		rc = 0;		/* a delete: the id is all there is */
		goto out;
	}
	*why = "value is not base64 JSON {\"id\", \"addr\"}";
	if ((val = etcd_b64_decode(v64, &vlen)) == NULL ||
	    (j = json_loadb(val, vlen, JSON_REJECT_DUPLICATES, &jerr)) == NULL ||
	    !json_is_object(j) || !json_is_string(jid = json_object_get(j, "id")) ||
	    !json_is_string(jaddr = json_object_get(j, "addr")))
		goto out;
	*why = "value's id differs from its key, or its addr does not fit";
	if (strcmp(json_string_value(jid), m->id) != 0 ||
	    json_string_length(jaddr) == 0 || json_string_length(jaddr) >= PEER_ADDR_LEN ||
	    strlen(json_string_value(jaddr)) != json_string_length(jaddr))
		goto out;
	memcpy(m->addr, json_string_value(jaddr), json_string_length(jaddr));
	rc = 0;
out:
	json_decref(j);
	free(key);
	free(val);
	return rc;
}

static struct peer_member *
etcd_view_find(struct etcd *e, const char *id)
{
	struct peer_member	key;

	if (e->nview == 0)
		return NULL;
	memset(&key, 0, sizeof(key));
	snprintf(key.id, sizeof(key.id), "%s", id);
	return bsearch(&key, e->view, e->nview, sizeof(*e->view), etcd_member_cmp);
}

/* Inserts or replaces m; 0, or -ENOSPC past ETCD_MEMBERS_MAX. */
static int
etcd_view_put(struct etcd *e, const struct peer_member *m)
{
	struct peer_member	*p;

	if ((p = etcd_view_find(e, m->id)) != NULL) {
		*p = *m;
		return 0;
	}
	if (e->nview == ETCD_MEMBERS_MAX)
		return -ENOSPC;
	p = reallocarray(e->view, e->nview + 1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	e->view = p;
	e->view[e->nview++] = *m;
	qsort(e->view, e->nview, sizeof(*e->view), etcd_member_cmp);
	return 0;
}

static void
etcd_view_del(struct etcd *e, const char *id)
{
	struct peer_member	*p;

	if ((p = etcd_view_find(e, id)) == NULL)
		return;
	memmove(p, p + 1, (size_t)(e->view + e->nview - (p + 1)) * sizeof(*p));
	e->nview--;
}

/* Applies one kv (PUT, v64 may not be NULL) or a DELETE (v64 NULL); 1 if the view changed. */
static int
etcd_apply(struct etcd *e, const json_t *kv, int del)
{
	struct peer_member	 m;
	const char		*k64, *v64, *why;

	k64 = json_string_value(json_object_get(kv, "key"));
	v64 = del ? NULL : json_string_value(json_object_get(kv, "value"));
	if (k64 == NULL || (!del && v64 == NULL)) {
		log_warn("etcd", "an entry without key or value under %s: skipped", e->prefix);
		return 0;
	}
	if (etcd_member_parse(e, k64, v64, &m, &why) != 0) {
		log_warn("etcd", "an entry under %s: %s: skipped", e->prefix, why);
		/* A bad new value for a known id: that member is no longer what etcd says. */
		if (!del && m.id[0] != '\0' && etcd_view_find(e, m.id) != NULL) {
			etcd_view_del(e, m.id);
			return 1;
		}
		return 0;
	}
	if (del) {
		if (etcd_view_find(e, m.id) == NULL)
			return 0;
		etcd_view_del(e, m.id);
		return 1;
	}
	if (etcd_view_put(e, &m) != 0) {
		log_warn("etcd", "more than %d members under %s: %s skipped", ETCD_MEMBERS_MAX,
		    e->prefix, m.id);
		return 0;
	}
	return 1;
}

/* One message of the watch stream. 0, or -1: the session must end. */
static int
etcd_watch_msg(struct etcd *e, json_t *j)
{
	json_t		*res, *evs, *ev, *kv;
	const char	*type;
	size_t		 i;
	int		 changed = 0;

	if ((res = json_object_get(j, "result")) == NULL || !json_is_object(res))
		return -1;
	if (json_is_true(json_object_get(res, "canceled")) ||
	    json_object_get(res, "compact_revision") != NULL)
		return -1;
	evs = json_object_get(res, "events");
	json_array_foreach(evs, i, ev) {
		type = json_string_value(json_object_get(ev, "type"));
		kv = json_object_get(ev, "kv");
		if (!json_is_object(kv))
			continue;
		changed |= etcd_apply(e, kv, type != NULL && strcmp(type, "DELETE") == 0);
	}
	if (changed)
		e->fn(e->arg, e->view, e->nview);
	return 0;
}

static void
etcd_watch_chunk_cb(struct evhttp_request *req, void *arg)
{
	struct etcd_req		*r = arg;
	struct etcd		*e = r->e;
	struct evbuffer		*in = evhttp_request_get_input_buffer(req);
	struct evbuffer_ptr	 nl;
	json_error_t		 jerr;
	json_t			*j;
	size_t			 n;
	char			*line;

	if (r->session != e->session) {
		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	evbuffer_add_buffer(e->wbuf, in);
	/* The gateway writes one JSON message per line. */
	for (;;) {
		nl = evbuffer_search(e->wbuf, "\n", 1, NULL);
		if (nl.pos < 0) {
			if (evbuffer_get_length(e->wbuf) > ETCD_BODY_MAX)
				etcd_session_fail(e, "a watch message too large");
			return;
		}
		n = (size_t)nl.pos;
		line = (char *)evbuffer_pullup(e->wbuf, (ssize_t)n + 1);
		j = n > 0 ? json_loadb(line, n, 0, &jerr) : NULL;
		evbuffer_drain(e->wbuf, n + 1);
		if (n == 0)
			continue;
		if (j == NULL || !json_is_object(j) || etcd_watch_msg(e, j) != 0) {
			json_decref(j);
			etcd_session_fail(e, "the watch failed, was canceled or sent garbage");
			return;
		}
		json_decref(j);
		if (r->session != e->session)
			return;
	}
}

static void
etcd_watch_end_cb(struct evhttp_request *req, void *arg)
{
	struct etcd_req	*r = arg;
	struct etcd	*e = r->e;
	uint64_t	 s = r->session;

	(void)req;
	etcd_req_free(r);
	if (s == e->session)
		etcd_session_fail(e, "the watch stream ended");
}

static void
etcd_watch_start(struct etcd *e)
{
	struct evhttp_request	*req;
	struct etcd_req		*r;
	json_t			*cr;
	char			*k, *end, *text = NULL, endkey[ETCD_PREFIX_MAX];
	size_t			 plen = strlen(e->prefix);

	memcpy(endkey, e->prefix, plen);
	endkey[plen - 1]++;		/* '/' + 1: the range end of the prefix */
	k = etcd_b64_encode(e->prefix, plen);
	end = etcd_b64_encode(endkey, plen);
	cr = json_pack("{s:{s:s?, s:s?, s:I}}", "create_request", "key", k, "range_end", end,
	    "start_revision", (json_int_t)(e->revision + 1));
	free(k);
	free(end);
	if (cr == NULL || (text = json_dumps(cr, JSON_COMPACT)) == NULL) {
		json_decref(cr);
		etcd_session_fail(e, "out of memory");
		return;
	}
	json_decref(cr);
	e->wconn = evhttp_connection_base_new(e->base, e->dns, e->host, (uint16_t)e->port);
	if (e->wconn == NULL || (r = etcd_req_new(e, e->wconn, NULL)) == NULL) {
		free(text);
		etcd_session_fail(e, "out of memory");
		return;
	}
	if ((req = etcd_req_make(e, r, text, etcd_watch_end_cb)) == NULL) {
		etcd_req_free(r);
		free(text);
		etcd_session_fail(e, "out of memory");
		return;
	}
	free(text);
	/*
	 * The stream is quiet while nothing changes, and evhttp's default read
	 * timeout (50 s) would end it every minute: a day instead. A dead etcd
	 * is noticed by the keepalives, which end the session, watch included.
	 */
	evhttp_connection_set_timeout(e->wconn, ETCD_WATCH_TIMEOUT_S);
	evhttp_connection_set_retries(e->wconn, 0);
	evhttp_request_set_chunked_cb(req, etcd_watch_chunk_cb);
	if (evhttp_make_request(e->wconn, req, EVHTTP_REQ_POST, "/v3/watch") != 0) {
		etcd_req_free(r);
		etcd_session_fail(e, "cannot start the watch");
		return;
	}
	e->state = ETCD_WATCHING;
}

static void
etcd_range_done(struct etcd *e, json_t *j)
{
	json_t		*kvs, *kv;
	size_t		 i;

	if (etcd_json_int(json_object_get(json_object_get(j, "header"), "revision"),
	    &e->revision) != 0) {
		etcd_session_fail(e, "a range answer without a revision");
		return;
	}
	free(e->view);
	e->view = NULL;
	e->nview = 0;
	kvs = json_object_get(j, "kvs");
	json_array_foreach(kvs, i, kv) {
		etcd_apply(e, kv, 0);
	}
	e->backoff_ms = ETCD_BACKOFF_MIN_MS;
	log_info("etcd", "%s:%u: registered %s under %s, %zu members", e->host, e->port, e->self.id,
	    e->prefix, e->nview);
	e->fn(e->arg, e->view, e->nview);
	etcd_watch_start(e);
}

static void
etcd_range(struct etcd *e)
{
	char	*k, *end, endkey[ETCD_PREFIX_MAX];
	size_t	 plen = strlen(e->prefix);
	json_t	*body;

	memcpy(endkey, e->prefix, plen);
	endkey[plen - 1]++;
	k = etcd_b64_encode(e->prefix, plen);
	end = etcd_b64_encode(endkey, plen);
	body = k != NULL && end != NULL ? json_pack("{s:s, s:s}", "key", k, "range_end", end) : NULL;
	free(k);
	free(end);
	e->state = ETCD_RANGE;
	if (body == NULL || etcd_post(e, "/v3/kv/range", body, etcd_range_done) != 0)
		etcd_session_fail(e, "out of memory");
}

static void
etcd_put_done(struct etcd *e, json_t *j)
{
	(void)j;
	etcd_range(e);
}

static void
etcd_keepalive_done(struct etcd *e, json_t *j)
{
	struct timeval	 tv;
	int64_t		 ttl = 0;
	unsigned	 ms = e->ttl_s * 1000 / 3;

	if (etcd_json_int(json_object_get(json_object_get(j, "result"), "TTL"), &ttl) != 0 ||
	    ttl <= 0) {
		etcd_session_fail(e, "our lease expired");
		return;
	}
	tv.tv_sec = ms / 1000;
	tv.tv_usec = (ms % 1000) * 1000;
	evtimer_add(e->keepalive, &tv);
}

static void
etcd_keepalive_cb(evutil_socket_t fd, short ev, void *arg)
{
	struct etcd	*e = arg;

	(void)fd;
	(void)ev;
	if (etcd_post(e, "/v3/lease/keepalive", json_pack("{s:I}", "ID", (json_int_t)e->lease),
	    etcd_keepalive_done) != 0)
		etcd_session_fail(e, "cannot send a keepalive");
}

static void
etcd_grant_done(struct etcd *e, json_t *j)
{
	struct timeval	 tv;
	json_t		*body, *val;
	char		*key, *k64 = NULL, *v64 = NULL, *vtext = NULL;
	unsigned	 ms = e->ttl_s * 1000 / 3;
	size_t		 plen = strlen(e->prefix), ilen = strlen(e->self.id);

	if (etcd_json_int(json_object_get(j, "ID"), &e->lease) != 0) {
		etcd_session_fail(e, "a lease grant without an ID");
		return;
	}
	if ((key = malloc(plen + ilen + 1)) != NULL) {
		memcpy(key, e->prefix, plen);
		memcpy(key + plen, e->self.id, ilen + 1);
		k64 = etcd_b64_encode(key, plen + ilen);
		free(key);
	}
	val = json_pack("{s:s, s:s}", "id", e->self.id, "addr", e->self.addr);
	if (val != NULL && (vtext = json_dumps(val, JSON_COMPACT)) != NULL)
		v64 = etcd_b64_encode(vtext, strlen(vtext));
	json_decref(val);
	free(vtext);
	body = k64 != NULL && v64 != NULL ? json_pack("{s:s, s:s, s:I}", "key", k64, "value", v64,
	    "lease", (json_int_t)e->lease) : NULL;
	free(k64);
	free(v64);
	e->state = ETCD_PUT;
	if (body == NULL || etcd_post(e, "/v3/kv/put", body, etcd_put_done) != 0) {
		etcd_session_fail(e, "out of memory");
		return;
	}
	tv.tv_sec = ms / 1000;
	tv.tv_usec = (ms % 1000) * 1000;
	evtimer_add(e->keepalive, &tv);
}

static void
etcd_session_start(struct etcd *e)
{
	e->state = ETCD_GRANT;
	if (etcd_post(e, "/v3/lease/grant", json_pack("{s:I}", "TTL", (json_int_t)e->ttl_s),
	    etcd_grant_done) != 0)
		etcd_session_fail(e, "cannot send a lease grant");
}

static void
etcd_retry_cb(evutil_socket_t fd, short ev, void *arg)
{
	(void)fd;
	(void)ev;
	etcd_session_start(arg);
}

/*
 * Registers self under prefix at the etcd gateway endpoint
 * ("http://host:port") with a lease of ttl_s seconds, and calls fn with
 * each new view of the members under prefix (self included), on the loop.
 * The first session starts at once; failures retry with backoff. The
 * caller owns *ep (etcd_close). 0 or -errno with err filled.
 */
int
etcd_open(struct event_base *base, struct evdns_base *dns, const char *endpoint, const char *prefix,
    const struct peer_member *self, unsigned ttl_s, etcd_view_fn fn, void *arg,
    struct etcd **ep, char *err, size_t errlen)
{
	struct etcd	*e;
	const char	*h, *colon;
	char		*end;
	unsigned long	 port;
	size_t		 plen;

	*ep = NULL;
	if (strncmp(endpoint, "http://", 7) != 0) {
		snprintf(err, errlen, "etcd endpoint %s: not http://host:port", endpoint);
		return -EINVAL;
	}
	h = endpoint + 7;
	if ((colon = strrchr(h, ':')) == NULL || colon == h || (size_t)(colon - h) >= 128) {
		snprintf(err, errlen, "etcd endpoint %s: not http://host:port", endpoint);
		return -EINVAL;
	}
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno != 0 || port == 0 || port > 65535 || (*end != '\0' && strcmp(end, "/") != 0)) {
		snprintf(err, errlen, "etcd endpoint %s: bad port", endpoint);
		return -EINVAL;
	}
	plen = strlen(prefix);
	if (plen == 0 || plen + 2 > ETCD_PREFIX_MAX || prefix[0] != '/') {
		snprintf(err, errlen, "etcd prefix %s: must start with / and be under %d bytes", prefix,
		    ETCD_PREFIX_MAX - 1);
		return -EINVAL;
	}
	if (self->id[0] == '\0' || strchr(self->id, '/') != NULL ||
	    strnlen(self->id, PEER_ID_LEN) == PEER_ID_LEN ||
	    strnlen(self->addr, PEER_ADDR_LEN) == PEER_ADDR_LEN) {
		snprintf(err, errlen, "etcd: this member's id or addr is empty, too long or has a /");
		return -EINVAL;
	}
	if (ttl_s < 2 || ttl_s > 3600) {
		snprintf(err, errlen, "etcd lease ttl %u s is out of range [2, 3600]", ttl_s);
		return -EINVAL;
	}
	if ((e = calloc(1, sizeof(*e))) == NULL) {
		snprintf(err, errlen, "etcd: out of memory");
		return -ENOMEM;
	}
	e->base = base;
	e->dns = dns;
	memcpy(e->host, h, (size_t)(colon - h));
	e->port = (unsigned)port;
	memcpy(e->prefix, prefix, plen + 1);
	if (e->prefix[plen - 1] != '/')
		e->prefix[plen] = '/';
	e->self = *self;
	e->ttl_s = ttl_s;
	e->fn = fn;
	e->arg = arg;
	e->backoff_ms = ETCD_BACKOFF_MIN_MS;
	TAILQ_INIT(&e->reqs);
	e->reap = evtimer_new(base, etcd_reap_cb, e);
	e->retry = evtimer_new(base, etcd_retry_cb, e);
	e->keepalive = evtimer_new(base, etcd_keepalive_cb, e);
	e->wbuf = evbuffer_new();
	if (e->reap == NULL || e->retry == NULL || e->keepalive == NULL || e->wbuf == NULL) {
		snprintf(err, errlen, "etcd: out of memory");
		etcd_close(e);
		return -ENOMEM;
	}
	etcd_session_start(e);
	*ep = e;
	return 0;
}

/*
 * Revokes the lease, so that our key goes now rather than at its TTL: one
 * blocking POST on a socket of its own, bounded by ETCD_REVOKE_MS (close
 * runs at shutdown, where waiting on the loop is no longer possible).
 */
static void
etcd_revoke(struct etcd *e)
{
	struct addrinfo		 hints, *ai = NULL;
	struct pollfd		 pfd;
	char			 port[8], body[64], req[512], ans[64];
	const struct sockaddr	*sa;
	socklen_t		 salen;
	int			 fd = -1, n, len, soerr = 0;
	socklen_t		 sl = sizeof(soerr);

	/* Where the session's connection went, else a numeric host: no name lookup here. */
	if (e->conn != NULL && (sa = evhttp_connection_get_addr(e->conn)) != NULL) {
		salen = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
		    sizeof(struct sockaddr_in);
	} else {
		snprintf(port, sizeof(port), "%u", e->port);
		memset(&hints, 0, sizeof(hints));
		hints.ai_socktype = SOCK_STREAM;
		hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;
		if (getaddrinfo(e->host, port, &hints, &ai) != 0)
			return;
		sa = ai->ai_addr;
		salen = ai->ai_addrlen;
	}
	if ((fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
		goto out;
	if (connect(fd, sa, salen) != 0 && errno != EINPROGRESS)
		goto out;
	pfd.fd = fd;
	pfd.events = POLLOUT;
	if (poll(&pfd, 1, ETCD_REVOKE_MS) != 1 ||
	    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0)
		goto out;
	len = snprintf(body, sizeof(body), "{\"ID\":%lld}", (long long)e->lease);
	n = snprintf(req, sizeof(req),
	    "POST /v3/lease/revoke HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
	    "Content-Length: %d\r\nConnection: close\r\n\r\n%s", e->host, len, body);
	if (n <= 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n)
		goto out;
	pfd.events = POLLIN;
	if (poll(&pfd, 1, ETCD_REVOKE_MS) == 1 && read(fd, ans, sizeof(ans)) > 0)
		log_debug("etcd", "lease %lld revoked", (long long)e->lease);
out:
	if (fd >= 0)
		close(fd);
	if (ai != NULL)
		freeaddrinfo(ai);
}

/* Revokes the lease when a session holds one, and frees everything. Idempotent on NULL. */
void
etcd_close(struct etcd *e)
{
	if (e == NULL)
		return;
	if (e->state == ETCD_PUT || e->state == ETCD_RANGE || e->state == ETCD_WATCHING)
		etcd_revoke(e);
	e->session++;
	if (e->wconn != NULL)
		etcd_conn_free(e, e->wconn);
	if (e->conn != NULL)
		etcd_conn_free(e, e->conn);
	etcd_reap(e);
	while (!TAILQ_EMPTY(&e->reqs))
		etcd_req_free(TAILQ_FIRST(&e->reqs));
	if (e->reap != NULL)
		event_free(e->reap);
	if (e->retry != NULL)
		event_free(e->retry);
	if (e->keepalive != NULL)
		event_free(e->keepalive);
	if (e->wbuf != NULL)
		evbuffer_free(e->wbuf);
	free(e->view);
	free(e);
}
