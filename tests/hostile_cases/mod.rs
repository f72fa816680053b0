//! The cases of `tests/hostile_corpus.rs`, one builder per kind of input. Each writes its files
//! under the corpus root and says the command, the exit code the README documents for it and,
//! where it matters, a word the one-line error must hold.

mod device;
mod files;
mod messages;
mod more;
mod outputs;
mod runtime;

use std::path::{Path, PathBuf};

pub struct Case {
    pub name: String,
    pub args: Vec<String>,
    pub code: i32,
    pub needle: Option<&'static str>,
    /// A word stdout must hold (a finding's verdict and the step it names).
    pub stdout_needle: Option<&'static str>,
    /// The `--out` folder of the case: a refused case must not leave it behind (unless it
    /// existed before the case ran: then it is the user's, and stays).
    pub out: Option<PathBuf>,
    /// The user's files and folders the case must leave as they were (contents, kind, link
    /// target), whatever its exit code; they are never counted as temporaries.
    pub intact: Vec<PathBuf>,
    /// Run just before the case (the corpus runs in order: a case can set up on an earlier
    /// case's output).
    pub prepare: Option<Box<dyn Fn()>>,
}

pub struct Corpus {
    pub cases: Vec<Case>,
    root: PathBuf,
    model: PathBuf,
}

pub fn s(p: &Path) -> String {
    p.display().to_string()
}

impl Corpus {
    pub fn build(root: &Path, model: &Path) -> Corpus {
        let mut c = Corpus {
            cases: Vec::new(),
            root: root.to_path_buf(),
            model: model.to_path_buf(),
        };
        files::gguf_files(&mut c);
        files::hf_folders(&mut c);
        files::safetensors(&mut c);
        files::tokenizers(&mut c);
        files::hefs(&mut c);
        files::manifests(&mut c);
        files::results(&mut c);
        files::cli_values(&mut c);
        files::out_folders(&mut c);
        device::device_failures(&mut c);
        device::non_finite(&mut c);
        device::sizes(&mut c);
        device::cache_len(&mut c);
        device::unused_flags(&mut c);
        device::hef_scales(&mut c);
        outputs::data_loss(&mut c);
        runtime::device_outputs(&mut c);
        messages::wrong_causes(&mut c);
        messages::gguf_as_llama_cpp(&mut c);
        messages::gguf_wrong_causes(&mut c);
        messages::more_wrong_causes(&mut c);
        messages::ane_manifest_causes(&mut c);
        c
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn model(&self) -> &Path {
        &self.model
    }

    /// A file `name` under the root with `bytes`.
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.root.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    /// The manifest an ane-sim device of the fixture model writes (cache 32, query 8): the good
    /// manifest the ane-sim cases edit or pass beside other flags.
    pub fn ane_manifest(&self) -> serde_json::Value {
        let m = std::sync::Arc::new(kvprobe_reference::Model::load(self.model()).unwrap());
        let o = kvprobe_npu::coreml::AneOptions {
            max_ctx: 32,
            max_query: 8,
            ..Default::default()
        };
        let dev = kvprobe_npu::coreml::AneDevice::new(m, o).unwrap();
        serde_json::to_value(dev.manifest()).unwrap()
    }

    /// A copy of the fixture model folder named `name`, then `edit` applied to it.
    pub fn model_copy(&self, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
        let d = self.root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for e in std::fs::read_dir(&self.model).unwrap().flatten() {
            std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
        }
        edit(&d);
        d
    }

    pub fn fifo(&self, name: &str) -> PathBuf {
        let p = self.root.join(name);
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        p
    }

    pub fn sparse(&self, name: &str, len: u64) -> PathBuf {
        let p = self.root.join(name);
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p
    }

    /// A case; `out` is taken from a `--out` argument when there is one.
    pub fn add(&mut self, name: &str, code: i32, needle: Option<&'static str>, args: &[String]) {
        let out = args
            .iter()
            .position(|a| a == "--out")
            .and_then(|i| args.get(i + 1))
            .map(|o| self.root.join(o));
        self.cases.push(Case {
            name: name.to_string(),
            args: args.to_vec(),
            code,
            needle,
            stdout_needle: None,
            out,
            intact: Vec::new(),
            prepare: None,
        });
    }

    /// The last case's stdout must hold `needle`.
    pub fn expect_stdout(&mut self, needle: &'static str) {
        self.cases.last_mut().expect("a case").stdout_needle = Some(needle);
    }

    /// A case that must leave `intact` as it was, with `prepare` run just before it.
    pub fn guarded(
        &mut self,
        name: &str,
        code: i32,
        args: &[String],
        intact: &[PathBuf],
        prepare: impl Fn() + 'static,
    ) {
        self.add(name, code, None, args);
        let case = self.cases.last_mut().expect("just added");
        case.intact = intact.to_vec();
        case.prepare = Some(Box::new(prepare));
    }

    /// A model load: `ref generate` on `model`, refused with exit 2.
    pub fn refused_model(&mut self, name: &str, model: &Path, needle: Option<&'static str>) {
        let args = strings(&[
            "ref",
            "generate",
            "--model",
            &s(model),
            "--prompt",
            "hi",
            "--max-new",
            "1",
        ]);
        self.add(name, 2, needle, &args);
    }

    /// A `diagnose --sim` on the fixture with `extra` arguments and an `--out` folder of its own.
    pub fn sim_args(&self, name: &str, extra: &[&str]) -> Vec<String> {
        let mut a = strings(&[
            "diagnose",
            "--sim",
            "--model",
            &s(&self.model),
            "--cache-len",
            "32",
            "--prefill-len",
            "8",
            "--ids",
            "1,5,9,22",
            "--steps",
            "2",
            "--out",
            &format!("out-{name}"),
        ]);
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    }
}

pub fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|x| x.to_string()).collect()
}

use std::process::Command;
