/*
 * Reloads: SIGHUP (systemd's ExecReload=) and the RELOAD request
 * (`l3kvctl reload`) re-read the config file the daemon was started
 * with and apply what can change while it runs.
 *
 * The file is loaded whole into a scratch config first, with the same
 * parser and checks as at start: a file that does not parse or holds a
 * bad value changes nothing, and the reason is logged (and answered).
 * Then config_reload() walks the key table: a changed key marked live
 * takes its new value in the running config, which the daemon reads
 * where it uses it (limits, deadlines, the lease TTL, the admit
 * timeout); any other changed key is refused by name and keeps its old
 * value. Where a live key needs more than its value stored (the log
 * level; the metrics listener; later the peer members) a hook
 * registered for its section does the work; a hook that fails puts its
 * keys back and they are reported refused with its reason.
 *
 * Everything runs on the loop, between two events: requests in flight
 * are not interrupted, and each one sees the old or the new value of a
 * key, never a mix. Around it systemd is told RELOADING=1 (with
 * MONOTONIC_USEC=, for Type=notify-reload) and READY=1 again.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon.h"

#define RELOAD_HOOKS_MAX	8

/* The hooks by section, set at start-up (reload_set_hook). */
static struct reload_hook {
	const char	*prefix;
	reload_hook_fn	*apply;
}			reload_hooks[RELOAD_HOOKS_MAX];
static unsigned		reload_nhooks;

/*
 * Registers fn for the live keys whose names start with prefix ("log.",
 * "metrics.", "peer."): after a reload stored their new values, fn runs
 * once if any of them changed, with the config as it was before; s->cfg
 * holds the new values. It returns 0, or -errno with err filled: its keys
 * then go back to their old values and are reported refused with err.
 * prefix is kept, not copied (a literal). Returns 0, or -ENOSPC when
 * RELOAD_HOOKS_MAX are registered. The same prefix again replaces its
 * function.
 */
int
reload_set_hook(const char *prefix, reload_hook_fn *fn)
{
	unsigned	i;

	for (i = 0; i < reload_nhooks; i++)
		if (strcmp(reload_hooks[i].prefix, prefix) == 0) {
			reload_hooks[i].apply = fn;
			return 0;
		}
	if (reload_nhooks == RELOAD_HOOKS_MAX)
		return -ENOSPC;
	reload_hooks[reload_nhooks].prefix = prefix;
	reload_hooks[reload_nhooks++].apply = fn;
	return 0;
}

/* log.level: the logger keeps its own copy. */
static int
reload_log_level(struct server *s, const struct config *prev, char *err, size_t errlen)
{
	(void)prev;
	(void)err;
	(void)errlen;
	log_set_level(s->cfg->log_level);
	return 0;
}

static int
reload_matches(const struct config_change *c, const char *prefix)
{
	return strncmp(c->key, prefix, strlen(prefix)) == 0;
}

/* Runs each hook whose keys changed; a failed one's keys go back and are refused. */
static void
reload_run_hooks(struct server *s, const struct config *prev, struct config_change *ch, size_t n)
{
	char		err[CONFIG_VALUE_MAX];
	unsigned	h;
	size_t		i;
	int		any, rc;

	for (h = 0; h < reload_nhooks; h++) {
		for (i = 0, any = 0; i < n && !any; i++)
			any = ch[i].applied && reload_matches(&ch[i], reload_hooks[h].prefix);
		if (!any)
			continue;
		err[0] = '\0';
		if ((rc = reload_hooks[h].apply(s, prev, err, sizeof(err))) == 0)
			continue;
		for (i = 0; i < n; i++) {
			if (!ch[i].applied || !reload_matches(&ch[i], reload_hooks[h].prefix))
				continue;
			config_key_restore(s->cfg, prev, ch[i].key);
			ch[i].applied = 0;
			snprintf(ch[i].reason, sizeof(ch[i].reason), "%s; keeping %s",
			    err[0] != '\0' ? err : strerror(-rc), ch[i].old);
		}
	}
}

/* The reply: the file, and each change applied or refused with its values as the file writes them. */
static json_t *
reload_json(const struct server *s, const struct config_change *ch, size_t n)
{
	json_t	*j, *applied, *refused, *e;
	size_t	 i;

	applied = json_array();
	refused = json_array();
	for (i = 0; i < n; i++) {
		if (ch[i].applied)
			e = json_pack("{s:s, s:s, s:s}", "key", ch[i].key, "old", ch[i].old,
			    "new", ch[i].new);
		else
			e = json_pack("{s:s, s:s, s:s, s:s}", "key", ch[i].key, "old", ch[i].old,
			    "new", ch[i].new, "reason", ch[i].reason);
		json_array_append_new(ch[i].applied ? applied : refused, e);
	}
	j = json_pack("{s:s, s:o, s:o}", "file", s->config_path, "applied", applied,
	    "refused", refused);
	return j;
}

/*
 * Re-reads the config file and applies what may change live; why says
 * who asked ("SIGHUP", "RELOAD from pid 42"). With out, *out gets the
 * JSON reply (a new reference). Returns 0, or -errno with err filled
 * (-EINVAL: the file is bad; -ENOENT: started without -f) and nothing
 * changed.
 */
int
reload_run(struct server *s, const char *why, json_t **out, char *err, size_t errlen)
{
	/* Two whole configs: kept off the stack; the loop thread alone reloads. */
	static struct config	 next, prev;
	struct config_change	*ch = NULL;
	size_t			 i, n, nch = config_nkeys(), nref = 0;
	int			 rc = 0, before, after;

	if (out != NULL)
		*out = NULL;
	notify_sendf("RELOADING=1\nMONOTONIC_USEC=%" PRIu64, notify_monotonic_usec());
	if (s->config_path == NULL) {
		snprintf(err, errlen, "started without -f: there is no config file to re-read");
		rc = -ENOENT;
		goto done;
	}
	log_info("reload", "%s: re-reading %s", why, s->config_path);
	if ((rc = config_load_file(&next, s->config_path, err, errlen)) != 0) {
		if (rc != -EINVAL && rc != -ENOMEM)
			rc = -EINVAL;	/* unreadable: as bad as a broken file, for the caller */
		goto done;
	}
	if ((ch = calloc(nch, sizeof(*ch))) == NULL) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto done;
	}
	prev = *s->cfg;
	before = log_get_level();
	n = config_reload(s->cfg, &next, ch, nch);
	reload_run_hooks(s, &prev, ch, n);
	/* A reload that lowers the level still logs what it did, at the level it found. */
	after = log_get_level();
	if (before > after)
		log_set_level(before);
	for (i = 0; i < n; i++) {
		if (ch[i].applied)
			log_info("reload", "%s: %s -> %s", ch[i].key, ch[i].old, ch[i].new);
		else {
			log_warn("reload", "%s: %s -> %s refused: %s", ch[i].key, ch[i].old,
			    ch[i].new, ch[i].reason);
			nref++;
		}
	}
	metrics.reloads++;
	metrics.reload_keys_applied += n - nref;
	metrics.reload_keys_refused += nref;
	log_info("reload", "%s: %zu changed, %zu applied, %zu refused", s->config_path, n,
	    n - nref, nref);
	log_set_level(after);
	if (out != NULL && (*out = reload_json(s, ch, n)) == NULL) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
	}
done:
	if (rc != 0 && rc != -ENOMEM)
		metrics.reloads_failed++;
	if (rc != 0)
		log_error("reload", "%s; nothing changed", err);
	free(ch);
	notify_send("READY=1");
	return rc;
}

static void
reload_signal_cb(evutil_socket_t sig, short ev, void *arg)
{
	struct server	*s = arg;
	char		 err[CONFIG_ERR_MAX];

	(void)sig;
	(void)ev;
	if (s->stopping)
		return;
	reload_run(s, "SIGHUP", NULL, err, sizeof(err));
}

/*
 * RELOAD: only root and the daemon's own user may make it re-read its
 * config (the access lists admit engines, which have no business with
 * it); the answer says what was applied and what refused, as JSON.
 */
void
reload_request(struct conn *c, struct proto_frame *f)
{
	json_t	*j;
	char	 why[64], err[CONFIG_ERR_MAX], *text;
	int	 rc;

	if (c->uid != 0 && c->uid != geteuid()) {
		log_warn("reload", "RELOAD from pid %d uid %u refused: only root and uid %u may",
		    (int)c->pid, (unsigned)c->uid, (unsigned)geteuid());
		conn_reply_error(c, &f->hdr, PROTO_S_DENIED, "RELOAD: uid %u may not reload the "
		    "daemon (root and uid %u may)", (unsigned)c->uid, (unsigned)geteuid());
		return;
	}
	if (c->server->stopping) {
		conn_reply_error(c, &f->hdr, PROTO_S_SHUTTING_DOWN, "daemon is shutting down");
		return;
	}
	snprintf(why, sizeof(why), "RELOAD from pid %d", (int)c->pid);
	if ((rc = reload_run(c->server, why, &j, err, sizeof(err))) != 0) {
		conn_reply_error(c, &f->hdr, rc == -ENOMEM ? PROTO_S_NO_MEMORY : rc == -ENOENT ?
		    PROTO_S_STATE : PROTO_S_INVALID, "%s", err);
		return;
	}
	text = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (text == NULL) {
		conn_reply_error(c, &f->hdr, PROTO_S_NO_MEMORY, "out of memory");
		return;
	}
	conn_reply(c, &f->hdr, PROTO_S_OK, text, (uint32_t)strlen(text));
	free(text);
}

/* SIGHUP, the log level's hook and the peer tier's; 0 or -ENOMEM with err filled. */
int
reload_init(struct server *s, char *err, size_t errlen)
{
	reload_set_hook("log.", reload_log_level);
	reload_set_hook("peer.", peer_reload);
	s->ev_sighup = evsignal_new(s->base, SIGHUP, reload_signal_cb, s);
	if (s->ev_sighup == NULL || event_add(s->ev_sighup, NULL) != 0) {
		snprintf(err, errlen, "cannot register SIGHUP");
		return -ENOMEM;
	}
	return 0;
}

void
reload_free(struct server *s)
{
	if (s->ev_sighup != NULL)
		event_free(s->ev_sighup);
	s->ev_sighup = NULL;
}
