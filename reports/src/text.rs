//! Text made safe for the places it lands in: HTML, SVG labels, CSV cells.
//!
//! Prompts, token strings, file names and evidence come from models and users; the report is
//! opened by people who did not run it (issue 5), so every such string passes through here.

/// Escape for HTML text and attribute values (both quote kinds, so it is safe in either).
pub fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

/// Control characters made visible (`\n`, `\t`, `\u{7}`): token texts often are whitespace or
/// control bytes, which would vanish on the page or make an SVG file invalid XML.
pub fn visible(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || is_noncharacter(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// `visible` then HTML-escaped.
pub fn html_visible(s: &str) -> String {
    html(&visible(s))
}

fn is_noncharacter(c: char) -> bool {
    let v = c as u32;
    (0xFDD0..=0xFDEF).contains(&v) || (v & 0xFFFE) == 0xFFFE
}

/// Shorten to at most `max` characters (an ellipsis marks the cut); for axis labels.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// One CSV cell (RFC 4180 quoting). Text cells that a spreadsheet would run as a formula get a
/// leading apostrophe (`=`, `+`, `-`, `@` first), because token texts are attacker-chosen.
pub fn csv_text(s: &str) -> String {
    let guarded = match s.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{s}"),
        _ => s.to_string(),
    };
    csv_quote(&guarded)
}

fn csv_quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A fixed-decimals number for tables; non-finite values spelled out.
pub fn num(x: f64, decimals: usize) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{x:.decimals$}")
    }
}

/// argv joined as a POSIX shell command line (single-quoted where needed), so it can be re-run.
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_escapes_every_markup_character() {
        assert_eq!(
            html(r#"<script>alert("x")&'</script>"#),
            "&lt;script&gt;alert(&quot;x&quot;)&amp;&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn visible_spells_control_characters() {
        assert_eq!(visible("a\nb\t\u{7}"), "a\\nb\\t\\u{7}");
    }

    #[test]
    fn csv_quotes_and_guards_formulas() {
        assert_eq!(csv_text("a,b"), "\"a,b\"");
        assert_eq!(csv_text("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_text("=1+1"), "'=1+1");
        assert_eq!(csv_text("plain"), "plain");
    }

    #[test]
    fn shell_join_quotes_spaces_and_quotes() {
        let argv = ["kvprobe", "--prompt", "it's here"].map(String::from);
        assert_eq!(shell_join(&argv), "kvprobe --prompt 'it'\\''s here'");
    }

    #[test]
    fn truncate_marks_the_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
