//! The compact text summary a run prints: the verdict and its evidence, or the summary lines of
//! the probe that ran, then the warnings.

use kvprobe_schema::Results;

use crate::text::shell_join;

use crate::sections;

pub fn text(r: &Results) -> String {
    let mut s = String::new();
    match r.verdict {
        Some(v) => {
            s += &format!(
                "verdict: {} (confidence {:.2})\n",
                v.name(),
                r.confidence.unwrap_or(0.0)
            );
            let head = Head::of(r);
            if let Some(rule) = &head.rule {
                s += &format!("cause: rule `{rule}`\n");
            }
            for d in &head.decisive {
                s += &format!("  decisive: {d}\n");
            }
            if let Some(c) = &head.command {
                s += &format!("reproducer: {c}\n");
            }
            if let Some(l) = &head.replay {
                s += &format!("  {l}\n");
            }
            if !r.also.is_empty() {
                let also: Vec<&str> = r.also.iter().map(|v| v.name()).collect();
                s += &format!("also: {}\n", also.join(", "));
            }
            if let Some(st) = r.stage {
                s += &format!("stage (stale, causality, splits): {}\n", st.name());
            }
            for e in &r.evidence {
                s += &format!("  - {e}\n");
            }
        }
        // a diagnosis the device ended: what ran before the failure, marked partial
        None if r.incomplete.is_some() => {
            s += "verdict: incomplete (partial results: the device failed before a verdict)\n";
            for e in &r.evidence {
                s += &format!("  - {e}\n");
            }
        }
        // the probes' own lines only for a single probe: a verdict's evidence already says it
        None => s += &sections::summaries(r),
    }
    for w in &r.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}

/// Decisive lines shown at the head of a verdict (the rule's first ones; the rest stay in the
/// evidence).
const DECISIVE_LINES: usize = 2;

/// What every output opens a verdict with (issue 34): the rule that named the cause, its
/// decisive evidence, the reproducer command and how close its replay came. The controls follow.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Head {
    pub rule: Option<String>,
    pub decisive: Vec<String>,
    pub command: Option<String>,
    pub replay: Option<String>,
}

impl Head {
    pub(crate) fn of(r: &Results) -> Head {
        let mut h = Head::default();
        if let Some(hyp) = &r.hypothesis {
            h.rule = Some(hyp.rule.clone());
            h.decisive = hyp.decisive.iter().take(DECISIVE_LINES).cloned().collect();
        }
        if let Some(rep) = &r.reproducer {
            // a HEF's reproducer first writes the emulator's description (`inspect --emit-sim`)
            h.command = (!rep.command.is_empty()).then(|| {
                if rep.setup.is_empty() {
                    shell_join(&rep.command)
                } else {
                    format!("{} && {}", shell_join(&rep.setup), shell_join(&rep.command))
                }
            });
            h.replay = Some(rep.line());
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use crate::fixtures::{faulty_results, healthy_results};

    /// Where `needle` first occurs in `hay` (the test fails when it does not).
    fn at(hay: &str, needle: &str) -> usize {
        hay.find(needle)
            .unwrap_or_else(|| panic!("`{needle}` missing from:\n{hay}"))
    }

    #[test]
    fn every_output_opens_with_cause_decisive_lines_and_reproducer_before_the_controls() {
        let r = faulty_results();
        let text = super::text(&r);
        let md = crate::markdown::summary(&r);
        let page = crate::html::page::report(&r, &[]);
        for (name, out, evidence) in [
            ("stdout", &text, "greedy: tbt mean cosine 0.45"),
            ("summary.md", &md, "greedy: tbt mean cosine 0.45"),
            ("report.html", &page, "greedy: tbt mean cosine 0.45"),
        ] {
            let verdict = at(out, "cache-layout-mismatch");
            let rule = at(out, "reader-layout-repair");
            let decisive = at(out, "golden rings read feature-major");
            let command = at(out, "tbt-read-layout=feature-major@k --steps 4");
            let replay = at(out, "median miss 0.00e0");
            let controls = at(out, evidence);
            assert!(
                verdict < rule && rule < decisive && decisive < command && command < controls,
                "{name}: {verdict} {rule} {decisive} {command} {controls}"
            );
            assert!(replay < controls && out.contains(": reproduces"), "{name}");
            // only the first two decisive lines head the verdict
            assert_eq!(out.matches("a third line stays").count(), 0, "{name}");
        }
        // hostile text in the decisive lines and the command stays text in the page
        assert!(!page.contains("<b>decisive</b>") && !page.contains("<script>x"));
        for out in [
            super::text(&healthy_results()),
            crate::markdown::summary(&healthy_results()),
        ] {
            assert!(!out.contains("reproducer") && !out.contains("Reproducer"));
        }
    }
}
