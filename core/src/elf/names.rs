//! The section names the core looks for or writes, in one place; DWARF's are the
//! tables of dwarf/sections.rs.

/// Trap padding the rewriter appends: the bytes of the code's windows that no input
/// section holds ([`crate::exposure`] counts them as traps, the self-check requires it).
pub const PAD_SECTION: &str = ".hugify.pad";
/// The program interpreter's path: loader metadata that stays, though not of a
/// metadata section type.
pub const INTERP: &str = ".interp";
/// Call-frame information.
pub const EH_FRAME: &str = ".eh_frame";
/// The binary-search table over [`EH_FRAME`].
pub const EH_FRAME_HDR: &str = ".eh_frame_hdr";
/// The GOT, at whose start aarch64 keeps `_DYNAMIC`'s address (x86: at DT_PLTGOT).
pub const GOT: &str = ".got";
/// annobin's notes, which hold address ranges.
pub const BUILD_ATTRIBUTES: &str = ".gnu.build.attributes";
/// gold's note: gold made the file.
pub const GOLD_VERSION_NOTE: &str = ".note.gnu.gold-version";
/// Comments, where lld's "Linker:" line names the linker.
pub const COMMENT: &str = ".comment";
/// MiniDebugInfo: a compressed symbol table whose addresses the core cannot repair.
pub const GNU_DEBUGDATA: &str = ".gnu_debugdata";
/// stabs debug info, whose addresses the core cannot repair either.
pub const STAB: &str = ".stab";
