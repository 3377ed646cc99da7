# l3kv: one GNU Makefile. `make` builds everything under $(BUILD)/;
# `make run` and `make check` first make sure Debian's packages are there.
#
#   make            daemon, client library, l3kvctl
#   make run        start l3kvd in the foreground on the embedded config
#   make check      build and run every test this machine can run
#   make asan       the test suite under ASan + UBSan (build-asan/)
#   make fuzz       the libFuzzer harnesses, FUZZ_SECONDS each
#   make lint       cppcheck, a clang-format check, mandoc -T lint on man/
#   make install    PREFIX=/usr/local DESTDIR=
#   make deb        the Debian packages, into build/deb (debian/README.Debian)

PREFIX		?= /usr/local
BINDIR		?= $(PREFIX)/bin
SBINDIR		?= $(PREFIX)/sbin
LIBDIR		?= $(PREFIX)/lib
INCLUDEDIR	?= $(PREFIX)/include
SYSCONFDIR	?= /etc
UNITDIR		?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR	?= $(PREFIX)/lib/sysusers.d
MANDIR		?= $(PREFIX)/share/man
DATADIR		?= $(PREFIX)/share/l3kv
PYTHON		?= python3
# Where `make install` copies the l3kv package: the interpreter's purelib under PREFIX
# (Debian: $(PREFIX)/lib/python3.X/dist-packages), asked once, only by `install`.
PYTHONDIR	?= $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("purelib", \
		   vars={"base": "$(PREFIX)", "platbase": "$(PREFIX)"}))' 2>/dev/null)
PY_SRCS		:= $(wildcard lib/python/l3kv/*.py)
# The python_sglang suite's virtual environment (sglang 0.5.23, torch 2.14.1, exact pins in
# tests/python/sglang-requirements.txt), made by `make check` and shared by `make asan`; its
# wheels are kept beside it (build/sglang-wheels). SG_VENV= (empty) leaves it out: the suite is then skipped.
SG_VENV		?= build/venv-sglang
DESTDIR		?=
BUILD		?= build
FUZZ_SECONDS	?= 20
V		?= 0

# Debian packages the build and the tests need (checked by `make deps`).
DEB_PKGS	:= gcc make pkg-config libevent-dev libjansson-dev check libfabric-dev \
		   liburing-dev libxxhash-dev systemd clang cppcheck clang-format \
		   redis-server redis-tools python3-venv g++ ninja-build libssl-dev mandoc \
		   debhelper dh-python lintian fakeroot dpkg-dev \
		   prometheus iproute2 etcd-server
PKGS		:= libevent jansson libxxhash liburing libfabric libcrypto
CHECK_PKG	:= check

ifeq ($(V),0)
Q		:= @
msg		= @printf '  %-7s %s\n' $(1) $(2);
else
Q		:=
msg		=
endif

CC		?= cc
OBJCOPY		?= objcopy
NVCC		?= $(shell command -v nvcc 2>/dev/null)
CUDA_HOME	?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(realpath $(NVCC))),)

WARN		:= -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
		   -Wpointer-arith -Wformat=2 -Wno-format-nonliteral -Wvla -Wcast-qual \
		   -Wundef
OPT		?= -O2 -g
SAN		?=
CPPFLAGS	+= -D_GNU_SOURCE -Iproto -Idaemon -Ilib -Ikernels
CFLAGS		+= -std=c11 $(OPT) $(WARN) $(SAN) -fPIC -fvisibility=hidden \
		   $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS_DEPS	:= $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread
LDFLAGS		+= $(SAN)

# CUDA: kernels/*.cu with nvcc when it is there, the stub otherwise.
KERNEL_CU	:= $(wildcard kernels/*.cu)
ifneq ($(NVCC),)
KERNEL_OBJS	:= $(patsubst kernels/%.cu,$(BUILD)/kernels/%.o,$(KERNEL_CU)) $(BUILD)/kernels/kernels_conf.o
KERNEL_LIBS	:= -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
KERNEL_NOTE	:= nvcc found: CUDA kernels built for sm_90 (+PTX), cudart linked statically
NVCCFLAGS	?= -O3 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
		   -Xcompiler -fPIC,-fno-exceptions,-fno-threadsafe-statics,-fvisibility=hidden \
		   -Ikernels
else
KERNEL_OBJS	:= $(BUILD)/kernels/kernels_stub.o $(BUILD)/kernels/kernels_conf.o
KERNEL_LIBS	:=
KERNEL_NOTE	:= nvcc not found: built the kernel stub; only the host copy engine is available
endif

PROTO_SRCS	:= proto/proto.c
DAEMON_SRCS	:= $(filter-out daemon/main.c,$(wildcard daemon/*.c))
LIB_SRCS	:= lib/l3kv.c
CTL_SRCS	:= lib/l3kvctl.c
TEST_SRCS	:= $(wildcard tests/check_*.c) tests/run.c tests/util.c
FUZZ_SRCS	:= $(wildcard tests/fuzz/fuzz_*.c)

PROTO_OBJS	:= $(PROTO_SRCS:%.c=$(BUILD)/%.o)
DAEMON_OBJS	:= $(DAEMON_SRCS:%.c=$(BUILD)/%.o)
LIB_OBJS	:= $(LIB_SRCS:%.c=$(BUILD)/%.o)
TEST_OBJS	:= $(TEST_SRCS:%.c=$(BUILD)/%.o)

L3KVD		:= $(BUILD)/l3kvd
L3KVCTL		:= $(BUILD)/l3kvctl
LIBSO		:= $(BUILD)/libl3kv.so
LIBA		:= $(BUILD)/libl3kv.a
TESTRUN		:= $(BUILD)/tests/run
SOVERSION	:= 1

.PHONY: all deps run check test asan fuzz lint install clean bench sglang-venv deb kernel-note
all: $(L3KVD) $(L3KVCTL) $(LIBSO) $(LIBA) $(BUILD)/l3kv.pc
	@echo "  note    $(KERNEL_NOTE)"

$(BUILD)/%.o: %.c
	$(call msg,CC,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

# XXH3 chooses its vector code at compile time: the copy engine's digest gets AVX2 (used only
# where the CPU has it).
ifneq ($(filter x86_64 amd64,$(shell uname -m)),)
$(BUILD)/daemon/copy_csum.o: CFLAGS += -mavx2
endif

# Tests build paths from mkdtemp names; truncation there fails the test, not the build.
$(BUILD)/tests/%.o: CFLAGS += -Wno-format-truncation

$(BUILD)/kernels/%.o: kernels/%.cu kernels/kernels.h kernels/kernels_uuid.h kernels/xxh3.h \
		kernels/cuda_err.h
	$(call msg,NVCC,$@)
	@mkdir -p $(dir $@)
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(L3KVD): $(BUILD)/daemon/main.o $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS_DEPS) $(KERNEL_LIBS) -lm

$(LIBSO): $(LIB_OBJS) $(PROTO_OBJS) lib/libl3kv.map
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libl3kv.so.$(SOVERSION) \
		-Wl,--version-script=lib/libl3kv.map -o $@ $(LIB_OBJS) $(PROTO_OBJS)

# One relocatable object whose hidden symbols (proto_*, every internal
# function) are made local, so that the archive exports l3kv_* alone, as
# the shared library's version script does.
$(LIBA): $(LIB_OBJS) $(PROTO_OBJS)
	$(call msg,AR,$@)
	$(Q)$(LD) -r -o $(BUILD)/lib/libl3kv-all.o $^ && \
		$(OBJCOPY) --localize-hidden $(BUILD)/lib/libl3kv-all.o && \
		rm -f $@ && $(AR) rcs $@ $(BUILD)/lib/libl3kv-all.o

# config check: l3kvctl parses config files with the daemon's own config.c.
$(L3KVCTL): $(CTL_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/daemon/config.o $(LIBA)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(shell pkg-config --libs jansson)

$(BUILD)/l3kv.pc: lib/l3kv.pc.in Makefile
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
		-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(shell sed -n 's/.*L3KV_VERSION.*"\(.*\)"/\1/p' daemon/daemon.h)|' $< > $@

$(TESTRUN): $(TEST_OBJS) $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS) $(LIB_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(shell pkg-config --libs $(CHECK_PKG)) $(LDLIBS_DEPS) \
		$(KERNEL_LIBS) -lm

$(BUILD)/bench_control: tests/bench/bench_control.c $(LIBA)
	$(call msg,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-format-truncation -o $@ $^

$(BUILD)/bench_file: tests/bench/bench_file.c $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS) $(LIB_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -Wno-format-truncation -o $@ $^ $(LDLIBS_DEPS) \
		$(KERNEL_LIBS) -lm

# The DRAM tier's metadata paths (index, allocation, eviction, checksum), on their own.
$(BUILD)/bench_dram: tests/bench/bench_dram.c $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS_DEPS) $(KERNEL_LIBS) -lm

# The host copy engine alone against memmove by as many threads (RESTORE, PUBLISH; checksums verified).
$(BUILD)/bench_copy: tests/bench/bench_copy.c $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS_DEPS) $(KERNEL_LIBS) -lm

# The peer tier's reads: fabric.c against a raw fi_read loop (tests/bench/fabric.sh runs it).
$(BUILD)/bench_fabric: tests/bench/bench_fabric.c $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS_DEPS) $(KERNEL_LIBS) -lm

# The peer tier's restores through two daemons, against raw fi_read and Mooncake TE (tests/bench/peer.sh).
$(BUILD)/bench_peer: tests/bench/bench_peer.c $(LIBA)
	$(call msg,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-format-truncation -o $@ $^ $(shell pkg-config --libs jansson) -lm

# The GPU data-path benchmark, through kernels.h (tests/bench/gpu.sh runs it on a GPU host).
$(BUILD)/bench_gpu: $(BUILD)/tests/bench/bench_gpu.o $(DAEMON_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS_DEPS) $(KERNEL_LIBS) -lm

# End to end through a real l3kvd with copy_engine cuda: libl3kv plus kernels.h for the
# engine's device memory (tests/bench/gpu_device_run.sh runs it on a GPU host; without
# one it exits 2, so `bench` only builds it).
$(BUILD)/bench_e2e: $(BUILD)/tests/bench/bench_e2e.o $(LIB_OBJS) $(PROTO_OBJS) $(KERNEL_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS_DEPS) $(KERNEL_LIBS) -lm

# Benchmarks: numbers, never pass/fail. Results go to tests/bench/RESULTS.md by hand.
bench: all $(BUILD)/bench_control $(BUILD)/bench_file $(BUILD)/bench_e2e $(BUILD)/bench_dram \
		$(BUILD)/bench_copy $(BUILD)/bench_fabric $(BUILD)/bench_peer
	$(Q)$(BUILD)/bench_dram 200000
	$(Q)$(BUILD)/bench_copy
	$(Q)tests/bench/control.sh $(BUILD)
	$(Q)tests/bench/file.sh $(BUILD)
	$(Q)tests/bench/fabric.sh $(BUILD)
	$(Q)tests/bench/mooncake.sh $(BUILD) || [ $$? -eq 77 ]
	$(Q)tests/bench/peer.sh $(BUILD) || [ $$? -eq 77 ]
	$(Q)tests/bench/sglang.sh $(BUILD) || [ $$? -eq 77 ]

# Installs what is missing from Debian's archive, as root; otherwise says how.
deps:
	@missing=""; for p in $(DEB_PKGS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "  deps    installing:$$missing"; \
			(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null || exit 1; \
		else \
			echo "missing packages; run as root:"; \
			echo "  apt-get install$$missing"; exit 1; \
		fi; \
	fi

run: deps
	$(Q)$(MAKE) --no-print-directory all
	$(L3KVD) $(L3KVD_ARGS)

# SGLang's native page hash is built by torch's cpp_extension: g++, ninja, libssl-dev.
sglang-venv:
	$(Q)if [ -n "$(SG_VENV)" ]; then tests/python/sglang_venv.sh $(SG_VENV) $(PYTHON); fi

test: all $(TESTRUN) sglang-venv
	$(Q)L3KV_BUILD=$(BUILD) L3KV_SGLANG_VENV=$(if $(SG_VENV),$(SG_VENV),/nonexistent) $(TESTRUN)

check: deps
	$(Q)$(MAKE) --no-print-directory test

asan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -g" \
		SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
		test

FUZZ_BINS	:= $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
$(BUILD)/fuzz/%: tests/fuzz/%.c $(PROTO_SRCS) daemon/config.c daemon/log.c
	$(call msg,FUZZ,$@)
	@mkdir -p $(dir $@)
	$(Q)clang $(CPPFLAGS) -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined \
		$(shell pkg-config --cflags jansson) -o $@ $^ $(shell pkg-config --libs jansson)

# The file object header decoder lives in filetier_obj.c, which links with the rest of the daemon.
$(BUILD)/fuzz/fuzz_filehdr: tests/fuzz/fuzz_filehdr.c $(DAEMON_SRCS) $(PROTO_SRCS) kernels/kernels_stub.c \
		kernels/kernels_conf.c
	$(call msg,FUZZ,$@)
	@mkdir -p $(dir $@)
	$(Q)clang $(CPPFLAGS) -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined \
		$(shell pkg-config --cflags $(PKGS)) -o $@ $^ $(LDLIBS_DEPS) -lm

fuzz: deps $(FUZZ_BINS)
	$(Q)for f in $(FUZZ_BINS); do \
		n=$$(basename $$f); mkdir -p $(BUILD)/fuzz/corpus-$$n; \
		echo "  fuzz    $$n for $(FUZZ_SECONDS)s"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			$(BUILD)/fuzz/corpus-$$n tests/fuzz/seeds-$$n 2>$(BUILD)/fuzz/$$n.log || \
			{ tail -50 $(BUILD)/fuzz/$$n.log; exit 1; }; \
		grep -E 'stat::number_of_executed_units' $(BUILD)/fuzz/$$n.log; \
	done

# The manual: man/NAME.N goes to $(MANDIR)/manN.
MAN_PAGES	:= $(wildcard man/*.[1-8])

LINT_SRCS	:= $(wildcard proto/*.[ch] daemon/*.[ch] lib/*.[ch] kernels/*.[ch] tests/*.[ch] tests/fuzz/*.c)
# cppcheck gates. clang-format 14 cannot express the house style's
# tab-aligned declarations (STYLE.md), so its diff is reported, while the
# rules it shares with the style (110 columns, tab indentation, no
# trailing blanks) are enforced by tests/lint.sh.
QUEUE_H		= $(shell printf '\043include <sys/queue.h>\n' | $(CC) -M -x c - | \
		   tr ' \\' '\n\n' | grep 'sys/queue.h$$' | head -1)
CPPCHECK_DEFS	= -D_GNU_SOURCE -D__linux__ --include=$(QUEUE_H)
lint:
	$(Q)cppcheck --quiet --error-exitcode=1 --enable=warning,portability,performance \
		--inline-suppr --std=c11 $(CPPCHECK_DEFS) -Iproto -Idaemon -Ilib -Ikernels $(LINT_SRCS)
	$(Q)tests/lint.sh $(LINT_SRCS)
	$(Q)n=0; for f in $(LINT_SRCS); do \
		n=$$((n + $$(clang-format $$f | diff $$f - | grep -c '^<'))); done; \
		echo "  lint    clang-format would change $$n lines (advisory; see .clang-format)"
	$(Q)mandoc -T lint -W warning $(MAN_PAGES)

install: all
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(SYSCONFDIR)/l3kv $(DESTDIR)$(UNITDIR)
	install -m 0755 $(L3KVD) $(DESTDIR)$(SBINDIR)/l3kvd
	install -m 0755 $(L3KVCTL) $(DESTDIR)$(BINDIR)/l3kvctl
	install -m 0755 $(LIBSO) $(DESTDIR)$(LIBDIR)/libl3kv.so.$(SOVERSION)
	ln -sf libl3kv.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libl3kv.so
	install -m 0644 $(LIBA) $(DESTDIR)$(LIBDIR)/libl3kv.a
	install -m 0644 lib/l3kv.h $(DESTDIR)$(INCLUDEDIR)/l3kv.h
	install -m 0644 $(BUILD)/l3kv.pc $(DESTDIR)$(LIBDIR)/pkgconfig/l3kv.pc
	install -m 0644 config/l3kvd.json $(DESTDIR)$(SYSCONFDIR)/l3kv/l3kvd.json
	install -m 0644 config/README.md $(DESTDIR)$(SYSCONFDIR)/l3kv/README.md
	sed 's|@SBINDIR@|$(SBINDIR)|g; s|@SYSCONFDIR@|$(SYSCONFDIR)|g' config/l3kvd.service \
		> $(DESTDIR)$(UNITDIR)/l3kvd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/l3kvd.service
	install -d $(DESTDIR)$(SYSUSERSDIR)
	install -m 0644 config/l3kv.sysusers $(DESTDIR)$(SYSUSERSDIR)/l3kv.conf
	install -d $(DESTDIR)$(DATADIR)
	install -m 0644 config/grafana-l3kv.json $(DESTDIR)$(DATADIR)/grafana-l3kv.json
	@test -n "$(PYTHONDIR)" || { echo "install: no $(PYTHON) to ask for PYTHONDIR; set PYTHONDIR="; exit 1; }
	install -d $(DESTDIR)$(PYTHONDIR)/l3kv
	install -m 0644 $(PY_SRCS) $(DESTDIR)$(PYTHONDIR)/l3kv/
	$(Q)for p in $(MAN_PAGES); do \
		d=$(DESTDIR)$(MANDIR)/man$${p##*.}; \
		echo "install -m 0644 $$p $$d/"; install -d $$d && install -m 0644 $$p $$d/ || exit 1; \
	done
	@# The unit runs as the l3kv user: installing onto this machine (no DESTDIR) makes it.
	$(Q)if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null; then \
		echo "systemd-sysusers $(SYSUSERSDIR)/l3kv.conf"; systemd-sysusers $(SYSUSERSDIR)/l3kv.conf; fi

# The Debian packages (debian/README.Debian): dpkg-buildpackage -b, with the .debs, .buildinfo
# and .changes in $(DEB_OUT) rather than in the repository's parent, then lintian, which fails
# on errors. The engine is this Makefile's choice (nvcc found or not), passed down as $$NVCC;
# DEB_PROFILES=pkg.l3kv.nocuda builds the stub even where nvcc is.
DEB_OUT		?= $(BUILD)/deb
DEB_PROFILES	?=
DEB_JOBS	?= 2
deb: deps
	$(Q)rm -rf $(DEB_OUT) && mkdir -p $(DEB_OUT)
	$(Q)o=$(abspath $(DEB_OUT)); v=$$(dpkg-parsechangelog -S Version); \
		a=$$(dpkg-architecture -qDEB_HOST_ARCH); \
		env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL DEB_OUT=$$o NVCC="$(NVCC)" \
		dpkg-buildpackage -us -uc -b -j$(DEB_JOBS) $(if $(DEB_PROFILES),-P$(DEB_PROFILES)) \
		--buildinfo-file=$$o/l3kv_$${v}_$$a.buildinfo --changes-file=$$o/l3kv_$${v}_$$a.changes \
		--buildinfo-option=-u$$o --changes-option=-u$$o
	$(Q)lintian --fail-on error $(DEB_OUT)/*.changes
	@ls $(DEB_OUT)/*.deb

# The engine this build carries, one line (debian/rules writes it into README.Debian).
kernel-note:
	@echo "$(KERNEL_NOTE)"

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
