//! What an IR declares about its weights, read from its xml before OpenVINO compiles it.
//!
//! A compressed IR stores its weights as low-precision `Const` layers that a decompression
//! subgraph (`Convert` → optional `Subtract` of a zero point → `Multiply` by a scale) widens
//! before the `MatMul` / `Gather`: NNCF's `compress_weights` (optimum-intel's `--weight-format
//! int8|int4`) writes u8 / i4 / u4 values with f16 scales, OpenVINO's `save_model` with its
//! default `compress_to_fp16=True` writes f16 values. The precision-matched reference computes
//! with the checkpoint's f32 weights only (it does not read the IR's decompression subgraphs),
//! so such an IR is refused in one line naming what it stores, never judged against f32.

use std::io::BufRead;
use std::path::Path;

use crate::{Error, Result};

/// Element types of a `Const` that only a compressed weight uses in an LLM IR (the f32 IR's
/// constants are f32 values and i32 / i64 shapes and indices).
const COMPRESSED: [&str; 14] = [
    "f16", "bf16", "u8", "i8", "u4", "i4", "nf4", "f4e2m1", "f8e4m3", "f8e5m2", "f8e8m0", "u1",
    "u2", "u3",
];

/// Low-precision constants of one element type: how many, and the first one's name.
#[derive(Debug, PartialEq)]
pub struct Stored {
    pub element_type: String,
    pub count: usize,
    pub first: String,
}

/// The compressed constants of the IR text `xml`, by element type in order of first use.
pub fn compressed_constants(xml: impl BufRead) -> std::io::Result<Vec<Stored>> {
    let mut found: Vec<Stored> = Vec::new();
    // the IR writes a layer's header and its `<data …/>` on lines of their own
    let mut const_name: Option<String> = None;
    for line in xml.lines() {
        let line = line?;
        if line.contains("<layer ") {
            const_name = (attr(&line, "type") == Some("Const"))
                .then(|| attr(&line, "name").unwrap_or("?").to_string());
            continue;
        }
        let Some(name) = const_name.take_if(|_| line.contains("<data ")) else {
            continue;
        };
        let Some(ty) = attr(&line, "element_type").filter(|t| COMPRESSED.contains(t)) else {
            continue;
        };
        match found.iter_mut().find(|s| s.element_type == ty) {
            Some(s) => s.count += 1,
            None => found.push(Stored {
                element_type: ty.to_string(),
                count: 1,
                first: name,
            }),
        }
    }
    Ok(found)
}

/// `Ok` for an IR whose weights are f32; else the one-line refusal (exit 2).
pub fn check_f32_weights(xml: &Path) -> Result<()> {
    let io = |detail: String| Error::Io {
        path: xml.to_path_buf(),
        detail,
    };
    let file = std::fs::File::open(xml).map_err(|e| io(format!("cannot read it: {e}")))?;
    let found = compressed_constants(std::io::BufReader::new(file))
        .map_err(|e| io(format!("cannot read it: {e}")))?;
    if found.is_empty() {
        return Ok(());
    }
    let what: Vec<String> = found
        .iter()
        .map(|s| format!("{} {} (`{}`, …)", s.count, s.element_type, s.first))
        .collect();
    Err(io(format!(
        "the IR stores compressed weights ({} constants); the precision-matched reference computes only f32 weights and does not read OpenVINO's decompression subgraphs, so it is not judged against f32: export the f32 IR (scripts/export-openvino.sh, compress_to_fp16=False, no NNCF compression)",
        what.join(", ")
    )))
}

/// The value of `name="…"` in one xml tag line.
fn attr<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let at = line.find(&key)? + key.len();
    let len = line[at..].find('"')?;
    Some(&line[at..at + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NNCF int8_asym weight (u8 values, u8 zero point, f16 scale), an f32 norm and an i64
    /// shape, as OpenVINO 2026.4 writes them.
    const INT8: &str = r#"
		<layer id="7" name="model.embed_tokens.weight" type="Const" version="opset1">
			<data element_type="u8" shape="49152, 576" offset="8" size="28311552" />
		</layer>
		<layer id="8" name="model.embed_tokens.weight/zero_point" type="Const" version="opset1">
			<data element_type="u8" shape="49152, 1" offset="28311560" size="49152" />
		<layer id="9" name="model.embed_tokens.weight/scale" type="Const" version="opset1">
			<data element_type="f16" shape="49152, 1" offset="28360712" size="98304" />
		<layer id="10" name="Convert_12868" type="Convert" version="opset1">
			<data destination_type="f16" />
		<layer id="11" name="model.norm.weight" type="Const" version="opset1">
			<data element_type="f32" shape="576" offset="0" size="2304" />
		<layer id="12" name="Constant_5442" type="Const" version="opset1">
			<data element_type="i64" shape="1" offset="0" size="8" />
"#;

    #[test]
    fn compressed_weights_are_counted_by_type_and_f32_passes() {
        let got = compressed_constants(INT8.as_bytes()).unwrap();
        assert_eq!(
            got,
            vec![
                Stored {
                    element_type: "u8".into(),
                    count: 2,
                    first: "model.embed_tokens.weight".into()
                },
                Stored {
                    element_type: "f16".into(),
                    count: 1,
                    first: "model.embed_tokens.weight/scale".into()
                },
            ]
        );
        // the f32 and i64 constants alone, and a Convert's f16 destination, are not weights
        let f32_only: String = INT8
            .lines()
            .filter(|l| !l.contains("\"u8\"") && !l.contains("\"f16\" shape"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(compressed_constants(f32_only.as_bytes()).unwrap(), vec![]);
    }

    #[test]
    fn a_compressed_ir_is_refused_naming_what_it_stores() {
        let dir = tempfile::tempdir().unwrap();
        let xml = dir.path().join("openvino_model.xml");
        std::fs::write(&xml, INT8).unwrap();
        let e = check_f32_weights(&xml).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let s = e.to_string();
        assert!(!s.contains('\n'), "{s}");
        assert!(s.contains("2 u8 (`model.embed_tokens.weight`"), "{s}");
        assert!(s.contains("compress_to_fp16=False"), "{s}");
    }
}
