//! The text form of `kvprobe inspect`: a HEF's header, groups, cache edges, resources, implied
//! device and lints, one line each. Names come from the file, so control characters are
//! escaped before they reach a terminal.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{describe, Group, Hef, Lint, Severity};

/// What one inspection found, for [`text`].
pub struct Inspection<'a> {
    pub hef: &'a Hef,
    pub lints: &'a [Lint],
    pub pairing: &'a [Lint],
    pub extracted: &'a [PathBuf],
}

impl Inspection<'_> {
    pub fn errors(&self) -> usize {
        self.count(Severity::Error)
    }
    fn count(&self, s: Severity) -> usize {
        self.lints
            .iter()
            .chain(self.pairing)
            .filter(|l| l.severity == s)
            .count()
    }
}

/// A string from the file as it may be printed: control characters (escape sequences, CR/LF)
/// become `\u{..}` escapes, everything else is kept.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The whole text report.
pub fn text(i: &Inspection) -> String {
    let mut out = String::new();
    header(&mut out, i.hef);
    for g in &i.hef.groups {
        group(&mut out, g);
    }
    out.push('\n');
    resources(&mut out, i);
    device(&mut out, i.hef);
    out.push('\n');
    for l in i.lints.iter().chain(i.pairing) {
        let sev = match l.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let _ = writeln!(
            out,
            "{sev}[{}] {} ({})",
            l.id,
            printable(&l.message),
            l.refs.join(", ")
        );
        let _ = writeln!(out, "    fix: {}", printable(&l.fix));
    }
    let _ = writeln!(
        out,
        "{} error(s), {} warning(s)",
        i.errors(),
        i.count(Severity::Warning)
    );
    out
}

fn header(out: &mut String, h: &Hef) {
    let _ = writeln!(
        out,
        "HEF v{} ({} bytes), proto {} bytes, arch {}, SDK {}, hash {}",
        h.header.version,
        h.file_len,
        h.header.proto_size,
        printable(&h.hw_arch_name),
        printable(&h.sdk_version),
        h.header_checks.hash_string
    );
    let _ = writeln!(
        out,
        "extensions {:?} (optional {:?})",
        h.extensions, h.optional_extensions
    );
}

fn group(out: &mut String, g: &Group) {
    let _ = writeln!(
        out,
        "\ngroup {} [{}; core op {}; {} contexts; {} path]",
        printable(&g.name),
        g.index,
        printable(&g.core_op_name),
        g.contexts,
        if g.net_flow { "net-flow" } else { "legacy" }
    );
    for (dir, layers) in [("in ", &g.inputs), ("out", &g.outputs)] {
        for l in layers.iter() {
            let _ = writeln!(
                out,
                "  {dir} {:<40} shape {:?} padded {:?} {} {}B  scale {} zp {}{}",
                printable(&l.name),
                l.shape,
                l.padded_shape,
                l.format_name.unwrap_or("invalid format"),
                l.data_bytes,
                l.quant.scale,
                l.quant.zero_point,
                if l.per_feature_quant {
                    " (per-feature)"
                } else {
                    ""
                }
            );
        }
    }
    for e in &g.cache_edges {
        let _ = writeln!(
            out,
            "  cache {:>3} {:<6} {:<34} E {} Ep {} len {} {} {}B  scale {} zp {}",
            e.cache_id,
            format!("{:?}", e.direction).to_lowercase(),
            printable(&e.name),
            e.entry_size,
            e.padded_entry_size,
            e.length,
            e.format_name.unwrap_or("invalid format"),
            e.data_bytes,
            e.quant.scale,
            e.quant.zero_point
        );
    }
    let names: Vec<String> = g.sorted_output_names.iter().map(|n| printable(n)).collect();
    let _ = writeln!(
        out,
        "  sorted outputs ({}): {:?}",
        g.sorted_output_source, names
    );
}

fn resources(out: &mut String, i: &Inspection) {
    for r in &i.hef.resources {
        let status = match (r.range, r.hash_ok) {
            (None, _) => "OUT OF RANGE",
            (_, Some(false)) => "HASH MISMATCH",
            (_, Some(true)) => "hash ok",
            (_, None) => "no hash",
        };
        let _ = writeln!(
            out,
            "resource {:<22} {:>10} bytes at +{} ({status})",
            printable(&r.name),
            r.size,
            r.offset
        );
    }
    for p in i.extracted {
        let _ = writeln!(out, "extracted {}", p.display());
    }
}

fn device(out: &mut String, h: &Hef) {
    if let Ok(d) = describe::to_device_description(h) {
        let _ = writeln!(
            out,
            "\ndevice: model {} L {} P {} vocab {} hidden {} layers {} heads {}/{} head_dim {}",
            printable(&d.model_name),
            d.cache_len,
            d.prefill_len,
            d.shape.vocab_size,
            d.shape.hidden_size,
            d.shape.n_layers,
            d.shape.n_heads,
            d.shape.n_kv_heads,
            d.shape.head_dim
        );
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn names_from_the_file_cannot_drive_the_terminal() {
        // issue 19: group names went to the terminal raw
        assert_eq!(printable("g\u{1b}[2J\r\nx"), "g\\u{1b}[2J\\u{d}\\u{a}x");
        assert_eq!(printable("qwen2__prefill"), "qwen2__prefill");
        assert_eq!(printable("é名"), "é名");
    }
}
