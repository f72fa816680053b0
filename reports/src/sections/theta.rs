//! The theta check (run with `positions`, its own section): single-chunk prefill rows with the
//! shipped RoPE theta table and with it in the other sign convention.

use kvprobe_schema::Results;

use crate::html::kv_table;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, num};

pub struct Theta;

impl ProbeSection for Theta {
    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let t = r.probes.theta.as_ref()?;
        Some(ProbeBlock {
            id: "theta",
            title: "RoPE theta sign convention on single-chunk prefill rows",
            summary: kv_table(&[
                ("shipped theta table", html(&t.declared)),
                ("cosine with the shipped table", num(t.declared_cosine, 4)),
                (
                    "cosine with the other sign convention",
                    num(t.other_cosine, 4),
                ),
                ("single-chunk rows", t.rows.to_string()),
            ]),
            chart: String::new(),
            detail: String::new(),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(t) = &r.probes.theta else {
            return String::new();
        };
        format!(
            "theta: table {} → single-chunk prefill cosine {:.4}; the other sign convention {:.4} ({} rows)\n",
            t.declared, t.declared_cosine, t.other_cosine, t.rows
        )
    }
}
