//! `summary.md`: the run as a Markdown bug-report summary to paste into a forum post or a GitHub
//! issue: verdict and evidence, the exact command, device, model and versions, the prompt's
//! tokens and the key table (greedy steps, else the first table the run has), all from
//! results.json. Text from the model or the user is escaped so it cannot break the table or
//! inject HTML.

use std::fmt::Write as _;

use kvprobe_schema::Results;

use crate::sections;
use crate::text::shell_join;

/// Rows of a table shown before the rest is left to the CSV file.
const MAX_ROWS: usize = 24;

pub fn summary(r: &Results) -> String {
    let p = &r.provenance;
    let mut s = String::new();
    match r.verdict {
        Some(v) => {
            let _ = writeln!(
                s,
                "## kvprobe: `{}` (confidence {:.2})\n",
                v.name(),
                r.confidence.unwrap_or(0.0)
            );
        }
        None if r.incomplete.is_some() => {
            s += "## kvprobe: `incomplete` (partial results: the device failed before a verdict)\n\n";
        }
        None => {
            let _ = writeln!(s, "## kvprobe {}\n", cell(&r.command));
        }
    }
    let head = crate::summary::Head::of(r);
    if let Some(rule) = &head.rule {
        let _ = writeln!(s, "**Cause** (rule `{}`)\n", cell(rule));
        for d in &head.decisive {
            let _ = writeln!(s, "- {}", cell(d));
        }
        s += "\n";
    }
    if let Some(l) = &head.replay {
        s += "**Reproducer** (on the emulator, without the device)\n\n";
        if let Some(c) = &head.command {
            // the same fence rule as the command block below: never an edit of the command
            let fence = "`".repeat(longest_backtick_run(c).max(2) + 1);
            let _ = writeln!(s, "{fence}sh\n{c}\n{fence}\n");
        }
        let _ = writeln!(s, "{}\n", cell(l));
    }
    if !r.evidence.is_empty() {
        s += "**Evidence**\n\n";
        for e in &r.evidence {
            let _ = writeln!(s, "- {}", cell(e));
        }
        s += "\n";
    }
    if !r.also.is_empty() {
        let also: Vec<&str> = r.also.iter().map(|v| v.name()).collect();
        let _ = writeln!(s, "Also: {}\n", also.join(", "));
    }
    for w in &r.warnings {
        let _ = writeln!(s, "> warning: {}", cell(w));
    }
    // the command exactly as a shell re-reads it: a fence longer than any backtick run inside,
    // rather than an edit of the command (a prompt with ``` no longer reproduced)
    let command = shell_join(&p.command);
    let fence = "`".repeat(longest_backtick_run(&command).max(2) + 1);
    let _ = writeln!(s, "**Command**\n\n{fence}sh\n{command}\n{fence}\n");
    let mut rows = vec![
        (
            "kvprobe",
            format!(
                "{}{}",
                p.kvprobe_version,
                p.git_hash
                    .as_deref()
                    .map(|h| format!(" ({h})"))
                    .unwrap_or_default()
            ),
        ),
        ("device", p.backend.clone()),
        (
            "runtime versions",
            crate::html::provenance::versions_line(&p.versions),
        ),
        (
            "model",
            format!(
                "{} ({}, sha256 {})",
                p.model_path,
                p.model_architecture,
                short(&p.model_sha256)
            ),
        ),
        (
            "cache length L / prefill rows P",
            format!("{} / {}", p.cache_len, p.prefill_len),
        ),
        ("host", p.host.clone()),
    ];
    if let (Some(h), Some(sha)) = (&p.hef_path, &p.hef_sha256) {
        rows.push(("HEF", format!("{h} (sha256 {})", short(sha))));
    }
    if let Some(m) = &p.sim_manifest {
        rows.push((
            "emulator",
            format!(
                "{}, cache {}, faults: {}",
                m.device,
                m.cache_quant,
                if m.faults.is_empty() {
                    "none".into()
                } else {
                    m.faults.join(" ")
                }
            ),
        ));
    }
    s += "| | |\n|---|---|\n";
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {} |", cell(&v));
    }
    s += "\n";
    prompt_table(&mut s, r);
    key_table(&mut s, r);
    s
}

fn short(sha: &str) -> String {
    sha.get(..12)
        .map_or_else(|| sha.to_string(), |h| format!("{h}…"))
}

fn prompt_table(s: &mut String, r: &Results) {
    let p = &r.provenance;
    if p.prompt_ids.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "**Prompt** ({} tokens): {}\n",
        p.prompt_ids.len(),
        cell(&p.prompt)
    );
    s.push_str("| position | id | token |\n|---|---|---|\n");
    for (i, id) in p.prompt_ids.iter().enumerate().take(MAX_ROWS) {
        let tok = p.prompt_tokens.get(i).map(String::as_str).unwrap_or("");
        let _ = writeln!(s, "| {i} | {id} | {} |", code_span(tok));
    }
    more(s, p.prompt_ids.len());
}

/// The greedy per-step table when the run has one, else the first table it wrote.
fn key_table(s: &mut String, r: &Results) {
    let tables = sections::tables(r);
    let Some((name, csv)) = tables
        .iter()
        .find(|(n, _)| n == "greedy.csv")
        .or_else(|| tables.first())
    else {
        return;
    };
    let mut lines = csv.lines().map(csv_cells);
    let Some(header) = lines.next() else { return };
    let _ = writeln!(s, "**{name}**\n");
    let _ = writeln!(
        s,
        "| {} |",
        header
            .iter()
            .map(|h| cell(h))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(s, "|{}", "---|".repeat(header.len()));
    let rows: Vec<Vec<String>> = lines.collect();
    for row in rows.iter().take(MAX_ROWS) {
        let _ = writeln!(
            s,
            "| {} |",
            row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
        );
    }
    more(s, rows.len());
}

fn more(s: &mut String, n: usize) {
    if n > MAX_ROWS {
        let _ = writeln!(s, "\n({} more rows in the run folder)", n - MAX_ROWS);
    }
    s.push('\n');
}

/// The cells of one CSV line as `text::csv_text` writes them (RFC 4180 quotes).
fn csv_cells(line: &str) -> Vec<String> {
    let (mut cells, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => cells.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    cells.push(cur);
    cells
}

fn longest_backtick_run(t: &str) -> usize {
    t.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// `t` as a code span in a table cell. A code span is literal (`&lt;` would show as typed), so
/// only what ends the span or the cell changes: the fence is longer than any backtick run
/// inside, a pipe is `\|`, a line break a space, a control character spelled out.
fn code_span(t: &str) -> String {
    let mut inner = String::with_capacity(t.len());
    for c in t.chars() {
        match c {
            '|' => inner.push_str("\\|"),
            '\n' | '\r' | '\t' => inner.push(' '),
            c if c.is_control() => inner.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => inner.push(c),
        }
    }
    if inner.is_empty() {
        return String::new();
    }
    let fence = "`".repeat(longest_backtick_run(&inner) + 1);
    // a space each side keeps a leading or trailing backtick from joining the fence (CommonMark
    // strips one space each side when both are there)
    let pad = if inner.starts_with('`') || inner.ends_with('`') || inner.starts_with(' ') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{inner}{pad}{fence}")
}

/// Text safe inside a Markdown table cell: no line breaks, pipes, HTML or control characters.
fn cell(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    for c in t.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_has_verdict_command_versions_and_key_table() {
        let mut r = crate::fixtures::faulty_results();
        r.provenance.prompt_tokens[0] = "a|b<script>\n".into();
        let md = summary(&r);
        assert!(md.starts_with("## kvprobe: `"), "{md}");
        assert!(md.contains("**Command**") && md.contains("| kvprobe |"));
        assert!(
            md.contains("| runtime versions | emulator kvprobe-npu hailo-sim 0.1.0 |"),
            "{md}"
        );
        assert!(md.contains("**greedy.csv**") || md.contains(".csv**"));
        // a token is a code span, literal in Markdown: `<` stays `<` (it showed as `&lt;`)
        assert!(md.contains("| `a\\|b<script> ` |"), "{md}");
        r.provenance.prompt = "<script>".into();
        let md = summary(&r);
        // raw text only inside code, where Markdown renders no HTML
        let (before, rest) = md.split_once("```sh").unwrap();
        let after = rest.split_once("```").unwrap().1;
        let outside_code: String = after.split('`').step_by(2).collect();
        assert!(
            !before.contains("<script>") && !outside_code.contains("<script>"),
            "{md}"
        );
    }

    #[test]
    fn code_spans_hold_backticks_and_pipes() {
        assert_eq!(code_span("a<b"), "`a<b`");
        assert_eq!(code_span("x`y"), "``x`y``");
        assert_eq!(code_span("`"), "`` ` ``");
        assert_eq!(code_span("a|b"), "`a\\|b`");
        assert_eq!(code_span(""), "");
    }

    /// The command block, parsed back by a shell, gives the exact argv whatever the prompt holds
    /// (a run of three backticks used to be rewritten to three quotes).
    #[test]
    fn command_block_reproduces_the_argv_in_a_shell() {
        let mut r = crate::fixtures::faulty_results();
        let prompt = "say `hi` <b> ```x``` $(id) 'q' \"d\" \\ ~ * !x\nnext ````";
        r.provenance.command = ["kvprobe", "diagnose", "--prompt", prompt]
            .map(String::from)
            .to_vec();
        let md = summary(&r);
        // the run's command block, after the verdict's reproducer block
        let mut lines = md
            .lines()
            .skip_while(|l| *l != "**Command**")
            .skip_while(|l| !(l.starts_with("```") && l.ends_with("sh")));
        let open = lines.next().expect("a command block");
        let fence = open.trim_end_matches("sh");
        let body: Vec<&str> = lines.take_while(|l| *l != fence).collect();
        let script = format!("set -- {}; printf '%s\\0' \"$@\"", body.join("\n"));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{script}");
        let argv: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert_eq!(argv, r.provenance.command, "{md}");
    }

    #[test]
    fn csv_cells_undo_the_quoting() {
        assert_eq!(csv_cells("a,\"b,\"\"c\"\"\",d"), vec!["a", "b,\"c\"", "d"]);
    }
}
