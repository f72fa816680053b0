//! The QNN context cache (`--ep qnn`): HTP compiles a graph in seconds (the fixture) to minutes
//! (SmolLM2's prefill graph, 150 s), so the compiled context is kept as ONNX Runtime's EP context
//! model (session config `ep.context_enable`, `ep.context_file_path`, `ep.context_embed_mode` 0:
//! an `EPContext` node whose `ep_cache_context` names the QNN context binary beside it) under
//! `.cache/qnn-context/<key>/`, and a later run opens that model instead of compiling.
//!
//! The key hashes every byte the compile reads (the graph and the external data files it names)
//! and everything else that changes what is compiled: the resolved provider options, the CPU
//! fallback flag, the wheel and backend build and the ONNX Runtime version. An entry holds a
//! manifest written last (so a half-written entry has none) with each file's size and hash; an
//! entry whose manifest is missing, unreadable, of another key, or whose files do not match it,
//! or which the provider cannot open, is removed and compiled again, and the provenance says why
//! (never a silent wrong graph). Only a graph compiled entirely on QNN is kept: a partial run's
//! context model would carry the CPU nodes too.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::qnn::{QnnOptions, QNN_BACKEND_BUILD, QNN_WHEEL_VERSION};
use crate::{Error, Result};

/// The file ONNX Runtime writes the EP context model to inside an entry (the provider writes
/// the context binary beside it, `model_ctx_qnn.bin`).
pub const CTX_MODEL: &str = "model_ctx.onnx";
const MANIFEST: &str = "manifest.json";
/// Bumped when the manifest or the entry layout changes.
const FORMAT: u32 = 1;

/// The cache folder: `KVPROBE_QNN_CACHE` (`off` disables the cache), else `.cache/qnn-context`
/// beside the `.cache` folder kvprobe finds (working folder or above the executable); None when
/// there is none (the run compiles and says it kept nothing).
pub fn root() -> Option<PathBuf> {
    match std::env::var_os("KVPROBE_QNN_CACHE") {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => crate::cache_lookup::near_checkout(Path::new(".cache"), Path::is_dir)
            .map(|c| c.join("qnn-context")),
    }
}

/// One file of an entry: its name inside the entry, size and xxh3-128 (hex).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    pub name: String,
    pub bytes: u64,
    pub xxh3: String,
}

/// What an entry was compiled from and holds (`manifest.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub key: String,
    /// The graph compiled (for a reader; the key holds its bytes).
    pub model: String,
    /// The key's parts in words (options, versions) for a reader.
    pub compiled_with: String,
    pub compile_seconds: f64,
    /// Partitions ONNX Runtime placed on QNN when it was compiled (the placement line).
    pub partitions: usize,
    /// The compiled session's inputs and outputs (`name: type shape`), checked on load.
    pub signature: Vec<String>,
    pub files: Vec<FileSum>,
}

/// The hash of a file's bytes, streamed (SmolLM2's weights are 650 MB).
fn file_hash(path: &Path) -> Result<(u64, u128)> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        detail: format!("cannot read it for the QNN context cache key ({e})"),
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(io)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.digest128()))
}

/// The external data files a graph names (`TensorProto.external_data` "location" of the main
/// graph's initializers), relative to the graph's folder, each once.
pub fn external_files(
    model: &[u8],
) -> std::result::Result<Vec<String>, crate::hailo::hef::HefError> {
    use crate::hailo::hef::wire::{Reader, Value};
    let mut out: Vec<String> = Vec::new();
    let mut m = Reader::new(model, 0, "ModelProto");
    while let Some((f, v, _)) = m.next_field()? {
        let (7, Value::Bytes(g)) = (f, v) else {
            continue;
        };
        let mut gr = Reader::new(g, 0, "GraphProto");
        while let Some((f, v, _)) = gr.next_field()? {
            let (5, Value::Bytes(t)) = (f, v) else {
                continue;
            };
            let mut tr = Reader::new(t, 0, "TensorProto");
            while let Some((f, v, _)) = tr.next_field()? {
                let (13, Value::Bytes(entry)) = (f, v) else {
                    continue;
                };
                let (mut key, mut value) = (&[][..], &[][..]);
                let mut er = Reader::new(entry, 0, "StringStringEntryProto");
                while let Some((f, v, _)) = er.next_field()? {
                    match (f, v) {
                        (1, Value::Bytes(b)) => key = b,
                        (2, Value::Bytes(b)) => value = b,
                        _ => {}
                    }
                }
                let loc = String::from_utf8_lossy(value).into_owned();
                if key == b"location" && !out.contains(&loc) {
                    out.push(loc);
                }
            }
        }
    }
    Ok(out)
}

/// The entry key of `model` compiled with `options`: xxh3-128 over the graph's bytes, each
/// external data file's name and bytes, and `compiled_with` (options and versions in words).
pub fn key(model: &Path, compiled_with: &str) -> Result<String> {
    let bytes = std::fs::read(model).map_err(|e| Error::Io {
        path: model.to_path_buf(),
        detail: format!("cannot read the graph ({e})"),
    })?;
    let external = external_files(&bytes).map_err(|e| Error::Io {
        path: model.to_path_buf(),
        detail: format!("not a readable ONNX model ({e})"),
    })?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(compiled_with.as_bytes());
    h.update(&xxhash_rust::xxh3::xxh3_128(&bytes).to_le_bytes());
    let dir = model.parent().unwrap_or(Path::new("."));
    for name in external {
        let (n, sum) = file_hash(&dir.join(&name))?;
        h.update(name.as_bytes());
        h.update(&n.to_le_bytes());
        h.update(&sum.to_le_bytes());
    }
    Ok(format!("{:032x}", h.digest128()))
}

/// The key's non-byte parts in words: what else decides the compiled context.
pub fn compiled_with(options: &QnnOptions, fallback: bool, ort: &str) -> String {
    format!(
        "onnxruntime-qnn {QNN_WHEEL_VERSION} (QNN {QNN_BACKEND_BUILD}), onnxruntime {ort}, options {}, cpu fallback {}, format {FORMAT}",
        options.describe(),
        if fallback { "allowed" } else { "disabled" }
    )
}

/// An entry of the cache, found or to be written.
#[derive(Debug, Clone)]
pub struct Entry {
    pub dir: PathBuf,
    pub key: String,
}

impl Entry {
    pub fn new(root: &Path, key: &str) -> Entry {
        Entry {
            dir: root.join(key),
            key: key.to_string(),
        }
    }

    pub fn ctx_model(&self) -> PathBuf {
        self.dir.join(CTX_MODEL)
    }

    /// The entry's manifest when every file matches it; Err(why) when the entry exists and is
    /// unusable; Ok(None) when there is no entry.
    pub fn check(&self) -> std::result::Result<Option<Manifest>, String> {
        if !self.dir.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(self.dir.join(MANIFEST))
            .map_err(|e| format!("no readable manifest ({e}): an interrupted write"))?;
        let m: Manifest =
            serde_json::from_str(&text).map_err(|e| format!("manifest unreadable ({e})"))?;
        if m.format != FORMAT || m.key != self.key {
            return Err(format!(
                "manifest of format {} / key {}, not {FORMAT} / {}",
                m.format, m.key, self.key
            ));
        }
        if !m.files.iter().any(|f| f.name == CTX_MODEL) {
            return Err(format!("manifest lists no {CTX_MODEL}"));
        }
        for f in &m.files {
            let (n, sum) = file_hash(&self.dir.join(&f.name))
                .map_err(|_| format!("{} missing or unreadable", f.name))?;
            if n != f.bytes {
                return Err(format!(
                    "{} changed since it was written ({n} bytes, {} recorded)",
                    f.name, f.bytes
                ));
            }
            if format!("{sum:032x}") != f.xxh3 {
                return Err(format!(
                    "{} changed since it was written (its hash is not the recorded one)",
                    f.name
                ));
            }
        }
        Ok(Some(m))
    }

    /// Removes an unusable entry (its folder only).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// A fresh staging folder beside the entry for ONNX Runtime to write the context into.
    pub fn staging(&self) -> Result<PathBuf> {
        let dir = self
            .dir
            .with_file_name(format!("{}.tmp-{}", self.key, std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io {
            path: dir.clone(),
            detail: format!("cannot create the QNN context cache folder ({e}); set KVPROBE_QNN_CACHE to a writable folder, or to off"),
        })?;
        Ok(dir)
    }

    /// Seals the staging folder ONNX Runtime wrote: every file hashed into the manifest (written
    /// last), then the folder renamed to the entry (atomic; if another process got there first,
    /// its entry is kept). Returns why nothing was kept, if so.
    pub fn seal(&self, staging: &Path, mut m: Manifest) -> std::result::Result<(), String> {
        let result = (|| {
            let mut files = Vec::new();
            let list = std::fs::read_dir(staging).map_err(|e| e.to_string())?;
            for e in list {
                let e = e.map_err(|e| e.to_string())?;
                let name = e.file_name().to_string_lossy().into_owned();
                let (n, sum) = file_hash(&e.path()).map_err(|e| e.to_string())?;
                files.push(FileSum {
                    name,
                    bytes: n,
                    xxh3: format!("{sum:032x}"),
                });
            }
            files.sort_by(|a, b| a.name.cmp(&b.name));
            if !files.iter().any(|f| f.name == CTX_MODEL) {
                return Err(format!("ONNX Runtime wrote no {CTX_MODEL}"));
            }
            m.files = files;
            m.format = FORMAT;
            let text = serde_json::to_string_pretty(&m).map_err(|e| e.to_string())?;
            std::fs::write(staging.join(MANIFEST), text).map_err(|e| e.to_string())?;
            if self.dir.exists() {
                return Ok(());
            }
            std::fs::rename(staging, &self.dir).map_err(|e| e.to_string())
        })();
        let _ = std::fs::remove_dir_all(staging);
        result
    }
}

/// Where a session's compiled context came from (provenance `qnn context`).
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Loaded from the entry; compiled then in `compile_seconds`, loaded now in `seconds`.
    Cached {
        entry: PathBuf,
        compile_seconds: f64,
        seconds: f64,
    },
    /// Compiled this run in `seconds`; `kept` says where, or why not; `rebuilt` why a cached
    /// entry of the same key was not used.
    Compiled {
        seconds: f64,
        kept: std::result::Result<PathBuf, String>,
        rebuilt: Option<String>,
    },
}

impl Origin {
    /// The run's timing line of graph `g`: its compile, or its load from the cache.
    pub fn timing(&self, g: &str) -> (String, f64) {
        match self {
            Origin::Cached { seconds, .. } => (format!("qnn context load ({g}, cached)"), *seconds),
            Origin::Compiled { seconds, .. } => (format!("qnn compile ({g})"), *seconds),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Origin::Cached {
                entry,
                compile_seconds,
                seconds,
            } => format!(
                "from the context cache {} (loaded in {seconds:.1} s; compiling it took {compile_seconds:.1} s)",
                entry.display()
            ),
            Origin::Compiled {
                seconds,
                kept,
                rebuilt,
            } => {
                let kept = match kept {
                    Ok(p) => format!("saved to {}", p.display()),
                    Err(why) => format!("not cached: {why}"),
                };
                let rebuilt = rebuilt
                    .as_ref()
                    .map(|r| format!("; the cached entry was unusable ({r}) and was rebuilt"))
                    .unwrap_or_default();
                format!("compiled in {seconds:.1} s, {kept}{rebuilt}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(key: &str) -> Manifest {
        Manifest {
            format: FORMAT,
            key: key.into(),
            model: "m.onnx".into(),
            compiled_with: "x".into(),
            compile_seconds: 1.0,
            partitions: 1,
            signature: vec!["x: f32 [1]".into()],
            files: Vec::new(),
        }
    }

    #[test]
    fn the_key_covers_graph_external_data_and_options() {
        let d = tempfile::tempdir().unwrap();
        // a ModelProto whose graph has one initializer with external_data location = w.bin
        let entry = |k: &[u8], v: &[u8]| {
            let mut e = vec![0x0a, k.len() as u8];
            e.extend_from_slice(k);
            e.extend_from_slice(&[0x12, v.len() as u8]);
            e.extend_from_slice(v);
            e
        };
        let loc = entry(b"location", b"w.bin");
        let mut tensor = vec![0x6a, loc.len() as u8]; // field 13, bytes
        tensor.extend_from_slice(&loc);
        let mut graph = vec![0x2a, tensor.len() as u8]; // field 5
        graph.extend_from_slice(&tensor);
        let mut model = vec![0x08, 0x09, 0x3a, graph.len() as u8]; // ir_version, field 7
        model.extend_from_slice(&graph);
        assert_eq!(external_files(&model).unwrap(), vec!["w.bin"]);
        let m = d.path().join("m.onnx");
        std::fs::write(&m, &model).unwrap();
        std::fs::write(d.path().join("w.bin"), b"weights").unwrap();
        let k1 = key(&m, "opts a").unwrap();
        assert_eq!(k1, key(&m, "opts a").unwrap());
        assert_ne!(k1, key(&m, "opts b").unwrap());
        std::fs::write(d.path().join("w.bin"), b"weightz").unwrap();
        assert_ne!(k1, key(&m, "opts a").unwrap(), "the weights are in the key");
        std::fs::remove_file(d.path().join("w.bin")).unwrap();
        assert!(key(&m, "opts a").unwrap_err().to_string().contains("w.bin"));
    }

    #[test]
    fn a_sealed_entry_is_found_and_a_changed_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = Entry::new(d.path(), "abc");
        assert_eq!(e.check().unwrap(), None);
        let s = e.staging().unwrap();
        std::fs::write(s.join("other.bin"), b"x").unwrap();
        assert!(e.seal(&s, manifest("abc")).unwrap_err().contains(CTX_MODEL));
        assert!(!s.exists() && !e.dir.exists());
        let s = e.staging().unwrap();
        std::fs::write(s.join(CTX_MODEL), b"graph").unwrap();
        std::fs::write(s.join("model_ctx_qnn.bin"), b"context").unwrap();
        e.seal(&s, manifest("abc")).unwrap();
        let m = e.check().unwrap().unwrap();
        assert_eq!(m.files.len(), 2);
        std::fs::write(e.dir.join("model_ctx_qnn.bin"), b"contexT").unwrap();
        assert!(e.check().unwrap_err().contains("model_ctx_qnn.bin changed"));
        std::fs::write(e.dir.join("model_ctx_qnn.bin"), b"context").unwrap();
        assert!(e.check().is_ok());
        std::fs::remove_file(e.dir.join("model_ctx_qnn.bin")).unwrap();
        assert!(e.check().unwrap_err().contains("missing"));
        std::fs::remove_file(e.dir.join(MANIFEST)).unwrap();
        assert!(e.check().unwrap_err().contains("no readable manifest"));
        e.remove();
        assert_eq!(e.check().unwrap(), None);
        // an entry under another key's name
        let s = e.staging().unwrap();
        std::fs::write(s.join(CTX_MODEL), b"graph").unwrap();
        e.seal(&s, manifest("zzz")).unwrap();
        assert!(e.check().unwrap_err().contains("key zzz"));
    }
}
