# Runtime: top-level build.
#   make            runtimed, runtime-agent (static), runtime
#   make test-unit  cmocka unit tests (tests/unit/test_*.c)
#   make unit-build the unit test binaries, not run (build/tests)
#   make asan       the unit tests again under ASan+UBSan (in build/asan)
#   make fuzz       libFuzzer targets (tests/fuzz/fuzz_*.c), needs clang
#   make fuzz-replay  every fuzz target over its corpus once (ASan+UBSan)
#
# Layout: every component has its entry point in main.c; everything else in
# its folder is library code that the unit tests link against.

CC ?= cc
CLANG ?= clang
BUILD ?= build
PKGS_DAEMON := libmicrohttpd jansson sqlite3 libpq libseccomp openssl libsystemd libcurl libarchive
PKGS_CLI := libcurl jansson libcrypto

WARN := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes \
        -Wno-unused-parameter
HARDEN := -D_FORTIFY_SOURCE=3 -fstack-protector-strong
OPT ?= -O2 -g
# Sanitizer flags for compile and link (`make asan` sets them); empty in a
# release build.
SANITIZE ?=
VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
# Where `make install` puts things. runtimed looks for its companions beside
# itself, then in ../libexec/runtime, then in LIBEXECDIR (compiled in), so the
# source tree's build/, a PREFIX install and the package all find them.
PREFIX ?= /usr/local
LIBEXECDIR ?= $(PREFIX)/libexec/runtime
DEFINES := -DRUNTIME_VERSION=\"$(VERSION)\" -DRUNTIME_LIBEXECDIR=\"$(LIBEXECDIR)\"
CFLAGS_COMMON := -std=gnu17 $(OPT) $(SANITIZE) $(WARN) -Isrc -D_GNU_SOURCE -pthread $(DEFINES)
CFLAGS_PIE := $(CFLAGS_COMMON) $(HARDEN) -fPIE
LDFLAGS_PIE := -pie -Wl,-z,relro,-z,now -pthread $(SANITIZE)


# Source sets.
PROTO_SRC := $(wildcard src/proto/*.c)
COMMON_SRC := $(wildcard src/common/*.c)
SUPERVISOR_LIB_SRC := $(filter-out src/supervisor/main.c,$(wildcard src/supervisor/*.c))
DAEMON_LIB_SRC := $(filter-out src/daemon/main.c,$(wildcard src/daemon/*.c src/daemon/*/*.c)) \
                  $(wildcard src/driver/*.c) $(filter-out src/egress/main.c,$(wildcard src/egress/*.c)) \
                  $(SUPERVISOR_LIB_SRC)
AGENT_LIB_SRC := $(filter-out src/agent/main.c,$(wildcard src/agent/*.c))
CLI_LIB_SRC := $(filter-out src/cli/main.c,$(wildcard src/cli/*.c))

obj = $(patsubst src/%.c,$(BUILD)/obj/$(1)/%.o,$(2))

DAEMON_CFLAGS = $(CFLAGS_PIE) -I$(BUILD)/gen $(shell pkg-config --cflags $(PKGS_DAEMON))
DAEMON_LIBS = $(shell pkg-config --libs $(PKGS_DAEMON)) -lhttp_parser -lwslay
CLI_CFLAGS = $(CFLAGS_PIE) $(shell pkg-config --cflags $(PKGS_CLI))
CLI_LIBS = $(shell pkg-config --libs $(PKGS_CLI)) -lwslay
# The agent is PID 1 in images we do not control the libc of: link it
# statically. Debian's static archives are not PIC, so no static-pie.
# The sanitizer runtimes exist only as shared libraries here, so a sanitizer
# build links the agent dynamically (still -no-pie: its objects are not PIC);
# such an agent runs only on the host (unit tests), never as a guest's init.
AGENT_CFLAGS = $(CFLAGS_COMMON) $(HARDEN) -fno-PIE
AGENT_LDFLAGS = $(if $(SANITIZE),,-static) -no-pie -Wl,-z,relro,-z,now -pthread $(SANITIZE)
AGENT_LIBS = -ljansson -lz

DAEMON_OBJ := $(call obj,daemon,$(PROTO_SRC) $(COMMON_SRC) $(DAEMON_LIB_SRC))
AGENT_OBJ := $(call obj,agent,$(PROTO_SRC) $(COMMON_SRC) $(AGENT_LIB_SRC))
CLI_OBJ := $(call obj,cli,$(COMMON_SRC) $(CLI_LIB_SRC))

.PHONY: all clean unit-build test-unit asan asan-build fuzz fuzz-run fuzz-replay
all: $(BUILD)/runtimed $(BUILD)/runtime-agent $(BUILD)/runtime $(BUILD)/runtime-image-build \
     $(BUILD)/runtime-microvm-build $(BUILD)/runtime-egress $(BUILD)/runtime-supervisor

# The image builder is a shell script (mmdebstrap does the work); the daemon
# looks for it next to its own binary.
$(BUILD)/runtime-image-build: images/build.sh $(BUILD)/mcp/package-lock.json $(BUILD)/mcp/package.json \
                               $(BUILD)/mcp/requirements.txt
	@mkdir -p $(dir $@)
	install -m 0755 $< $@
# The pins of the MCP servers and their gateway, read from beside the builder.
$(BUILD)/mcp/%: images/mcp/%
	@mkdir -p $(dir $@)
	install -m 0644 $< $@
# The microVM's kernel, initramfs and ext4 root, made from an image.
$(BUILD)/runtime-microvm-build: images/microvm/build.sh
	@mkdir -p $(dir $@)
	install -m 0755 $< $@

# The interpreter's in-sandbox program travels inside runtimed as a C string.
$(BUILD)/gen/interpreter_program.inc: src/interpreter/runtime_interpreter.py
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $< >$@
$(BUILD)/obj/daemon/daemon/api/api_interpreter.o $(BUILD)/obj/fuzz/daemon/api/api_interpreter.o: $(BUILD)/gen/interpreter_program.inc
# So does the program that runs a sandbox's MCP servers (docs/mcp.md).
$(BUILD)/gen/mcp_gateway_program.inc: src/mcp/runtime_mcp_gateway.py
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $< >$@
$(BUILD)/gen/mcp_http_program.inc: src/mcp/runtime_mcp_http.py
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $< >$@
$(BUILD)/obj/daemon/daemon/api/api_mcp_inside.o $(BUILD)/obj/fuzz/daemon/api/api_mcp_inside.o: $(BUILD)/gen/mcp_gateway_program.inc \
	$(BUILD)/gen/mcp_http_program.inc
# So do the dashboard's page, script and style sheet (docs/dashboard.md).
DASHBOARD_INC := $(patsubst src/dashboard/%,$(BUILD)/gen/dashboard/%.inc,$(wildcard src/dashboard/*.html src/dashboard/*.js src/dashboard/*.css))
$(BUILD)/gen/dashboard/%.inc: src/dashboard/%
	@mkdir -p $(dir $@)
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $< >$@
$(BUILD)/obj/daemon/daemon/api/api_dashboard.o $(BUILD)/obj/fuzz/daemon/api/api_dashboard.o: $(DASHBOARD_INC)

$(BUILD)/obj/daemon/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(DAEMON_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/agent/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(AGENT_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/cli/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CLI_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/runtimed: $(DAEMON_OBJ) $(BUILD)/obj/daemon/daemon/main.o
	$(CC) $(LDFLAGS_PIE) -o $@ $^ $(DAEMON_LIBS)
# The egress proxy process: the egress library and the shared helpers (the log among them).
EGRESS_OBJ := $(call obj,daemon,$(COMMON_SRC) $(filter-out src/egress/main.c,$(wildcard src/egress/*.c)))
$(BUILD)/runtime-egress: $(EGRESS_OBJ) $(BUILD)/obj/daemon/egress/main.o
	$(CC) $(LDFLAGS_PIE) -o $@ $^ $(DAEMON_LIBS)
# Each running sandbox's supervisor (docs/lifecycle.md, "Live restore"): the
# relay, the channel's framing and libseccomp, nothing of the daemon's.
SUPERVISOR_OBJ := $(call obj,daemon,$(PROTO_SRC) src/common/io.c src/common/timeutil.c $(SUPERVISOR_LIB_SRC))
$(BUILD)/runtime-supervisor: $(SUPERVISOR_OBJ) $(BUILD)/obj/daemon/supervisor/main.o
	$(CC) $(LDFLAGS_PIE) -o $@ $^ -lseccomp
$(BUILD)/runtime-agent: $(AGENT_OBJ) $(BUILD)/obj/agent/agent/main.o
	$(CC) $(AGENT_LDFLAGS) -o $@ $^ $(AGENT_LIBS)
$(BUILD)/runtime: $(CLI_OBJ) $(BUILD)/obj/cli/cli/main.o
	$(CC) $(LDFLAGS_PIE) -o $@ $^ $(CLI_LIBS)

# Unit tests: tests/unit/test_<x>.c links with the daemon's library objects,
# test_agent_*.c with the agent's, test_cli_*.c with the CLI's.
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
UNIT_HDR := $(wildcard tests/unit/*.h)

$(BUILD)/tests/test_agent_%: tests/unit/test_agent_%.c $(AGENT_OBJ) $(UNIT_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(AGENT_CFLAGS) -no-pie -o $@ $(filter-out %.h,$^) -pthread $(SANITIZE) $(AGENT_LIBS) -lcmocka
$(BUILD)/tests/test_cli_%: tests/unit/test_cli_%.c $(CLI_OBJ) $(UNIT_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CLI_CFLAGS) -o $@ $(filter-out %.h,$^) $(LDFLAGS_PIE) $(CLI_LIBS) -lcmocka
$(BUILD)/tests/test_%: tests/unit/test_%.c $(DAEMON_OBJ) $(UNIT_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(DAEMON_CFLAGS) -o $@ $(filter-out %.h,$^) $(LDFLAGS_PIE) $(DAEMON_LIBS) -lcmocka

unit-build: $(BUILD)/runtime-agent $(UNIT_BIN)
test-unit: unit-build
	@fail=0; for t in $(UNIT_BIN); do echo "== $$t"; $$t || fail=1; done; exit $$fail

# Sanitizer lane: the same unit tests, built and run with ASan+UBSan; any
# report ends the test binary with an error. The driver tests inside it start
# their sandboxes with the release agent (build/runtime-agent, static), so it
# is built first. asan-build only builds (pytest runs the binaries).
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
ASAN_MAKE = $(MAKE) BUILD=$(BUILD)/asan OPT="-O1 -g" SANITIZE="$(ASAN_FLAGS)"
asan: $(BUILD)/runtime-agent
	$(ASAN_MAKE) test-unit
asan-build: $(BUILD)/runtime-agent
	$(ASAN_MAKE) unit-build

# libFuzzer targets: tests/fuzz/fuzz_<x>.c, each with its corpus in
# tests/fuzz/corpus/<x>/.
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))
FUZZ_CFLAGS = -std=gnu17 -O1 -g -Isrc -D_GNU_SOURCE -pthread -fsanitize=address,undefined -fno-sanitize-recover=all \
              $(DEFINES) -I$(BUILD)/gen \
              $(shell pkg-config --cflags $(PKGS_DAEMON))
# The library sources are compiled once, with coverage but without
# libFuzzer's main, into objects every target links.
FUZZ_OBJ := $(call obj,fuzz,$(PROTO_SRC) $(COMMON_SRC) $(DAEMON_LIB_SRC))
.SECONDARY: $(FUZZ_OBJ)
$(BUILD)/obj/fuzz/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $^ $(DAEMON_LIBS)
fuzz: $(FUZZ_BIN)
# Runs every target over its corpus plus FUZZ_SECONDS of new inputs; each
# target is a job of its own, so `make -j2 fuzz-run` fuzzes two at a time.
FUZZ_SECONDS ?= 20
FUZZ_RUN := $(patsubst tests/fuzz/fuzz_%.c,fuzz-run-%,$(FUZZ_SRC))
.PHONY: $(FUZZ_RUN)
fuzz-run: $(FUZZ_RUN)
$(FUZZ_RUN): fuzz-run-%: $(BUILD)/fuzz/fuzz_%
	@mkdir -p $(BUILD)/fuzz/scratch/$*
	@echo "== $<"; $< -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/scratch/$* tests/fuzz/corpus/$*
# Runs every target once over each input of its corpus, nothing new: the
# sanitizer lane's replay.
fuzz-replay: $(FUZZ_BIN)
	@set -e; for f in $(FUZZ_BIN); do n=$$(basename $$f); n=$${n#fuzz_}; \
	    echo "== $$f"; $$f -runs=0 tests/fuzz/corpus/$$n; done

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Manual pages and completions, made by the programs from their own tables
# (the daemon's options, the CLI's commands), so they never drift.
MAN_PAGES := $(BUILD)/man/runtimed.8 $(BUILD)/man/runtimed.conf.5 $(BUILD)/man/runtime.1
COMPLETIONS := $(BUILD)/completion/runtime.bash $(BUILD)/completion/_runtime
$(BUILD)/man/runtimed.8: $(BUILD)/runtimed
	@mkdir -p $(dir $@)
	$< --help-man >$@.tmp && mv $@.tmp $@
$(BUILD)/man/runtimed.conf.5: $(BUILD)/runtimed
	@mkdir -p $(dir $@)
	$< --help-man-conf >$@.tmp && mv $@.tmp $@
$(BUILD)/man/runtime.1: $(BUILD)/runtime
	@mkdir -p $(dir $@)
	$< --help-man >$@.tmp && mv $@.tmp $@
$(BUILD)/completion/runtime.bash: $(BUILD)/runtime
	@mkdir -p $(dir $@)
	$< --completion bash >$@.tmp && mv $@.tmp $@
$(BUILD)/completion/_runtime: $(BUILD)/runtime
	@mkdir -p $(dir $@)
	$< --completion zsh >$@.tmp && mv $@.tmp $@
man: $(MAN_PAGES)
completion: $(COMPLETIONS)

MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
install: all man completion
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBEXECDIR)
	install -m 0755 $(BUILD)/runtimed $(BUILD)/runtime $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 $(BUILD)/runtime-agent $(BUILD)/runtime-image-build $(BUILD)/runtime-microvm-build \
	    $(BUILD)/runtime-egress $(BUILD)/runtime-supervisor \
	    $(DESTDIR)$(LIBEXECDIR)/
	install -d $(DESTDIR)$(LIBEXECDIR)/mcp
	install -m 0644 images/mcp/package.json images/mcp/package-lock.json images/mcp/requirements.txt \
	    $(DESTDIR)$(LIBEXECDIR)/mcp/
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	install -m 0644 $(BUILD)/man/runtime.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(BUILD)/man/runtimed.conf.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 $(BUILD)/man/runtimed.8 $(DESTDIR)$(MANDIR)/man8/
	install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	install -m 0644 $(BUILD)/completion/runtime.bash $(DESTDIR)$(BASHCOMPDIR)/runtime
	install -m 0644 $(BUILD)/completion/_runtime $(DESTDIR)$(ZSHCOMPDIR)/_runtime
	install -m 0755 scripts/install-runsc.sh $(DESTDIR)$(LIBEXECDIR)/runtime-install-runsc
	install -d $(DESTDIR)$(PREFIX)/share/runtime/runsc
	install -m 0644 scripts/runsc/go.mod scripts/runsc/go.sum $(DESTDIR)$(PREFIX)/share/runtime/runsc/

# The Debian package (debian/, docs/install.md): dpkg-buildpackage in a copy
# of the tree's committed and working files, so that the checkout's build/
# stays as it is; the .deb lands in DEB_OUT. The package's own make runs
# without this one's variables (MAKEFLAGS carries them), so its BUILD is its own.
DEB_JOBS ?= 2
DEB_OUT ?= $(BUILD)/deb
deb:
	rm -rf $(DEB_OUT) && mkdir -p $(DEB_OUT)/src
	git ls-files -co --exclude-standard -z | grep -zv '^build/' | xargs -0 cp --parents -t $(DEB_OUT)/src
	cd $(DEB_OUT)/src && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL dpkg-buildpackage -b -us -uc -j$(DEB_JOBS)
.PHONY: install man completion deb
