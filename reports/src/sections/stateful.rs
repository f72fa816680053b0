//! Sections of a stateful device's diagnosis (issue 9): overflow, state checks, and the probes
//! that do not apply, each with its reason.

use kvprobe_schema::Results;

use crate::html::{kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

fn opt(v: Option<usize>) -> String {
    v.map_or("—".to_string(), |x| x.to_string())
}

pub struct Overflow;

impl ProbeSection for Overflow {
    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.overflow.as_ref()?;
        Some(ProbeBlock {
            id: "overflow",
            title: "Overflow: where inf/NaN first appears (fp16 states after the prefill)",
            summary: kv_table(&[
                ("prompt tokens", f.prompt_len.to_string()),
                ("first non-finite layer", opt(f.layer)),
                ("first non-finite position", opt(f.position)),
                ("logits finite", f.logits_finite.to_string()),
            ]),
            chart: String::new(),
            detail: String::new(),
        })
    }
}

pub struct State;

impl ProbeSection for State {
    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.state.as_ref()?;
        let c = |v: Option<f64>| v.map_or("—".to_string(), |x| num(x, 4));
        let (doc, swapped) = match f.layout_cosines {
            Some([a, b]) => (Some(a), Some(b)),
            None => (None, None),
        };
        Some(ProbeBlock {
            id: "state",
            title: "State checks: slots written, state layout, mask",
            summary: kv_table(&[
                ("prompt tokens", f.prompt_len.to_string()),
                (
                    "positions written",
                    f.written
                        .iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                ("reference K/V as [kv_heads, ctx, d]", c(doc)),
                ("reference K/V as [ctx, kv_heads, d]", c(swapped)),
                ("self-only step vs token alone", c(f.selfonly_cosine)),
                ("full-context step", c(f.full_cosine)),
            ]),
            chart: String::new(),
            detail: String::new(),
        })
    }
}

pub struct NotApplicable;

impl ProbeSection for NotApplicable {
    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let p = &r.probes;
        if p.not_applicable.is_empty() {
            return None;
        }
        let rows: Vec<_> = p
            .not_applicable
            .iter()
            .map(|n| (vec![n.probe.clone(), n.why.clone()], None))
            .collect();
        Some(ProbeBlock {
            id: "not-applicable",
            title: "Probes that do not apply to this device",
            summary: String::new(),
            chart: String::new(),
            detail: table(&["probe", "why"], &rows),
        })
    }
}
