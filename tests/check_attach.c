/*
 * Integration tests through libl3kv against a real l3kvd: ATTACH and
 * DETACH with memfd regions, the namespace fingerprint, groups, the DCP
 * guard (refused with nothing changed), bad registrations, engines that
 * vanish, and 200 concurrent clients.
 */
#include <sys/mman.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l3kv.h"
#include "proto.h"
#include "tests.h"

#define PAGES		16
#define LAYERS		4
#define PAGE_TOKENS	8
#define TOKEN_BYTES	64
#define SLOTS		4
#define SLOT_BYTES	4096

/* Each engine rank (struct test_rank): an MLA page_first KV memfd, then a slot region. */
static const struct test_rank_kv	kv = { "test-model", "latent:576:fp8_e4m3", L3KV_ATTN_MLA,
    PAGES, PAGE_TOKENS, LAYERS, TOKEN_BYTES };

/* The text of a host region refused next to GPU memory. */
#define MIXED	"host (memfd) memory cannot be mixed with GPU memory or CUDA events"

static int
memfd(size_t size, unsigned flags)
{
	int	fd = memfd_create("l3kv-test", MFD_CLOEXEC | flags);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	return fd;
}

/*
 * Rank `rank` of a group of `size` ranks that are all TP 1 (they differ
 * in group_rank alone), namespace seed 7; state slots 0 and 2 are live.
 */
static void
engine_init(struct test_rank *e, const char *group, unsigned size, unsigned rank)
{
	test_rank_init(e, &kv, group, size, rank);
	test_rank_add_state(e, SLOTS, SLOT_BYTES, "conv:4096");
	e->live[1] = 2;
	e->args.nlive = 2;
	e->args.layout.tp_size = 1;
	e->args.tp_rank = 0;
	e->args.layout.seed = 7;
}

static struct l3kv *
client(void)
{
	struct l3kv	*k = NULL;

	ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &k), 0);
	return k;
}

static json_int_t
stat_int(json_t *j, const char *section, const char *key)
{
	json_t	*v = json_object_get(json_object_get(j, section), key);

	ck_assert_msg(json_is_integer(v), "stats %s.%s missing", section, key);
	return json_integer_value(v);
}

/* What an ATTACH may change: namespaces, groups, sessions, mapped memory. */
static char *
state_of_daemon(void)
{
	json_t	*j = test_td_stats(), *keep;
	char	*out;

	keep = json_pack("{s:O, s:O, s:O, s:I}", "namespaces", json_object_get(j, "namespaces"),
	    "groups", json_object_get(j, "groups"), "memory", json_object_get(j, "memory"),
	    "sessions", stat_int(j, "attach", "sessions"));
	out = json_dumps(keep, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(keep);
	json_decref(j);
	return out;
}

/* The daemon is still as state_of_daemon() said it was (before, which is freed). */
static void
assert_state_is(char *before)
{
	char	*after = state_of_daemon();

	ck_assert_str_eq(before, after);
	free(before);
	free(after);
}

/* STATS with the test's one session attached (n = 1) or none (n = 0). */
static void
assert_sessions(int n)
{
	json_t	*j = test_td_stats();

	ck_assert_int_eq(stat_int(j, "attach", "sessions"), n);
	ck_assert_int_eq(stat_int(j, "memory", "regions_mapped"), 2 * n);
	ck_assert_int_eq(stat_int(j, "memory", "region_bytes_mapped") > 0, n > 0);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "namespaces")), n);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "groups")), n);
	json_decref(j);
}

/* ATTACH of e on k is refused with status (and its errno), with want (unless NULL) in its text. */
static void
assert_refused(struct l3kv *k, const struct test_rank *e, unsigned status, const char *want)
{
	ck_assert_int_eq(l3kv_attach(k, &e->args, NULL), proto_status_errno(status));
	ck_assert_msg(l3kv_last_status(k) == (int)status, "status %s, want %s",
	    proto_status_name((unsigned)l3kv_last_status(k)), proto_status_name(status));
	if (want != NULL)
		ck_assert_msg(strstr(l3kv_last_error(k), want) != NULL, "no \"%s\" in \"%s\"", want,
		    l3kv_last_error(k));
}

START_TEST(test_attach_and_detach_map_and_unmap_memory)
{
	struct l3kv_attach_info	 info;
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			 want[64];

	engine_init(&e, "g-attach", 1, 0);
	ck_assert_int_eq(l3kv_attach(k, &e.args, &info), 0);
	ck_assert_uint_gt(info.session, 0);
	ck_assert_uint_eq(info.group_members, 1);
	ck_assert_uint_eq(info.lease_ttl_ms, 30000);
	snprintf(want, sizeof(want), "decode/test-model-%02x%02x", info.fingerprint[0],
	    info.fingerprint[1]);
	ck_assert_msg(strncmp(info.ns, want, strlen(want)) == 0, "ns %s", info.ns);
	ck_assert_uint_eq(strlen(info.ns), strlen("decode/test-model-") + 32);
	assert_sessions(1);
	ck_assert_int_eq(l3kv_detach(k), 0);
	assert_sessions(0);

	/* Detach twice: a state error, and the connection still works. */
	ck_assert_int_lt(l3kv_detach(k), 0);
	ck_assert_int_eq(l3kv_last_status(k), PROTO_S_STATE);
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	assert_refused(k, &e, PROTO_S_STATE, NULL);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_dcp_guard_refuses_best_effort_with_nothing_changed)
{
	struct test_rank	 e;
	struct l3kv		*k = client(), *other = client();
	char			*before;

	engine_init(&e, "g-other", 1, 0);
	ck_assert_int_eq(l3kv_attach(other, &e.args, NULL), 0);
	test_rank_fini(&e);

	engine_init(&e, "g-dcp", 2, 0);
	e.args.layout.dcp_size = 2;
	e.args.prefetch = L3KV_PREFETCH_BEST_EFFORT;
	before = state_of_daemon();
	assert_refused(k, &e, PROTO_S_GUARD, "wait_complete");
	assert_state_is(before);
	ck_assert_int_eq(test_td_stat("attach", "guards_refused"), 1);

	/* The same rank with wait_complete is accepted: the refusal left nothing behind. */
	e.args.prefetch = L3KV_PREFETCH_WAIT_COMPLETE;
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	l3kv_close(other);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_dcp_guard_refuses_offload_and_non_mla)
{
	struct test_rank	 e;
	struct l3kv		*k = client();

	engine_init(&e, "g-dcp", 2, 1);
	e.args.layout.dcp_size = 2;
	e.args.layout.dcp_rank = 1;
	e.args.write = L3KV_WRITE_OFFLOAD;
	assert_refused(k, &e, PROTO_S_GUARD, "offload");
	e.args.write = L3KV_WRITE_THROUGH;
	e.args.layout.attention = L3KV_ATTN_MHA;
	assert_refused(k, &e, PROTO_S_GUARD, "MLA");
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

static void
fingerprint_of(const struct test_rank *e, uint8_t out[16])
{
	struct l3kv_attach_info	 info;
	struct l3kv		*k = client();

	ck_assert_int_eq(l3kv_attach(k, &e->args, &info), 0);
	memcpy(out, info.fingerprint, 16);
	l3kv_close(k);
}

START_TEST(test_fingerprint_is_stable_and_changes_with_the_layout)
{
	struct test_rank	e;
	uint8_t			a[16], b[16], c[16];

	engine_init(&e, "g-fp", 1, 0);
	fingerprint_of(&e, a);
	usleep(50000);	/* the first session's close reaches the daemon */
	fingerprint_of(&e, b);
	ck_assert_mem_eq(a, b, 16);
	usleep(50000);
	e.args.layout.kv_dtype = "fp8_e5m2";
	fingerprint_of(&e, c);
	ck_assert(memcmp(a, c, 16) != 0);
	usleep(50000);
	e.args.layout.kv_dtype = "fp8_e4m3";
	e.args.layout.hash_scheme = "xxh64";
	e.args.layout.hash_len = 8;
	fingerprint_of(&e, c);
	ck_assert(memcmp(a, c, 16) != 0);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_group_ranks_must_agree)
{
	struct l3kv_attach_info	 info;
	struct test_rank	 e0, e1;
	struct l3kv		*k0 = client(), *k1 = client(), *k2 = client();

	engine_init(&e0, "g-pair", 2, 0);
	engine_init(&e1, "g-pair", 2, 1);
	ck_assert_int_eq(l3kv_attach(k0, &e0.args, &info), 0);
	ck_assert_uint_eq(info.group_members, 1);
	/* The same rank twice. */
	assert_refused(k1, &e0, PROTO_S_GROUP_MISMATCH, NULL);
	/* Another size. */
	e1.args.group_size = 3;
	assert_refused(k1, &e1, PROTO_S_GROUP_MISMATCH, NULL);
	/* Another policy. */
	e1.args.group_size = 2;
	e1.args.write = L3KV_WRITE_BACK;
	assert_refused(k1, &e1, PROTO_S_GROUP_MISMATCH, NULL);
	e1.args.write = L3KV_WRITE_THROUGH;
	ck_assert_int_eq(l3kv_attach(k1, &e1.args, &info), 0);
	ck_assert_uint_eq(info.group_members, 2);
	/* A rank that leaves frees its place. */
	l3kv_close(k0);
	usleep(100000);
	ck_assert_int_eq(l3kv_attach(k2, &e0.args, &info), 0);
	ck_assert_uint_eq(info.group_members, 2);
	l3kv_close(k1);
	l3kv_close(k2);
	test_rank_fini(&e0);
	test_rank_fini(&e1);
}
END_TEST

START_TEST(test_bad_registrations_are_refused_with_nothing_mapped)
{
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			*before, path[64];
	int			 plain, ro;

	engine_init(&e, "g-bad", 1, 0);
	before = state_of_daemon();

	/* Memory smaller than the geometry. */
	ck_assert_int_eq(ftruncate(e.fd[TEST_RANK_KV], 4096), 0);
	assert_refused(k, &e, PROTO_S_BAD_REGION, "regions[0]");
	ck_assert_int_eq(ftruncate(e.fd[TEST_RANK_KV], (off_t)e.regions[0].size), 0);

	/* A memfd that cannot be sealed against shrinking. */
	plain = memfd(e.regions[1].size, 0);
	e.regions[1].fd = plain;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "MFD_ALLOW_SEALING");
	close(plain);

	/* A read-only fd. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", e.fd[TEST_RANK_STATE]);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(ro, 0);
	e.regions[1].fd = ro;
	assert_refused(k, &e, PROTO_S_BAD_REGION, NULL);
	close(ro);
	e.regions[1].fd = e.fd[TEST_RANK_STATE];

	/* A live slot outside the slot region, and one listed twice. */
	e.live[1] = SLOTS;
	assert_refused(k, &e, PROTO_S_BAD_REGION, NULL);
	e.live[1] = 0;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "twice");
	e.live[1] = 2;

	/* Geometry that overflows: refused by the protocol check. */
	e.regions[0].page_stride = UINT64_MAX / 2;
	assert_refused(k, &e, PROTO_S_INVALID, NULL);
	e.regions[0].page_stride = (uint64_t)PAGE_TOKENS * LAYERS * TOKEN_BYTES;

	assert_state_is(before);
	/* And the corrected registration is accepted on the same connection. */
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

/*
 * Issue 11 item 2: a slot region whose stride is under a slot (0
 * included) let a RESTORE into canonical slot 1 overwrite live slot 0.
 * ATTACH refuses it, and any other region reaching into the slot
 * region's bytes in the same memfd (through the same fd or another fd of
 * the same file), with nothing mapped; the honest geometry is accepted.
 */
START_TEST(test_aliasing_slot_geometry_is_refused_at_attach)
{
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			*before;
	size_t			 kvlen;
	int			 one, dup1;

	engine_init(&e, "g-alias", 1, 0);
	before = state_of_daemon();
	e.regions[1].page_stride = 0;
	assert_refused(k, &e, PROTO_S_INVALID, NULL);
	ck_assert_str_eq(l3kv_last_error(k), "regions[1]: page_stride 0 is under the 4096 bytes one "
	    "slot spans, so two slots would overlap");
	e.regions[1].page_stride = SLOT_BYTES / 2;
	assert_refused(k, &e, PROTO_S_INVALID, "regions[1]: page_stride 2048 is under the 4096 "
	    "bytes one slot spans, so two slots would overlap");
	e.regions[1].page_stride = SLOT_BYTES;
	/* KV pages whose layers sit on one another. */
	e.regions[0].layer_stride = 0;
	assert_refused(k, &e, PROTO_S_INVALID, "regions[0]: layer_stride 0 is under");
	e.regions[0].layer_stride = TOKEN_BYTES;

	/* One memfd for both: the KV pages' last page is slot 0. */
	kvlen = e.regions[0].size;
	one = memfd(kvlen + SLOTS * SLOT_BYTES, MFD_ALLOW_SEALING);
	e.regions[0].fd = one;
	e.regions[1].fd = one;
	e.regions[1].offset = kvlen - SLOT_BYTES;
	assert_refused(k, &e, PROTO_S_BAD_REGION, NULL);
	ck_assert_str_eq(l3kv_last_error(k), "regions[0]: bytes [0, 32768) overlap the state slots "
	    "of regions[1] at [28672, 45056) in the same memory");
	/* The same file through a second fd. */
	dup1 = dup(one);
	ck_assert_int_ge(dup1, 0);
	e.regions[1].fd = dup1;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "overlap the state slots");
	assert_state_is(before);
	/* Side by side in one memfd is fine. */
	e.regions[1].offset = kvlen;
	ck_assert_msg(l3kv_attach(k, &e.args, NULL) == 0, "%s", l3kv_last_error(k));
	l3kv_close(k);
	close(dup1);
	close(one);
	test_rank_fini(&e);
}
END_TEST

/*
 * GPU memory (CUDA IPC handles, cuMem fds) needs the cuda copy engine: a
 * daemon without a GPU refuses it as a bad region, saying so, with
 * nothing mapped; and no session mixes host and GPU memory.
 */
START_TEST(test_gpu_memory_is_refused_cleanly_without_a_gpu)
{
	struct l3kv_server_info	 si;
	struct test_rank	 e;
	struct l3kv		*k = client();
	char			*before;
	int			 gpu;

	engine_init(&e, "g-gpu", 1, 0);
	ck_assert_int_eq(l3kv_server_info(k, &si), 0);
	gpu = (si.caps & L3KV_CAP_CUDA_COPY) != 0;
	before = state_of_daemon();

	e.regions[0].kind = L3KV_MEM_CUDA_IPC;
	e.regions[1].kind = L3KV_MEM_CUDA_IPC;
	memset(e.regions[0].handle, 0x5a, sizeof(e.regions[0].handle));
	memset(e.regions[1].handle, 0xa5, sizeof(e.regions[1].handle));
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? "regions[0]" : "regions[0]: cuda_ipc memory "
	    "needs the cuda copy engine, and this daemon has none (no GPU)");

	/* A cuMem fd (here a memfd: no GPU could import it either). */
	e.regions[0].kind = L3KV_MEM_CUMEM_FD;
	e.regions[1].kind = L3KV_MEM_CUMEM_FD;
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? NULL :
	    "regions[0]: cumem_fd memory needs the cuda copy engine");

	/* Host and GPU memory in one session. */
	e.regions[0].kind = L3KV_MEM_MEMFD;
	e.regions[1].kind = L3KV_MEM_CUDA_IPC;
	assert_refused(k, &e, PROTO_S_BAD_REGION, "regions[1]: " MIXED);

	/* A CUDA IPC event: not with host memory, and not without a GPU. */
	e.regions[1] = (struct l3kv_region){ .kind = L3KV_MEM_CUDA_EVENT, .fd = -1 };
	e.args.nlive = 0;	/* no slot region any more */
	memset(e.regions[1].handle, 0x77, sizeof(e.regions[1].handle));
	assert_refused(k, &e, PROTO_S_BAD_REGION, "regions[1]: " MIXED);
	e.regions[0].kind = L3KV_MEM_CUDA_IPC;
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? NULL :
	    "regions[0]: cuda_ipc memory needs the cuda copy engine");
	e.regions[0] = e.regions[1];
	e.args.nregions = 1;
	assert_refused(k, &e, PROTO_S_BAD_REGION, gpu ? NULL :
	    "regions[0]: a CUDA IPC event needs the cuda copy engine, and this daemon has none");
	test_rank_fini(&e);
	engine_init(&e, "g-gpu", 1, 0);

	assert_state_is(before);
	/* The memfd registration is accepted on the same connection. */
	e.regions[1].kind = L3KV_MEM_MEMFD;
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

START_TEST(test_configured_model_refuses_other_models)
{
	struct test_rank	 e;
	struct l3kv		*k;

	test_td_restart("{\"model\": \"kimi-linear\"}");
	k = client();
	engine_init(&e, "g-model", 1, 0);
	assert_refused(k, &e, PROTO_S_INVALID, "kimi-linear");
	e.args.layout.model = "kimi-linear";
	ck_assert_int_eq(l3kv_attach(k, &e.args, NULL), 0);
	l3kv_close(k);
	test_rank_fini(&e);
}
END_TEST

/* An engine killed without DETACH: its session and mappings go. */
START_TEST(test_killed_engine_releases_its_session)
{
	struct test_rank	 e;
	struct l3kv		*k;
	pid_t			 pid;
	int			 st;

	engine_init(&e, "g-kill", 1, 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (l3kv_connect(test_td.sock, 5000, &k) != 0 || l3kv_attach(k, &e.args, NULL) != 0)
			_exit(1);
		pause();
		_exit(0);
	}
	ck_assert_int_eq(test_td_stat_wait("attach", "sessions", 1), 1);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	ck_assert_int_eq(test_td_stat_wait("memory", "regions_mapped", 0), 0);
	test_rank_fini(&e);
}
END_TEST

#define CLIENTS	200

/* 200 connections at once, each asking HEALTH without blocking. */
START_TEST(test_200_concurrent_clients_are_served)
{
	struct l3kv_completion	 comp;
	struct l3kv		*k[CLIENTS];
	struct pollfd		 pfd[CLIENTS];
	uint64_t		 ticket[CLIENTS];
	int			 done[CLIENTS] = { 0 }, ndone = 0, i, rc;

	for (i = 0; i < CLIENTS; i++) {
		ck_assert_int_eq(l3kv_connect(test_td.sock, 5000, &k[i]), 0);
		ck_assert_int_eq(l3kv_submit_health(k[i], &ticket[i]), 0);
	}
	while (ndone < CLIENTS) {
		for (i = 0; i < CLIENTS; i++) {
			pfd[i].fd = done[i] ? -1 : l3kv_fd(k[i]);
			pfd[i].events = POLLIN;
		}
		ck_assert_int_gt(poll(pfd, CLIENTS, 5000), 0);
		for (i = 0; i < CLIENTS; i++) {
			if (done[i] || !(pfd[i].revents & POLLIN))
				continue;
			rc = l3kv_poll_completion(k[i], &comp);
			if (rc == -EAGAIN)
				continue;
			ck_assert_int_eq(rc, 0);
			ck_assert_uint_eq(comp.ticket, ticket[i]);
			ck_assert_int_eq(comp.status, 0);
			ck_assert_ptr_nonnull(strstr(comp.payload, "\"status\":\"ok\""));
			l3kv_completion_release(&comp);
			done[i] = 1;
			ndone++;
		}
	}
	for (i = 0; i < CLIENTS; i++)
		l3kv_close(k[i]);
}
END_TEST

Suite *
suite_attach(void)
{
	Suite	*s = suite_create("attach");
	TCase	*tc = test_tcase(s, "attach", 30, test_td_setup, test_td_teardown);

	tcase_add_test(tc, test_attach_and_detach_map_and_unmap_memory);
	tcase_add_test(tc, test_dcp_guard_refuses_best_effort_with_nothing_changed);
	tcase_add_test(tc, test_dcp_guard_refuses_offload_and_non_mla);
	tcase_add_test(tc, test_fingerprint_is_stable_and_changes_with_the_layout);
	tcase_add_test(tc, test_group_ranks_must_agree);
	tcase_add_test(tc, test_bad_registrations_are_refused_with_nothing_mapped);
	tcase_add_test(tc, test_aliasing_slot_geometry_is_refused_at_attach);
	tcase_add_test(tc, test_gpu_memory_is_refused_cleanly_without_a_gpu);
	tcase_add_test(tc, test_configured_model_refuses_other_models);
	tcase_add_test(tc, test_killed_engine_releases_its_session);
	tcase_add_test(tc, test_200_concurrent_clients_are_served);
	return s;
}
