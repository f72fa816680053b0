//! The prefill writer's layout as the `layout` probe decodes its ring bytes: read by the
//! cache-path rules and, where only multi-chunk prefill rows fail, by the graph stage (later
//! chunks read what earlier chunks wrote in that layout).

use kvprobe_schema::Layout;

use super::facts::RingFacts;
use crate::affected;
use crate::diagnose::engine::Cause;
use crate::thresholds::*;

/// c. The prefill writer's ring bytes decode as another layout, for the majority or any ring.
pub(super) fn writer_layout(f: &RingFacts) -> Option<Cause> {
    let ly = f.layout.as_ref()?;
    let tm = f.token_major_score();
    let laid_out = affected::misplaced_layout(&ly.caches);
    let majority = ly.writer_layout != Layout::TokenMajor
        && ly.writer_score >= LAYOUT_CLEAN
        && ly.writer_score >= tm + LAYOUT_MARGIN;
    if !majority && laid_out.is_empty() {
        return None;
    }
    let mut layouts: Vec<&str> = ly
        .caches
        .iter()
        .filter(|c| laid_out.contains(&(c.layer, c.kind)))
        .map(|c| c.best_layout.name())
        .collect();
    layouts.sort_unstable();
    layouts.dedup();
    Some(Cause::new(0.9).line(format!(
        "→ cache-layout-mismatch: the prefill writer's ring bytes of {} decode as {} (majority {} at correlation {:.3} vs token-major {:.3}); HailoRT's ring needs token-major (contract §7.4)",
        affected::describe(&laid_out, ly.caches.len()),
        if layouts.is_empty() { ly.writer_layout.name().to_string() } else { layouts.join(" / ") },
        ly.writer_layout.name(),
        ly.writer_score,
        tm
    )))
}
