//! `static_graphs.json`: the static-shape graphs of a windowed folder (`export-onnx.py
//! --static`, docs/qnn.md). An NPU compiler such as QNN HTP takes no symbolic axis, so the
//! windowed graph is shipped twice with its axes fixed: `prefill` runs a prompt chunk (W new
//! tokens over C − W past slots), `decode` one token (over C − 1). Both read the same external
//! weights. kvprobe opens one session per graph and runs each windowed run on the graph of its
//! length (GenAI's W5 runs are exactly these two shapes).

use std::path::{Path, PathBuf};

use crate::{Error, Result};

pub const FILE: &str = "static_graphs.json";

#[derive(Debug, Clone, PartialEq)]
pub struct StaticGraphs {
    pub prefill: PathBuf,
    pub decode: PathBuf,
}

impl StaticGraphs {
    /// `None` without the file; a file that disagrees with the folder's window W and context C
    /// (or names a missing graph) is one line.
    pub fn load(dir: &Path, window: Option<usize>, context: usize) -> Result<Option<StaticGraphs>> {
        let path = dir.join(FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let bad = |detail: String| Error::Io {
            path: path.clone(),
            detail,
        };
        let Some(w) = window else {
            return Err(bad(
                "static graphs need a windowed folder (decoder.sliding_window in genai_config.json); re-export with --window W --static".into(),
            ));
        };
        let text =
            std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read it ({e})")))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        let graph = |kind: &str, seq: usize| -> Result<PathBuf> {
            let g = &v[kind];
            let file = g["filename"]
                .as_str()
                .filter(|f| !f.is_empty() && !f.contains('/') && !f.contains('\\'))
                .ok_or_else(|| {
                    bad(format!(
                        "`{kind}.filename` must name a graph file in the folder"
                    ))
                })?;
            let (s, p) = (
                g["sequence_length"].as_u64(),
                g["past_sequence_length"].as_u64(),
            );
            if s != Some(seq as u64) || p != Some((context - seq) as u64) {
                return Err(bad(format!(
                    "`{kind}` fixes sequence_length {s:?} / past_sequence_length {p:?}; the folder's window {w} and context {context} need {seq} / {}; re-export with --static",
                    context - seq
                )));
            }
            let f = dir.join(file);
            if !f.is_file() {
                return Err(Error::Io {
                    path: f,
                    detail: format!("missing; {} names it as the {kind} graph", path.display()),
                });
            }
            Ok(f)
        };
        Ok(Some(StaticGraphs {
            prefill: graph("prefill", w)?,
            decode: graph("decode", 1)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_graphs_must_match_the_window_and_exist() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(StaticGraphs::load(d.path(), Some(8), 64).unwrap(), None);
        let write = |pre: usize| {
            std::fs::write(
                d.path().join(FILE),
                format!(r#"{{"prefill": {{"filename": "p.onnx", "sequence_length": {pre}, "past_sequence_length": {}}},
                    "decode": {{"filename": "d.onnx", "sequence_length": 1, "past_sequence_length": 63}}}}"#, 64 - pre),
            )
            .unwrap()
        };
        write(8);
        let e = StaticGraphs::load(d.path(), Some(8), 64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.onnx: missing"), "{e}");
        std::fs::write(d.path().join("p.onnx"), b"x").unwrap();
        std::fs::write(d.path().join("d.onnx"), b"x").unwrap();
        let g = StaticGraphs::load(d.path(), Some(8), 64).unwrap().unwrap();
        assert_eq!(g.decode, d.path().join("d.onnx"));
        write(16);
        let e = StaticGraphs::load(d.path(), Some(8), 64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("need 8 / 56"), "{e}");
        assert!(StaticGraphs::load(d.path(), None, 64).is_err());
    }
}
