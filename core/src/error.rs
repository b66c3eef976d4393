//! The error model: every failure carries a stable reason id, a kind that decides
//! the exit status, and a one-line detail naming where the problem is.
//!
//! The table below is the one registry of reason ids: the rewriter's own, and those
//! the Python layers decide (policy, I/O, the runtime's), so that `hugify explain`
//! knows every id any hugify command, brp-hugify or dh_hugify prints.

use std::fmt;

/// What kind of failure this is; the CLI maps each kind to its own exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The input is malformed: truncated, inconsistent, not ELF.
    Invalid,
    /// The input is valid but hugify will not (or cannot safely) transform it.
    Refused,
    /// Reading or writing a file failed.
    Io,
    /// The file, or its place in the directory tree, cannot be handled safely by a
    /// process that may run as root where others can write: not a regular file, a
    /// symbolic link, hard links outside the tree, or swapped while hugify worked.
    Unsafe,
    /// A bug in hugify: a broken invariant or a failed self-check.
    Internal,
    /// `hugify try`: the command behaved differently on the hugified files.
    Differs,
    /// `hugify try`: the method cannot measure the command here.
    Unmeasured,
    /// Not a failure: something a report notes.
    Info,
}

impl Kind {
    /// The name reports and `hugify explain` use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Invalid => "invalid",
            Kind::Refused => "refused",
            Kind::Io => "io",
            Kind::Unsafe => "unsafe",
            Kind::Internal => "internal",
            Kind::Differs => "differs",
            Kind::Unmeasured => "unmeasured",
            Kind::Info => "info",
        }
    }
}

macro_rules! reasons {
    ($($variant:ident => ($kind:ident, $id:literal, $summary:literal),)*) => {
        /// Why a file was not transformed.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Reason {
            $(#[doc = $summary] $variant,)*
        }

        impl Reason {
            /// Every reason, in documentation order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The stable, kebab-case identifier.
            pub fn id(self) -> &'static str {
                match self { $(Reason::$variant => $id,)* }
            }

            /// Which exit-status class this reason belongs to.
            pub fn kind(self) -> Kind {
                match self { $(Reason::$variant => Kind::$kind,)* }
            }

            /// One sentence saying what the reason means.
            pub fn summary(self) -> &'static str {
                match self { $(Reason::$variant => $summary,)* }
            }
        }
    };
}

reasons! {
    NotElf => (Invalid, "not-elf", "The file does not start with the ELF magic bytes."),
    Truncated => (Invalid, "truncated", "A header, table or section extends beyond the end of the file."),
    BadHeader => (Invalid, "bad-header", "The ELF header has an impossible value (class, version or entry sizes)."),
    BadSegments => (Invalid, "bad-segments", "The program headers are inconsistent (overlapping, unordered, misaligned or outside the file)."),
    BadSections => (Invalid, "bad-sections", "The section headers are inconsistent with each other or with the segments."),
    BadDynamic => (Invalid, "bad-dynamic", "The dynamic section is malformed."),
    BadSymbols => (Invalid, "bad-symbols", "A symbol table is malformed."),
    BadRelocations => (Invalid, "bad-relocations", "A relocation table is malformed or points outside the file's segments."),
    BadNotes => (Invalid, "bad-notes", "A note section is malformed."),
    BadEhFrame => (Invalid, "bad-eh-frame", "The .eh_frame or .eh_frame_hdr section is malformed."),
    BadDwarf => (Invalid, "bad-dwarf", "A DWARF debug section is malformed or truncated."),
    UnsupportedFormat => (Refused, "unsupported-format", "The ELF class, byte order or machine is not one hugify rewrites."),
    UnsupportedType => (Refused, "unsupported-type", "Only executables and shared objects (ET_DYN, or ET_EXEC for alignment-only) are rewritten."),
    NoSectionHeaders => (Refused, "no-section-headers", "Without section headers the split point and the address-bearing structures cannot be found."),
    NoExecSegment => (Refused, "no-exec-segment", "The file has no executable PT_LOAD segment."),
    MultipleExecSegments => (Refused, "multiple-exec-segments", "The file has more than one executable PT_LOAD segment."),
    BelowThreshold => (Refused, "below-threshold", "The executable segment is smaller than the threshold, so huge pages would not pay for the padding."),
    AlreadyAligned => (Refused, "already-aligned", "The executable segment is already huge-page aligned (for example, already transformed)."),
    EhdrReference => (Refused, "ehdr-reference", "Code refers to the ELF header or other loader metadata (e.g. __ehdr_start), which a shift would break."),
    UndecodableCode => (Refused, "undecodable-code", "Bytes inside a function's bounds are no instruction (data among the code, or an instruction cut at the function's end), so a reference to what a shift leaves in place cannot be ruled out."),
    NoGain => (Refused, "no-gain", "No plan would put any code into a whole huge-page window without making bytes executable that were not (read-only data next to the code; the policy's exposure_limit allows none by default)."),
    UnsupportedLayout => (Refused, "unsupported-layout", "The segment and section layout is not one the planner can prove safe to rewrite."),
    TrailingData => (Refused, "trailing-data", "The file carries data after its last section (an overlay) whose position might be relied upon."),
    UnsupportedSection => (Refused, "unsupported-section", "The file has a section with addresses hugify does not know how to repair."),
    UnsupportedRelocation => (Refused, "unsupported-relocation", "A dynamic relocation type or encoding hugify does not know how to repair."),
    UnsupportedDwarf => (Refused, "unsupported-dwarf", "Debug information uses a DWARF version, form or opcode hugify cannot classify."),
    Excluded => (Refused, "excluded", "The policy's exclude globs or an --exclude-regex exclude the file."),
    Stripped => (Refused, "stripped", "The file has no symbol table and the policy refuses stripped files (refuse_stripped), since references to the ELF header cannot be ruled out by name."),
    ForeignArch => (Refused, "foreign-arch", "The file is built for another architecture than the package."),
    UnsupportedArch => (Refused, "unsupported-arch", "hugify has no name for the file's architecture, or the policy sets no huge-page size for it."),
    NotAligned => (Refused, "not-aligned", "With --manifest-only: the file has no whole huge-page window at an offset congruent to its address, so it is not listed."),
    NotHugified => (Invalid, "not-hugified", "A file a manifest lists has no whole huge-page window at an offset congruent to its address (not hugified, or replaced since)."),
    IoError => (Io, "io-error", "Reading or writing the file failed; the message gives the system's error."),
    NotRegular => (Unsafe, "not-regular", "The path is a FIFO, device node, socket or directory, not a regular file. hugify looks at it without opening it (a FIFO would block, opening a device can act on the hardware) and leaves it alone."),
    Symlink => (Unsafe, "symlink", "The file, or the directory it is in, is a symbolic link (or one leads out of the tree or package). Where hugify reads a file to replace it or writes one, it never follows a symlink: another user who can write that directory could point it at any file. Name the real path (realpath FILE)."),
    OutsideLinks => (Unsafe, "outside-links", "The file has hard links outside the tree being rewritten: replacing the names inside would part them from the names outside, which would keep the old file, so it is left as it is."),
    ChangedMeanwhile => (Unsafe, "changed-meanwhile", "The file's directory entry, or hugify's temporary file beside it, was replaced, removed or swapped (for a symlink or another file) while hugify worked on it; nothing was renamed into place, no file outside was touched, and the temporary file is gone."),
    Missing => (Io, "missing", "A file a manifest lists is not installed."),
    NotAPackage => (Invalid, "not-a-package", "hugify repack, hugify sign-packages: the input is not a .deb or .rpm package, or it is truncated or corrupt."),
    BadPolicy => (Invalid, "bad-policy", "hugify repack: the policy is not usable (for a package: its [packages.NAME] table)."),
    NoElfFile => (Refused, "no-elf-file", "hugify repack: the package holds no ELF executable or shared object, so repacking it would change nothing."),
    AllRefused => (Refused, "all-refused", "hugify repack: every ELF file of the package was skipped or failed, so repacking it would change nothing."),
    AlreadyRepacked => (Refused, "already-repacked", "hugify repack: the package is the output of hugify repack already."),
    FilesFailed => (Refused, "files-failed", "hugify repack: ELF files of the package failed and the policy says on_error = \"fail\"."),
    DebugWithoutMain => (Refused, "debug-without-main", "hugify repack: a debug package (-dbgsym, -debuginfo) was given without the package whose files it describes."),
    DebugMismatch => (Refused, "debug-mismatch", "hugify repack: a separate debug file does not match its stripped file, or did not get the same plan."),
    UnsupportedMetadata => (Refused, "unsupported-metadata", "hugify repack: the package carries metadata a rebuilt package could not keep; the message names it (an rpm header tag repack does not carry, such as file triggers, relocations or per-file signatures)."),
    SuffixNotHigher => (Invalid, "suffix-not-higher", "hugify repack, hugify derive-source: the --suffix gives a version that does not sort above the original's (by dpkg's or rpm's own comparison), so the package manager would not take the repacked package, or the derived source's, as an upgrade."),
    ToolFailed => (Io, "tool-failed", "hugify repack, hugify derive-source: a packaging tool (dpkg-deb, rpm, rpmbuild, eu-unstrip, objcopy; dpkg-source) failed or is not installed."),
    BadChanges => (Invalid, "bad-changes", "hugify sign-packages: the .changes file is not one: no Checksums-Sha256 field, a line that is no field, or a file name with a directory in it."),
    ChangesMismatch => (Invalid, "changes-mismatch", "hugify sign-packages: a file the .changes lists is missing, or its size or SHA-256 differs from what the .changes says."),
    StatementMissing => (Refused, "statement-missing", "hugify sign-packages: the packages given hold hugified files, but none carries hugify's statement of what it changed (built without dh_hugify_sign, or an rpm spec without %{?hugify_attestation}), so there is nothing to sign."),
    StatementMismatch => (Invalid, "statement-mismatch", "hugify sign-packages: a package's statement does not describe the packages given: a file it lists is in none of them, has other bytes or is not hugified by its program headers, or the statement names another package or architecture."),
    LayoutUndone => (Invalid, "layout-undone", "hugify check: a file the build hugified no longer has its code on the whole huge-page windows its manifest entry or the tree report names: a tool after hugify rewrote its program headers or moved its code (patchelf, or dwz and eu-strip on a displaced program header table)."),
    ManifestStale => (Invalid, "manifest-stale", "hugify check: a runtime manifest does not describe the file that ships (another build-id, another span, a file it lists is not there), or a file the build hugified is missing from it."),
    DebugFileMismatch => (Invalid, "debug-file-mismatch", "hugify check: no separate debug file of the build (-dbgsym, -debuginfo) carries the build-id of a hugified file that ships, so debuggers would not find its symbols."),
    ExposureOverLimit => (Invalid, "exposure-over-limit", "hugify check: the build report or statement records more bytes made executable for a file than the policy's exposure_limit allows for its package."),
    StatementStale => (Invalid, "statement-stale", "hugify check: hugify's statement of what it changed names a file with other bytes or another build-id than the one that ships, or a file that is not there."),
    // hugify derive-source: the +hugifyN source a distribution derives.
    NotASource => (Invalid, "not-a-source", "hugify derive-source: the input is not a Debian source package's .dsc (not UTF-8 text of fields, or no Format, Source, Version or Checksums-Sha256 field), or the source it unpacks to has no debian/control with a source stanza, or a debian/changelog dpkg-parsechangelog cannot read."),
    UnsupportedSourceFormat => (Refused, "unsupported-source-format", "hugify derive-source: the .dsc's Format is not one dpkg-source rebuilds as it was (1.0, 3.0 (quilt), 3.0 (native)): a version-control format such as 3.0 (git) or 3.0 (bzr), or one this dpkg does not know."),
    SourceCorrupt => (Invalid, "source-corrupt", "hugify derive-source: a file the .dsc lists is missing, or has another size or checksum than the .dsc says, or dpkg-source cannot unpack it: an incomplete or damaged download, or files of another upload mixed in; the message gives dpkg-source's words."),
    NoDhSequence => (Refused, "no-dh-sequence", "hugify derive-source: debian/rules runs no dh sequence (hand-written targets calling dh_* commands one by one, or CDBS), and only dh's sequencer loads the add-on a Build-Depends on dh-sequence-hugify names; such a package turns hugify on by calling dh_hugify (after dh_install, before dh_dwz and dh_strip), dh_hugify_check and dh_hugify_sign (after dh_strip) in its own rules."),
    SigningFailed => (Io, "signing-failed", "hugify sign-packages: cosign could not sign (no key configured, a wrong password, an unreachable KMS, cosign missing)."),
    // The command line's own cases (issue 42), one block: a file already placed but with
    // no whole window, a path of the wrong type, a package built with hugify.
    NoWholeWindow => (Refused, "no-whole-window", "The executable segment already sits at an address congruent to its file offset modulo the huge-page size (a non-PIE executable at its fixed address, or a file linked with huge-page alignment), but its code spans no whole huge-page window, so none of it can be a huge page; hugify leaves such a file alone (Debian 12's python3.11 is one)."),
    WrongFileType => (Invalid, "wrong-file-type", "A path given to hugify is not the kind of file the command reads: a directory, device node, FIFO or socket where a regular file is wanted (hugify did not open it), or a file where a directory (a build root) is wanted."),
    AlreadyHugified => (Refused, "already-hugified", "hugify repack: the package was built with hugify (or its code is placed so already): no ELF file of it would change, and it ships hugify's manifest already (an rpm needs none: hugify's file triggers list its files at installation), so the repacked package would be a no-op upgrade. hugify derive-source: the source turns hugify on already (dh-sequence-hugify among its build dependencies, dh --with hugify or dh_hugify in its rules)."),
    HugePageMismatch => (Refused, "huge-page-mismatch", "The file is aligned to another huge-page size than this system's PMD huge page."),
    Hardlink => (Info, "hardlink", "Another name of a file already handled: its inode is prefetched once."),
    SignedFile => (Refused, "signed-file", "The file carries an IMA or EVM signature (security.ima, security.evm) that rewriting would make stale; drop it only on purpose (--drop-stale-signatures, ima_signatures = \"drop\")."),
    LiveRoot => (Refused, "live-root", "The tree given is the running system's root, not a package build root; pass --allow-live-root to rewrite it in place on purpose."),
    NoEngine => (Refused, "no-engine", "hugify prefetch and status need the C runtime's libhugify-engine.so (hugify try also its audit and record libraries), which this installation lacks (a pip-installed hugify carries only the CLI)."),
    Loader => (Info, "loader", "A window stays busy: it is ld.so's own running code, which the runtime never drops from the page tables."),
    NotEvicted => (Info, "not-evicted", "A window stays busy: small pages of it could not be evicted (mapped by a process, dirty or locked); the timer retries."),
    MemoryFs => (Info, "memory-fs", "A window is unsupported: its file is on tmpfs, ramfs or hugetlbfs, which keep pages only in memory (huge pages follow the huge= mount option)."),
    NoLargeFolios => (Info, "no-large-folios", "A window is unsupported: its filesystem gives no large folios on this kernel. Two of its files were read in again as small folios by one process, each read its own (nothing of the window cached at the fault, the whole window read by its thread) with nothing in its way (room for a 2 MiB folio before and after, room in its memory cgroup, a 2 MiB page of its own granted, MADV_HUGEPAGE accepted), or root's record of this boot says so; nothing is read or evicted for it until a window of it is seen in a 2 MiB folio, which drops the record (`hugify prefetch --clear-records` drops it too)."),
    FileNoLargeFolios => (Info, "file-no-large-folios", "A window is unsupported: its file was read in again as small folios by the process's own read (nothing of the window cached at the fault, the whole window read by its thread; twice, the window evicted in between, where root records it for the boot) with nothing in its way (room for a 2 MiB folio before and after, room in its memory cgroup, a 2 MiB page of its own granted, MADV_HUGEPAGE accepted). A second file of the same filesystem doing the same makes it the filesystem's verdict; ext4 decides per file from Linux 6.16 (files with data journalling, chattr +j, get none)."),
    KernelVersion => (Info, "kernel-version", "A window is unsupported: no record of this boot says otherwise, and this kernel's version says its filesystem gives no large folios (ext4 before Linux 6.16, btrfs); a process that cannot keep records (not root, or no runtime directory of root's it can write: a chroot or container without /run, /run read-only) takes this instead of evicting and reading a window at every start to find out. A window seen in a 2 MiB folio overrides it."),
    CgroupLimit => (Info, "cgroup-limit", "A window failed: read in again as small folios while the process's memory cgroup (or one above it) was within 8 MiB of its limit; nothing is concluded or recorded about the filesystem."),
    NoHugePage => (Info, "no-huge-page", "A window failed: read in again as small folios, and a 2 MiB anonymous page the process asked for itself came small too (a memory policy, a cpuset, zone watermarks); nothing is concluded or recorded about the filesystem."),
    NotOwner => (Info, "not-owner", "A window stays small: the kernel tells which pages of a file are cached only to its owner, root or a writer, so another user's process cannot make sure an eviction worked; it evicts a window only where it saw a window of the same filesystem in a 2 MiB folio (elsewhere it could read the window again at every start). The boot service and its timer, as root, repair it for every process."),
    MadviseRefused => (Info, "madvise-refused", "A window stays cold or small: the kernel refused MADV_HUGEPAGE to the process (e.g. a seccomp filter), so no read could give a 2 MiB folio; nothing is read, evicted, concluded or recorded."),
    Fragmented => (Info, "fragmented", "A window failed: read in as small folios with no free 2 MiB block of memory the page cache could take without reclaim or compaction (memory fragmented, or free memory down to the zones' min watermarks, /proc/zoneinfo); a later prefetch may succeed."),
    ReadMeanwhile => (Info, "read-meanwhile", "A window stays busy: evicted and read in again, it came as small folios, but this process did not read it whole (its thread's I/O accounting read less than the window): another process read pages of it in between the eviction and the fault (even one page keeps the 2 MiB folio out), or reads of its own were still in flight. Nothing is concluded or recorded about the file or its filesystem; the timer retries."),
    NoFile => (Info, "no-file", "A window failed or stays cold: the runtime could not open the file behind the mapping."),
    ThpOff => (Info, "thp-off", "A window stays cold or small: transparent huge pages are off (for the system, or for the process by prctl)."),
    Budget => (Info, "budget", "A window stays cold or small: the boot's prefetch has read as much code as the policy's runtime.boot_budget allows; the timer's next run, or a program started through hugify-run or the audit library, loads it."),
    BeyondEof => (Info, "beyond-eof", "A window stays cold: it ends beyond the end of the file (the file was truncated since it was mapped)."),
    NoNamespace => (Refused, "no-namespace", "hugify try: the system does not let this user make a private mount namespace (unprivileged user namespaces disabled by a sysctl, restricted by AppArmor, or forbidden in a container); the message names the setting. Run it as root, or allow user namespaces."),
    SetuidProgram => (Refused, "setuid-program", "hugify try: the command's program is setuid, setgid or has file capabilities; its privileges would not survive a private user namespace, nor a copy, so it is not measured."),
    NothingToTry => (Refused, "nothing-to-try", "hugify try: nothing the command loads can be put on huge pages here: no object has code over the policy's threshold or none of those could be hugified, or transparent huge pages are off; the message says which."),
    CommandFailed => (Invalid, "command-failed", "hugify try: the command cannot be found, or fails (a non-zero exit status) on the original files; nothing is measured. The message gives its status and the last line it wrote to standard error."),
    NotDeterministic => (Invalid, "not-deterministic", "hugify try: two runs of the command on the original files differ in exit status, standard output or a --compare-files file, so the hugified files' behaviour cannot be compared; make the output repeatable (or compare only what is)."),
    FilesChanged => (Invalid, "files-changed", "hugify try: a file under test changed while the comparison ran (the command rebuilds a program it also runs, or a package was upgraded), so its hugified copy no longer matches it."),
    BehaviourDiffers => (Differs, "behaviour-differs", "hugify try: the command behaved differently on the hugified files than on the originals (exit status, standard output or a --compare-files file): a program that depends on its code's addresses or layout, or a bug; the message says where the outputs part."),
    TryShared => (Refused, "try-shared", "hugify try: the hugified side cannot map its code from root's shared copies (--way shared): only root makes them (run it as root, or use --way anonymous), or their tmpfs cannot be mounted, or shared-memory huge pages are refused (transparent_hugepage/shmem_enabled deny); the message says which."),
    TryCache => (Io, "try-cache", "hugify try: its cache of hugified copies cannot be written (read-only, full, not permitted, or on a noexec mount); the message names the directory. --cache-dir picks another."),
    TryCacheUnsafe => (Unsafe, "try-cache-unsafe", "hugify try: its cache of hugified copies, or a directory on the way to it, could be changed by another user (owned by another user, or writable by group or others; a directory above it may be root's, and writable by others only if sticky, as /tmp); the copies it holds run in place of the command's files, so nothing is written or run. The message names the directory. --cache-dir picks one of the caller's own."),
    TooShort => (Unmeasured, "too-short", "hugify try: the command takes too little CPU time on the original files to be measured: a run of it is mostly the start and exit of its processes, where the sides differ by how their files are cached rather than by code on huge pages, and the watcher sees few of its runs. Measure a longer command."),
    RunsUnseen => (Unmeasured, "runs-unseen", "hugify try: the watcher saw fewer than half of the hugified side's runs use its copies (their processes live too briefly to be watched, or load none of them), so what they ran on cannot be told and no answer is given."),
    ControlFailed => (Unmeasured, "control-failed", "hugify try: the A/A control (--control) has an interval that excludes no change, where nothing differs but the files' inodes (how the files are cached, where their pages lie): on this machine, results of that size for this command are not evidence."),
    Replaced => (Info, "replaced", "A window stays as the process mapped it: the file now at the object's path is not the inode the process mapped (another version renamed over it since it was loaded, e.g. by a package upgrade), or that could not be proven; nothing of the other file is mapped in or copied."),
    NotMapped => (Info, "not-mapped", "A window stays as it is, cold or small, untouched: the process does not map it from the object's file at the window's offset (another load of a malformed object overlaps it)."),
    NoCopy => (Info, "no-copy", "A window stays on its file mapping: root keeps no shared copy of the inode the process maps (none made yet, not wanted because file-backed huge pages work, beyond the budget, or the file was replaced since, e.g. by a package upgrade)."),
    CopyUntrusted => (Info, "copy-untrusted", "A shared copy is not used: the runtime directory, the copies' tmpfs, the copy's directory, its record or the copy is not root's alone (owned by root, not writable by group or others), is a link, or not on tmpfs."),
    CopyStale => (Info, "copy-stale", "A shared copy is not used: the original's size or times differ from those recorded with the copy (it was written since it was copied); root's next prefetch makes a new one. In hugify try, no shared copy is made of a hugified copy whose program is no longer the file whose bytes were copied (another file renamed over its path, or it was written or its permissions changed since)."),
    CopyChanged => (Info, "copy-changed", "A shared copy is not used: it is not the inode root sealed, or was written since (its change time differs from the record's)."),
    ShmemNotHuge => (Info, "shmem-not-huge", "A shared copy's window is not one huge page: the kernel refused shared-memory huge pages (transparent_hugepage/shmem_enabled deny, a tmpfs without huge=within_size) or split it; the window stays on its file mapping."),
    SharedFull => (Info, "shared-full", "No shared copy: the tmpfs of the shared copies is full (its size= is below the policy's runtime.shared_budget: systemctl daemon-reload && systemctl reload run-hugify-shared.mount resizes it; or another writer filled it)."),
    SharedBudget => (Info, "shared-budget", "No shared copy: the copies the store holds already hold as much as the policy's runtime.shared_budget allows: those of files before it in the boot's order, those of files the run did not see, and copies removed while processes still map them (until those exit)."),
    SharedUnavailable => (Info, "shared-unavailable", "No shared copies: their tmpfs is not mounted and cannot be (no CAP_SYS_ADMIN: the boot service relies on run-hugify-shared.mount), is not root's alone, gives no huge pages (mounted without huge=within_size), or has no size= (it then counts none of the memory it holds, which the budget is kept with)."),
    CopyPrivate => (Info, "copy-private", "No shared copy: some user may not read the file, or list a directory of its path (its mode, a POSIX ACL entry, an ACL hugify does not read, or a security label such as SELinux's), while its copy and record would show its bytes and path to every user; or that changed while it was copied. The message says what denies whom."),
    Traced => (Info, "traced", "A window of the program stays on its file mapping: a debugger is attached and may have written breakpoints into it, which mapping a shared copy over it would drop."),
    SelfCheck => (Internal, "self-check", "The rewritten file failed hugify's own consistency check; nothing was written."),
    Internal => (Internal, "internal", "An internal error (a bug in hugify)."),
}

/// A failure with its reason and a one-line detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The stable reason.
    pub reason: Reason,
    /// Where and what, in one line.
    pub detail: String,
}

impl Error {
    /// Builds an error.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Error {
        Error { reason, detail: detail.into() }
    }

    /// The kind of the reason.
    pub fn kind(&self) -> Kind {
        self.reason.kind()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.detail, self.reason.id())
    }
}

impl std::error::Error for Error {}

/// Result alias used throughout the core.
pub type Result<T> = std::result::Result<T, Error>;
