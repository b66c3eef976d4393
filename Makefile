# hugify — conventional targets:
#   make                      build the Rust core and its Python extension (in place)
#   make install DESTDIR= PREFIX=/usr   install the CLI and its package (PREFIX=~/.local: yours alone)
#   make deb                  hugify's own .deb in dist/, from a copy of the tracked sources
#   make test                 install test dependencies and run every test
#   make demo                 build and rewrite the bundled example program, run it on huge pages
#   make build CROSS=aarch64-linux-gnu- CARGO_TARGET=aarch64-unknown-linux-gnu
#                             for another architecture, in a copy of the source tree: the
#                             extension for rustup's target of that name, linked by Debian's
#                             cross compiler of that prefix, and the runtime (runtime/Makefile)
PREFIX ?= /usr/local
DESTDIR ?=
PYTHON ?= /usr/bin/python3
BINDIR = $(PREFIX)/bin
LIBDIR = $(PREFIX)/lib/hugify
PYDIR = $(LIBDIR)/python
# cargo on PATH, else rustup's (tools/setup-dev-env installs it there when it must).
CARGO ?= $(or $(shell command -v cargo),$(HOME)/.cargo/bin/cargo)
MANDIR = $(PREFIX)/share/man
PERL5DIR ?= $(PREFIX)/share/perl5
# The documents hugify's messages name (hugify/docs.py finds them beside the package);
# empty where the packaging installs them itself (dh_installdocs, rpm's %doc).
DOCDIR ?= $(PREFIX)/share/doc/hugify
# Man pages come from hugify's own parsers (tools/manpages), which load the built
# extension: not for another architecture's build.
MAN ?= $(if $(CROSS),no,yes)
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
VENV = .venv
EXT = hugify/_core.abi3.so
CROSS ?=
CARGO_TARGET ?=
CARGO_OUT = $(or $(CARGO_TARGET_DIR),target)/$(if $(CARGO_TARGET),$(CARGO_TARGET)/)release
# cargo's variable for the target's linker: CARGO_TARGET_<TRIPLE>_LINKER.
CARGO_LINKER = $(if $(CARGO_TARGET),CARGO_TARGET_$(shell echo '$(CARGO_TARGET)' | tr a-z- A-Z_)_LINKER=$(CROSS)gcc)

.PHONY: all build install test lint unit pytest demo setup setup-demo clean dist deb

all: build

# A fresh machine needs no step before `make install` or `make demo`: a recipe whose tool
# is missing runs tools/setup-dev-env --demo first (apt-get through sudo, Rust through
# rustup); where the tools are there (a package build), nothing is installed.
need = command -v $(1) >/dev/null 2>&1 || tools/setup-dev-env --demo

build: $(EXT)
	@$(call need,$(CROSS)gcc)
	$(MAKE) -C runtime PREFIX=$(PREFIX)

# The extension is a plain cdylib; no build frontend is needed to install it.
$(EXT): $(shell find core/src bindings/src -name '*.rs') core/Cargo.toml bindings/Cargo.toml Cargo.toml
	@$(call need,$(CARGO))
	$(CARGO_LINKER) $(CARGO) build --release --locked -p hugify-python $(if $(CARGO_TARGET),--target $(CARGO_TARGET))
	install -m 0644 $(CARGO_OUT)/lib_core.so $(EXT)

PRIVATE_NOTE = ; a private prefix: README.md (Install) says what to add to PATH and PERL5LIB
# dh_hugify's man pages need pod2man (Debian's perl, which debhelper, needed by the
# add-on, pulls in): left out without it.
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PYDIR)/hugify/commands $(DESTDIR)$(PYDIR)/hugify/trial
	install -m 0644 hugify/*.py hugify/py.typed $(DESTDIR)$(PYDIR)/hugify/
	install -m 0644 hugify/commands/*.py $(DESTDIR)$(PYDIR)/hugify/commands/
	install -m 0644 hugify/trial/*.py $(DESTDIR)$(PYDIR)/hugify/trial/
	install -m 0644 $(EXT) $(DESTDIR)$(PYDIR)/hugify/
	sed -e 's|@PYTHON@|$(PYTHON)|' -e 's|@PYDIR@|$(PYDIR)|' tools/hugify.in > $(DESTDIR)$(BINDIR)/hugify
	chmod 0755 $(DESTDIR)$(BINDIR)/hugify
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PREFIX)/lib/rpm/macros.d
	install -m 0644 policy/policy.toml $(DESTDIR)$(LIBDIR)/policy.toml
	install -m 0755 brp-scripts/brp-hugify $(DESTDIR)$(PREFIX)/lib/rpm/brp-hugify
	sed -e 's|%{_bindir}/hugify|$(BINDIR)/hugify|' -e 's|%{_rpmconfigdir}/brp-hugify|$(PREFIX)/lib/rpm/brp-hugify|' \
		brp-scripts/macros.hugify > $(DESTDIR)$(PREFIX)/lib/rpm/macros.d/macros.hugify
	$(MAKE) -C runtime install DESTDIR=$(DESTDIR) PREFIX=$(PREFIX)
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system
	sed -e 's|/usr/bin/hugify|$(BINDIR)/hugify|' systemd/hugify-prefetch.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/hugify-prefetch.service
	install -m 0644 systemd/hugify-prefetch.timer $(DESTDIR)$(PREFIX)/lib/systemd/system/hugify-prefetch.timer
	install -m 0644 systemd/run-hugify-shared.mount $(DESTDIR)$(PREFIX)/lib/systemd/system/run-hugify-shared.mount
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system-generators
	sed -e 's|@PYTHON@|$(PYTHON)|' -e 's|@PYDIR@|$(PYDIR)|' systemd/hugify-shared-generator.in \
		> $(DESTDIR)$(PREFIX)/lib/systemd/system-generators/hugify-shared-generator
	chmod 0755 $(DESTDIR)$(PREFIX)/lib/systemd/system-generators/hugify-shared-generator
	install -d $(DESTDIR)$(PERL5DIR)/Debian/Debhelper/Sequence $(DESTDIR)$(MANDIR)/man1
	install -m 0755 dh-hugify/dh_hugify dh-hugify/dh_hugify_check dh-hugify/dh_hugify_sign $(DESTDIR)$(BINDIR)/
	install -m 0644 dh-hugify/Debian/Debhelper/Sequence/hugify.pm $(DESTDIR)$(PERL5DIR)/Debian/Debhelper/Sequence/hugify.pm
	install -m 0644 dh-hugify/Debian/Debhelper/Hugify.pm $(DESTDIR)$(PERL5DIR)/Debian/Debhelper/Hugify.pm
ifneq ($(DOCDIR),)
	install -d $(DESTDIR)$(DOCDIR)
	install -m 0644 README.md docs/*.md signing/predicate-v1.md $(DESTDIR)$(DOCDIR)/
endif
ifeq ($(MAN),yes)
	env PYTHONPATH=$(CURDIR) $(PYTHON) tools/manpages $(DESTDIR)$(MANDIR)/man1 runtime/hugify-run
	@if command -v pod2man >/dev/null; then \
		echo "pod2man: $(DESTDIR)$(MANDIR)/man1/dh_hugify.1 dh_hugify_check.1 dh_hugify_sign.1"; \
		for c in dh_hugify dh_hugify_check dh_hugify_sign; do \
			pod2man --utf8 --section=1 --center=hugify --release='hugify $(VERSION)' dh-hugify/$$c > $(DESTDIR)$(MANDIR)/man1/$$c.1 || exit 1; \
		done; \
	else echo "make install: no pod2man (Debian's perl): the man pages of dh_hugify, dh_hugify_check and dh_hugify_sign are left out"; fi
endif
	@echo "installed hugify $(VERSION) in $(DESTDIR)$(PREFIX)$(if $(filter-out /usr /usr/local,$(PREFIX)),$(PRIVATE_NOTE))"

setup:
	tools/setup-dev-env

# Only what the demo needs (no cross compilers, cosign or nightly Rust).
setup-demo:
	tools/setup-dev-env --demo

lint: setup build
	$(CARGO) fmt --check
	$(CARGO) clippy --release --locked --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

unit: setup
	$(CARGO) test --release --locked
	# Fuzz findings replayed with overflow checks on, as the fuzz targets build them.
	$(CARGO) test --locked -p hugify-core --test fuzz_regressions

pytest: setup build
	$(VENV)/bin/python -m pytest -n 2 tests

# Every stage, then a timing summary (tools/run-tests); CI runs exactly this.
test:
	tools/run-tests

demo: setup-demo build
	tools/demo

# hugify's own .deb, in dist/: built by dpkg-buildpackage in a copy of the tracked sources
# (dist/deb; the checkout's debian/ and build products stay as they are), after
# tools/setup-dev-env --deb has installed the build dependencies (apt-get, through sudo
# where not root). Rust from the archive where it is new enough (Debian 13's cargo),
# else rustup's (build profile pkg.hugify.rustup). Compiled crates are reused from target/
# (or $CARGO_TARGET_DIR).
# Its version is a snapshot's, VERSION+src.DIGEST of the sources copied (tools/stamp-snapshot),
# so that a .buildinfo naming it says which code ran; RELEASE=1 keeps debian/changelog's
# version, for the sources of a release only (docs/packaging-debian.md).
DEB_PROFILE = $(if $(filter /usr/bin/cargo,$(shell command -v cargo)),,-Ppkg.hugify.rustup)
DEB_SRC = dist/deb/hugify-$(VERSION)
deb:
	tools/setup-dev-env --deb
	rm -rf dist/deb && mkdir -p $(DEB_SRC)
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git ls-files -z --cached --others --exclude-standard -- . ':!tests' ':!bench' ':!testkit' \
			| tar --null -T - -cf - | tar -xf - -C $(DEB_SRC); \
	else \
		tar --exclude=./dist --exclude=./target --exclude=./.venv --exclude='*.so' --exclude=./tests \
			--exclude=./bench --exclude=./testkit --exclude=__pycache__ -cf - . | tar -xf - -C $(DEB_SRC); \
	fi
	$(if $(RELEASE),,tools/stamp-snapshot $(DEB_SRC))
	cd $(DEB_SRC) && env CARGO_TARGET_DIR=$(or $(CARGO_TARGET_DIR),$(CURDIR)/target) dpkg-buildpackage -us -uc -b $(DEB_PROFILE)
	mv dist/deb/*.deb dist/deb/*.changes dist/deb/*.buildinfo dist/
	rm -rf dist/deb
	@deb=$$(ls -t dist/hugify_$(VERSION)*_*.deb | head -n1); echo "built: $$deb; install it with: sudo apt install ./$$deb"

# A source tarball of the last commit (what spec/hugify.spec builds from).
dist:
	mkdir -p dist
	git archive --format=tar.gz --prefix=hugify-$(VERSION)/ -o dist/hugify-$(VERSION).tar.gz HEAD

clean:
	$(CARGO) clean
	rm -f $(EXT)
