//! One block per probe that ran: a summary table, its chart, and the full table.

use super::{fold, inline_svg, kv_table, table};
use crate::charts::probes as ch;
use crate::issue10::{CAUSALITY_SVG, SPLITS_SVG, STALE_SVG};
use crate::tables::{class_name, kind_name};
use crate::text::{html, html_visible, num};
use kvprobe_schema::{LogitComparison, QuantInfo, Results};

pub struct ProbeBlock {
    pub id: &'static str,
    pub title: &'static str,
    pub summary: String,
    pub chart: String,
    pub detail: String,
}

fn tok(tokens: &[String], i: usize) -> String {
    match tokens.get(i) {
        Some(t) => format!("<code class=\"tok\">{}</code>", html_visible(t)),
        None => String::new(),
    }
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

fn cmp_cells(c: &LogitComparison) -> Vec<String> {
    vec![
        num(c.cosine, 4),
        num(c.kl, 4),
        c.device_top1.to_string(),
        c.reference_top1.to_string(),
        yes(c.top1_match),
    ]
}

const CMP_HEAD: [&str; 5] = [
    "cosine",
    "KL (nats)",
    "device top-1",
    "reference top-1",
    "top-1 match",
];

fn with_cmp<'a>(first: &[&'a str]) -> Vec<&'a str> {
    first.iter().copied().chain(CMP_HEAD).collect()
}

fn chart(charts: &[(&'static str, String)], name: &str, label: &str) -> String {
    charts
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, svg)| inline_svg(svg, label))
        .unwrap_or_default()
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1} %", x * 100.0)
    } else {
        num(x, 3)
    }
}

fn quant_cell(q: &Option<QuantInfo>) -> String {
    match q {
        Some(q) => format!(
            "scale {} · zp {} · [{}, {}]",
            q.scale, q.zero_point, q.min, q.max
        ),
        None => "<span class=\"muted\">not declared</span>".to_string(),
    }
}

pub fn blocks(r: &Results, charts: &[(&'static str, String)]) -> Vec<ProbeBlock> {
    let p = &r.probes;
    let tokens = &r.provenance.prompt_tokens;
    let mut out = Vec::new();

    if let Some(f) = &p.prefill {
        let rows: Vec<_> = f
            .rows
            .iter()
            .map(|row| {
                let mut cells = vec![row.position.to_string(), tok(tokens, row.position)];
                cells.extend(cmp_cells(&row.comparison));
                (cells, Some(row.comparison.top1_match))
            })
            .collect();
        out.push(ProbeBlock {
            id: "prefill",
            title: "Prefill: device logits per prompt prefix",
            summary: kv_table(&[
                ("min cosine", num(f.min_cosine, 4)),
                ("mean cosine", num(f.mean_cosine, 4)),
                ("top-1 agreement", pct(f.top1_agreement)),
                (
                    "first prefix re-run at the end",
                    format!(
                        "cosine {} — {}",
                        num(f.rerun_cosine, 6),
                        if f.rerun_identical {
                            "identical (no state leak)"
                        } else {
                            "DIFFERS: state leaked between resets"
                        }
                    ),
                ),
            ]),
            chart: chart(charts, ch::PREFILL_SVG, "prefill cosine per position"),
            detail: fold(
                "per-position table",
                &table(&with_cmp(&["position", "token"]), &rows),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.greedy {
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|s| {
                let mut cells = vec![
                    s.step.to_string(),
                    s.position.to_string(),
                    s.input_token.to_string(),
                    s.visible_keys.to_string(),
                ];
                cells.extend(cmp_cells(&s.comparison));
                (cells, Some(s.comparison.top1_match))
            })
            .collect();
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
        out.push(ProbeBlock {
            id: "greedy",
            title: "Greedy decoding through the KV-cache",
            summary: kv_table(&[
                ("steps", f.steps.len().to_string()),
                ("mean cosine", num(f.mean_cosine, 4)),
                ("min cosine", num(f.min_cosine, 4)),
                (
                    "mean cosine, tbt steps only",
                    f.tbt_mean_cosine
                        .map(|c| num(c, 4))
                        .unwrap_or_else(|| "—".into()),
                ),
                ("top-1 agreement", pct(f.top1_agreement)),
                (
                    "first divergence",
                    f.first_divergence
                        .map(|d| format!("step {d}"))
                        .unwrap_or_else(|| "none".into()),
                ),
                (
                    "device text",
                    format!("<pre>{}</pre>", html_text(&f.device_text)),
                ),
                (
                    "reference text",
                    format!(
                        "<pre>{}</pre>{}",
                        html_text(&f.reference_text),
                        if f.reference_ids.len() < f.device_ids.len() {
                            format!(
                                "<p class=\"muted\">{} of {} tokens: diagnose stops the reference's continuation a few tokens after the first divergence (run <code>kvprobe greedy</code> for all of it)</p>",
                                f.reference_ids.len(),
                                f.device_ids.len()
                            )
                        } else {
                            String::new()
                        }
                    ),
                ),
                (
                    "device ids",
                    format!("<code>{}</code>", html(&ids(&f.device_ids))),
                ),
                (
                    "reference ids",
                    format!("<code>{}</code>", html(&ids(&f.reference_ids))),
                ),
            ]),
            chart: chart(charts, ch::GREEDY_SVG, "greedy cosine and top-1 per step"),
            detail: fold(
                "per-step table",
                &table(
                    &with_cmp(&["step", "position", "input token", "visible keys"]),
                    &rows,
                ),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.selfmask {
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|s| {
                let mut cells = vec![
                    s.step.to_string(),
                    s.position.to_string(),
                    s.input_token.to_string(),
                ];
                cells.extend(cmp_cells(&s.comparison));
                (cells, Some(s.comparison.top1_match))
            })
            .collect();
        out.push(ProbeBlock {
            id: "selfmask",
            title: "Self-only tbt steps (control for the tbt graph)",
            summary: kv_table(&[
                ("mean cosine", num(f.mean_cosine, 4)),
                ("min cosine", num(f.min_cosine, 4)),
                ("top-1 agreement", pct(f.top1_agreement)),
            ]),
            chart: chart(charts, ch::SELFMASK_SVG, "selfmask cosine per step"),
            detail: fold(
                "per-step table",
                &table(&with_cmp(&["step", "position", "input token"]), &rows),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.colmap {
        let rows: Vec<_> = f
            .rows
            .iter()
            .map(|row| {
                let opt = |v: Option<usize>| v.map(|x| x.to_string()).unwrap_or_else(|| "—".into());
                let ok = row.expected_position.map(|e| row.best_position == Some(e));
                (
                    vec![
                        row.entry.to_string(),
                        opt(row.expected_position),
                        opt(row.best_position),
                        row.best_position
                            .and_then(|p| f.positions.iter().position(|q| *q == p))
                            .map(|k| {
                                f.position_tokens
                                    .get(k)
                                    .map(|t| {
                                        format!("<code class=\"tok\">{}</code>", html_visible(t))
                                    })
                                    .unwrap_or_default()
                            })
                            .unwrap_or_default(),
                        num(row.best_cosine, 4),
                        num(row.second_cosine, 4),
                        class_name(row.class).to_string(),
                    ],
                    ok,
                )
            })
            .collect();
        let opt_bool = |b: Option<bool>| b.map(yes).unwrap_or_else(|| "—".into());
        out.push(ProbeBlock {
            id: "colmap",
            title: "Column-to-token map (single-key steps)",
            summary: kv_table(&[
                (
                    "query",
                    format!("token {} at position {}", f.query_token, f.query_position),
                ),
                ("diagonal strength", num(f.diagonal_strength, 4)),
                ("best off-diagonal", num(f.best_off_diagonal, 4)),
                (
                    "best shift",
                    format!("{:+} (score {})", f.best_shift, num(f.best_shift_score, 4)),
                ),
                ("best permutation score", num(f.best_permutation_score, 4)),
                (
                    "rows",
                    format!(
                        "{} clean, {} mixtures, of {}",
                        f.clean_rows,
                        f.mixture_rows,
                        f.rows.len()
                    ),
                ),
                (
                    "never-written rows identical",
                    opt_bool(f.empty_rows_identical),
                ),
                (
                    "never-written rows spread (1 − cos)",
                    f.empty_rows_spread
                        .map(|x| num(x, 4))
                        .unwrap_or_else(|| "—".into()),
                ),
                ("whole window covered", yes(f.covered_all)),
            ]),
            chart: chart(charts, ch::COLMAP_SVG, "colmap heatmap"),
            detail: fold(
                "per-entry table",
                &table(
                    &[
                        "entry j",
                        "expected position",
                        "best position",
                        "best token",
                        "best cosine",
                        "second cosine",
                        "class",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.ztap {
        let rows: Vec<_> = f
            .caches
            .iter()
            .map(|c| {
                (
                    vec![
                        c.cache_id.to_string(),
                        c.layer.map(|l| l.to_string()).unwrap_or_default(),
                        kind_name(c.kind).to_string(),
                        c.entries.to_string(),
                        c.width.to_string(),
                        c.zero_columns.to_string(),
                        c.empty_entries.to_string(),
                        num(c.expected_transposed_zero_columns, 1),
                        html_visible(&c.interpretation),
                    ],
                    None,
                )
            })
            .collect();
        out.push(ProbeBlock {
            id: "ztap",
            title: "Zero-column taps",
            summary: kv_table(&[
                ("source", html_visible(&f.source)),
                ("interpretation", html_visible(&f.interpretation)),
            ]),
            chart: chart(charts, ch::ZTAP_SVG, "zero-column map per cache"),
            detail: fold(
                "per-cache table",
                &table(
                    &[
                        "cache",
                        "layer",
                        "kind",
                        "entries",
                        "width",
                        "zero columns",
                        "empty entries",
                        "expected if transposed",
                        "interpretation",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.quant {
        let rows: Vec<_> = f
            .caches
            .iter()
            .map(|c| {
                (
                    vec![
                        c.cache_id.to_string(),
                        c.layer.map(|l| l.to_string()).unwrap_or_default(),
                        kind_name(c.kind).to_string(),
                        quant_cell(&c.prefill_output),
                        quant_cell(&c.tbt_input),
                        quant_cell(&c.prefill_input),
                        quant_cell(&c.tbt_output),
                        num(c.max_scale_ratio, 4),
                        yes(c.consistent),
                    ],
                    Some(c.consistent),
                )
            })
            .collect();
        out.push(ProbeBlock {
            id: "quant",
            title: "Declared quantisation of the cache edges",
            summary: kv_table(&[
                (
                    "inconsistent caches",
                    format!("{} of {}", f.inconsistent_caches, f.caches.len()),
                ),
                ("mask input", quant_cell(&f.mask)),
                (
                    "mask \"allowed\" byte",
                    f.mask_allowed_value
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "—".into()),
                ),
                ("embeddings input", quant_cell(&f.embeddings)),
            ]),
            chart: String::new(),
            detail: fold(
                "per-cache table (writer = prefill/tbt output, reader = tbt/prefill input)",
                &table(
                    &[
                        "cache",
                        "layer",
                        "kind",
                        "prefill out (writer)",
                        "tbt in (reader)",
                        "prefill in",
                        "tbt out",
                        "max scale ratio",
                        "consistent",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.maskconv {
        let rows: Vec<_> = f
            .variants
            .iter()
            .map(|v| {
                let mut cells = vec![html_visible(&v.name)];
                cells.extend(cmp_cells(&v.comparison));
                cells.push(yes(v.reproduces));
                (cells, Some(v.reproduces))
            })
            .collect();
        let mut head = with_cmp(&["mask variant"]);
        head.push("reproduces reference");
        out.push(ProbeBlock {
            id: "maskconv",
            title: "Mask conventions on the first tbt step",
            summary: kv_table(&[
                (
                    "variant that reproduces the reference",
                    f.best
                        .as_deref()
                        .map(html_visible)
                        .unwrap_or_else(|| "none".into()),
                ),
                (
                    "other heads' mask rows ignored (cosine)",
                    f.other_heads_ignored_cosine
                        .map(|c| num(c, 6))
                        .unwrap_or_else(|| "—".into()),
                ),
            ]),
            chart: String::new(),
            detail: fold("variants", &table(&head, &rows), rows.len()),
        });
    }

    if let Some(f) = &p.positions {
        let rows: Vec<_> = f
            .points
            .iter()
            .map(|pt| {
                let mut cells = vec![format!("{:+}", pt.delta)];
                cells.extend(cmp_cells(&pt.comparison));
                (cells, Some(pt.comparison.top1_match))
            })
            .collect();
        let summary = [
            (
                "best δ",
                format!("{:+} (cosine {})", f.best_delta, num(f.best_cosine, 4)),
            ),
            ("cosine at δ = 0", num(f.baseline_cosine, 4)),
        ];
        out.push(ProbeBlock {
            id: "positions",
            title: "Position sweep on the first tbt step",
            summary: kv_table(&summary),
            chart: chart(charts, ch::POSITIONS_SVG, "position sweep"),
            detail: fold("sweep", &table(&with_cmp(&["δ"]), &rows), rows.len()),
        });
    }

    if let Some(t) = &p.theta {
        out.push(ProbeBlock {
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
        });
    }

    if let Some(f) = &p.layout {
        let rows: Vec<_> = f
            .caches
            .iter()
            .map(|c| {
                (
                    vec![
                        c.cache_id.to_string(),
                        c.layer.map(|l| l.to_string()).unwrap_or_default(),
                        kind_name(c.kind).to_string(),
                        c.best_layout.name().to_string(),
                        format!("{:+}", c.best_shift),
                        num(c.best_score, 4),
                        num(c.token_major_score, 4),
                    ],
                    None,
                )
            })
            .collect();
        out.push(ProbeBlock {
            id: "layout",
            title: "Writer layout and placement from the ring bytes",
            summary: kv_table(&[
                ("writer layout", html(f.writer_layout.name())),
                ("writer slot shift", format!("{:+}", f.writer_shift)),
                ("mean correlation", num(f.writer_score, 4)),
            ]),
            chart: chart(charts, ch::LAYOUT_SVG, "layout correlation matrix"),
            detail: fold(
                "per-cache table",
                &table(
                    &[
                        "cache",
                        "layer",
                        "kind",
                        "best layout",
                        "best shift",
                        "best score",
                        "token-major score",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }

    if let Some(f) = &p.layout_infer {
        out.push(crate::layout_infer::block(f, charts));
    }

    if let Some(f) = &p.inject {
        let rows: Vec<_> = [
            ("device's own rings", &f.device_rings),
            ("golden token-major rings", &f.golden),
            ("golden rings, K↔V swapped", &f.golden_swapped),
        ]
        .into_iter()
        .map(|(name, c)| {
            let mut cells = vec![html(name)];
            cells.extend(cmp_cells(c));
            (cells, Some(c.top1_match))
        })
        .collect();
        out.push(ProbeBlock {
            id: "inject",
            title: "Golden-ring injection",
            summary: kv_table(&[("blame", html_visible(&f.blame))]),
            chart: String::new(),
            detail: fold("runs", &table(&with_cmp(&["rings"]), &rows), rows.len()),
        });
    }
    if let Some(f) = &p.stale {
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|x| {
                (
                    vec![
                        x.step.to_string(),
                        x.position.to_string(),
                        num(x.cosine_to_clean, 6),
                        num(x.max_abs_diff, 4),
                        yes(x.moved),
                    ],
                    Some(!x.moved),
                )
            })
            .collect();
        let leaks: Vec<String> = f
            .leaks
            .iter()
            .map(|l| format!("step {} slot {} ({})", l.step, l.slot, html(&l.class)))
            .collect();
        let mut pairs = vec![
            (
                "poisoned never-written slots",
                f.never_written_slots.len().to_string(),
            ),
            (
                "poisoned previously-written slots",
                f.previously_written_slots.len().to_string(),
            ),
            ("poison |value|", num(f.poison_magnitude, 3)),
            (
                "leaking slots",
                if leaks.is_empty() {
                    "none".into()
                } else {
                    leaks.join(", ")
                },
            ),
        ];
        if let Some(b) = &f.back_to_back {
            pairs.push((
                "second request, with reset",
                format!(
                    "min cosine {} — {}",
                    num(b.with_reset_cosine, 6),
                    if b.depends_with_reset {
                        "DEPENDS on the first"
                    } else {
                        "independent"
                    }
                ),
            ));
            pairs.push((
                "second request, without reset",
                format!("min cosine {}", num(b.without_reset_cosine, 6)),
            ));
        }
        out.push(ProbeBlock {
            id: "stale",
            title: "Stale: poisoned unused ring slots",
            summary: kv_table(&pairs),
            chart: chart(charts, STALE_SVG, "stale slot map per step"),
            detail: fold(
                "per-step table",
                &table(
                    &["step", "position", "cosine to clean", "max |diff|", "moved"],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }
    if let Some(f) = &p.causality {
        let rows: Vec<_> = f
            .leaks
            .iter()
            .map(|l| {
                (
                    vec![
                        l.position.to_string(),
                        l.perturbed.to_string(),
                        num(l.change, 4),
                        yes(l.first_layer),
                    ],
                    Some(false),
                )
            })
            .collect();
        out.push(ProbeBlock {
            id: "causality",
            title: "Causality: earlier cache entries after replacing a later token",
            summary: kv_table(&[
                ("perturbed positions", f.perturbed.len().to_string()),
                ("leak cells above the diagonal", f.leak_cells.to_string()),
                (
                    "of which in the first layer",
                    f.first_layer_leak_cells.to_string(),
                ),
                (
                    "stray cells (slots without a prompt token)",
                    f.stray_cells.to_string(),
                ),
                (
                    "padding-row cells (expected, §2.5)",
                    f.padding_cells.to_string(),
                ),
                (
                    "most slots one token's first-layer change spread over",
                    f.first_layer_spread.to_string(),
                ),
                (
                    "frozen entry tail (columns)",
                    f.frozen_tail_columns.to_string(),
                ),
            ]),
            chart: chart(charts, CAUSALITY_SVG, "causality matrix"),
            detail: fold(
                "leak cells",
                &table(
                    &[
                        "position",
                        "perturbed position",
                        "relative change",
                        "first layer",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }
    if let Some(f) = &p.splits {
        let rows: Vec<_> = f
            .rows
            .iter()
            .map(|r| {
                let pc = r
                    .prefill_continue
                    .as_ref()
                    .map_or("—".to_string(), |c| num(c.cosine, 4));
                (
                    vec![r.split.to_string(), pc, num(r.decode_final.cosine, 4)],
                    Some(!f.failing_splits.contains(&r.split)),
                )
            })
            .collect();
        out.push(ProbeBlock {
            id: "splits",
            title: "Splits: the prompt through every split point",
            summary: kv_table(&[
                ("whole prefill cosine", num(f.whole_prefill.cosine, 4)),
                ("prefill-continue min", num(f.prefill_continue_min, 4)),
                ("pure decode min", num(f.pure_decode_min, 4)),
                ("decode after prefill min", num(f.mixed_decode_min, 4)),
            ]),
            chart: chart(charts, SPLITS_SVG, "split-point matrix"),
            detail: fold(
                "per-split table",
                &table(
                    &["split", "prefill-continue cosine", "decode final cosine"],
                    &rows,
                ),
                rows.len(),
            ),
        });
    }
    stateful_blocks(p, &mut out);
    out
}

/// Blocks of a stateful device's diagnosis (issue 9): overflow, state checks, and the probes
/// that do not apply, each with its reason.
fn stateful_blocks(p: &kvprobe_schema::ProbeFindings, out: &mut Vec<ProbeBlock>) {
    let opt = |v: Option<usize>| v.map_or("—".to_string(), |x| x.to_string());
    if let Some(f) = &p.overflow {
        out.push(ProbeBlock {
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
        });
    }
    if let Some(f) = &p.state {
        let c = |v: Option<f64>| v.map_or("—".to_string(), |x| num(x, 4));
        let (doc, swapped) = match f.layout_cosines {
            Some([a, b]) => (Some(a), Some(b)),
            None => (None, None),
        };
        out.push(ProbeBlock {
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
        });
    }
    if !p.not_applicable.is_empty() {
        let rows: Vec<_> = p
            .not_applicable
            .iter()
            .map(|n| (vec![n.probe.clone(), n.why.clone()], None))
            .collect();
        out.push(ProbeBlock {
            id: "not-applicable",
            title: "Probes that do not apply to this device",
            summary: String::new(),
            chart: String::new(),
            detail: table(&["probe", "why"], &rows),
        });
    }
}

/// Multi-line model text for a `<pre>`: newlines and tabs kept, other control characters spelled.
pub(crate) fn html_text(s: &str) -> String {
    s.split('\n')
        .map(|line| {
            line.split('\t')
                .map(html_visible)
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
}
