//! Repairs: one module per structure that holds a link-time address. Each adds
//! in-place edits (keyed by input file offset) for the values the plan moves.

mod build_attributes;
mod dynamic;
mod eh_frame;
mod notes;
mod relocs;
mod symbols;

use crate::elf::Elf;
use crate::error::Result;
use crate::layout::Analysis;
use crate::patch::Patches;
use crate::plan::Plan;
pub(crate) use build_attributes::check as check_build_attributes;
pub use notes::BUILD_ID_FLIP;

/// What every repair reads.
pub struct Ctx<'a, 'e> {
    /// The input.
    pub elf: &'a Elf<'e>,
    /// Its layout.
    pub an: &'a Analysis,
    /// The plan being carried out.
    pub plan: &'a Plan,
}

/// Collects the edits of every repair.
pub fn collect(ctx: &Ctx) -> Result<Patches> {
    let mut p = Patches::default();
    notes::repair(ctx, &mut p)?;
    if ctx.plan.map.dv != 0 {
        dynamic::repair(ctx, &mut p)?;
        symbols::repair(ctx, &mut p)?;
        relocs::repair(ctx, &mut p)?;
        eh_frame::repair(ctx, &mut p)?;
        build_attributes::repair(ctx, &mut p)?;
    }
    Ok(p)
}
