//! The address map of a plan: which link-time addresses move, and where to. Every
//! writer that repairs a moved address asks it ([`AddrMap::map`]); the planner
//! ([`crate::plan`]) makes it, and nothing else of the planner is needed to apply it.

/// The address map `f(a) = a + dv` for `start <= a <= end`, identity elsewhere, and
/// the loader's notes relocated inside what stays ([`Relocated`]).
/// The upper bound is inclusive so one-past-the-end values (`_end`, range ends) move.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddrMap {
    /// First address that moves.
    pub start: u64,
    /// Last address (inclusive) that moves: one past the end of the image.
    pub end: u64,
    /// The virtual displacement.
    pub dv: u64,
    /// Sections that stay in front of the split point but move within it.
    pub relocated: Relocated,
}

/// Sections right after the program header table (`.interp`, the notes) that a shift
/// moves behind the last section that stays, so that a table that grows keeps its
/// place at `e_phoff`: the tools that rewrite files through elfutils' libelf (dwz,
/// eu-strip) write only what sections cover and the table the ELF header points at,
/// and zero a table that lies in a gap between sections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Relocated {
    /// First address of the relocated sections.
    pub from: u64,
    /// One past their last address (exclusive: the section after them stays).
    pub to: u64,
    /// Their displacement, in addresses and in file offsets alike (both grow).
    pub delta: u64,
}

impl Relocated {
    /// Whether `a` lies in the relocated range.
    pub fn holds(&self, a: u64) -> bool {
        a >= self.from && a < self.to
    }
}

impl AddrMap {
    /// The map of a shift by `dv` of `start..=end`, nothing relocated.
    pub const fn shift(start: u64, end: u64, dv: u64) -> AddrMap {
        AddrMap { start, end, dv, relocated: Relocated { from: 0, to: 0, delta: 0 } }
    }
    /// Whether `a` lies in the moved range.
    pub fn moves(&self, a: u64) -> bool {
        self.dv != 0 && ((a >= self.start && a <= self.end) || self.relocated.holds(a))
    }
    /// The new value of address `a`.
    pub fn map(&self, a: u64) -> u64 {
        if !self.moves(a) {
            a
        } else if self.relocated.holds(a) {
            a + self.relocated.delta
        } else {
            a + self.dv
        }
    }
}
