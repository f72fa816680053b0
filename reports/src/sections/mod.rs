//! The report sections, one module per probe, and the one list the report iterates: its order
//! is the order of the page, the CSV tables, the text summary and the artefact list.

mod capacity;
mod causality;
mod chat;
mod colmap;
mod determinism;
mod greedy;
mod inject;
mod kvdiff;
mod layout;
mod layout_infer;
mod maskconv;
mod positions;
mod prefill;
mod quant;
mod rerun;
mod selfmask;
mod splits;
mod stale;
mod stateful;
mod theta;
mod ztap;

use std::path::Path;

use kvprobe_schema::Results;

use crate::error::Result;
use crate::section::{Chart, ProbeBlock, ProbeSection};

/// Every section, in page order. A new probe's section is one line here.
pub static SECTIONS: &[&dyn ProbeSection] = &[
    &prefill::Prefill,
    &greedy::Greedy,
    &selfmask::Selfmask,
    &colmap::Colmap,
    &ztap::Ztap,
    &quant::Quant,
    &maskconv::Maskconv,
    &positions::Positions,
    &theta::Theta,
    &layout::LayoutSection,
    &layout_infer::LayoutInfer,
    &inject::Inject,
    &stale::Stale,
    &causality::Causality,
    &splits::Splits,
    &rerun::Rerun,
    &capacity::Capacity,
    &determinism::Determinism,
    &chat::Chat,
    &kvdiff::Kvdiff,
    &stateful::Overflow,
    &stateful::State,
    &stateful::NotApplicable,
];

/// The sections in artefact-list order: the ones listed last after the others.
fn in_file_order() -> impl Iterator<Item = &'static dyn ProbeSection> {
    let first = SECTIONS.iter().filter(|s| !s.files_listed_last());
    let last = SECTIONS.iter().filter(|s| s.files_listed_last());
    first.chain(last).copied()
}

/// (file name, contents) of every CSV table `results` has data for.
pub fn tables(r: &Results) -> Vec<(String, String)> {
    SECTIONS.iter().flat_map(|s| s.tables(r)).collect()
}

/// Every chart `results` has data for.
pub fn charts(r: &Results) -> Result<Vec<Chart>> {
    let mut out = Vec::new();
    for s in in_file_order() {
        out.extend(s.charts(r)?);
    }
    Ok(out)
}

/// File names of the arrays derived from `results` (for the report's artefact list).
pub fn array_files(r: &Results) -> Vec<String> {
    in_file_order().flat_map(|s| s.array_files(r)).collect()
}

pub fn write_arrays(r: &Results, dir: &Path) -> Result<()> {
    SECTIONS.iter().try_for_each(|s| s.write_arrays(r, dir))
}

/// File-name prefixes the sections' arrays use.
pub fn reserved_prefixes() -> Vec<&'static str> {
    SECTIONS
        .iter()
        .flat_map(|s| s.reserved_prefixes().iter().copied())
        .collect()
}

/// One block per section that has a finding, in page order.
pub fn blocks(r: &Results, charts: &[Chart]) -> Vec<ProbeBlock> {
    SECTIONS.iter().filter_map(|s| s.block(r, charts)).collect()
}

/// The summary lines of every probe that ran.
pub fn summaries(r: &Results) -> String {
    SECTIONS.iter().map(|s| s.summary(r)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::faulty_results;

    #[test]
    fn every_block_id_once_and_every_chart_shown() {
        let r = faulty_results();
        let charts = charts(&r).expect("charts render");
        let blocks = blocks(&r, &charts);
        let mut ids: Vec<&str> = blocks.iter().map(|b| b.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), blocks.len(), "two sections share an id");
        let page: String = blocks.iter().map(|b| b.chart.as_str()).collect();
        let figures = page.matches("<figure class=\"chart\">").count();
        assert_eq!(figures, charts.len(), "a chart is drawn but not shown");
    }
}
