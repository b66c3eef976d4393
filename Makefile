# hugify — conventional targets:
#   make                      build the Rust core and its Python extension (in place)
#   make install DESTDIR= PREFIX=/usr   install the CLI and its package
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
CARGO ?= cargo
MANDIR = $(PREFIX)/share/man
PERL5DIR ?= $(PREFIX)/share/perl5
HELP2MAN ?= help2man
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
VENV = .venv
EXT = hugify/_core.abi3.so
CROSS ?=
CARGO_TARGET ?=
CARGO_OUT = $(or $(CARGO_TARGET_DIR),target)/$(if $(CARGO_TARGET),$(CARGO_TARGET)/)release
# cargo's variable for the target's linker: CARGO_TARGET_<TRIPLE>_LINKER.
CARGO_LINKER = $(if $(CARGO_TARGET),CARGO_TARGET_$(shell echo '$(CARGO_TARGET)' | tr a-z- A-Z_)_LINKER=$(CROSS)gcc)

.PHONY: all build install test lint unit pytest demo setup setup-demo clean dist

all: build

build: $(EXT)
	$(MAKE) -C runtime PREFIX=$(PREFIX)

# The extension is a plain cdylib; no build frontend is needed to install it.
$(EXT): $(shell find core/src bindings/src -name '*.rs') core/Cargo.toml bindings/Cargo.toml Cargo.toml
	$(CARGO_LINKER) $(CARGO) build --release --locked -p hugify-python $(if $(CARGO_TARGET),--target $(CARGO_TARGET))
	install -m 0644 $(CARGO_OUT)/lib_core.so $(EXT)

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
	install -d $(DESTDIR)$(PERL5DIR)/Debian/Debhelper/Sequence $(DESTDIR)$(MANDIR)/man1
	install -m 0755 dh-hugify/dh_hugify dh-hugify/dh_hugify_check dh-hugify/dh_hugify_sign $(DESTDIR)$(BINDIR)/
	install -m 0644 dh-hugify/Debian/Debhelper/Sequence/hugify.pm $(DESTDIR)$(PERL5DIR)/Debian/Debhelper/Sequence/hugify.pm
	for c in dh_hugify dh_hugify_check dh_hugify_sign; do \
		pod2man --utf8 --section=1 --center=hugify --release='hugify $(VERSION)' dh-hugify/$$c > $(DESTDIR)$(MANDIR)/man1/$$c.1 || exit 1; \
	done
	$(HELP2MAN) --no-info --name='put the code of ELF programs and libraries on huge pages' --include=spec/hugify.h2m \
		--output=$(DESTDIR)$(MANDIR)/man1/hugify.1 'env PYTHONPATH=$(CURDIR) $(PYTHON) -m hugify.cli'
	$(HELP2MAN) --no-info --name='load a program and its libraries as huge pages, then run it' \
		--output=$(DESTDIR)$(MANDIR)/man1/hugify-run.1 runtime/hugify-run

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

# A source tarball of the last commit (what spec/hugify.spec builds from).
dist:
	mkdir -p dist
	git archive --format=tar.gz --prefix=hugify-$(VERSION)/ -o dist/hugify-$(VERSION).tar.gz HEAD

clean:
	$(CARGO) clean
	rm -f $(EXT)
