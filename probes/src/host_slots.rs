//! The host's runs replayed at the slot level, and the writer hypothesis it can hold
//! (docs/diagnosis.md "Stateful devices", rule `host-writer`; docs/qnn.md "present-shift").
//!
//! A device whose host declares GenAI's windowed rules (`Device::host_window`) runs a prompt as
//! W-row windows, pads included, and keeps each run's presents by slot. A fault in how a run's
//! presents are written — the graph's presents rolled inside the window (field-bugs "cache
//! written at the wrong position"), a runner storing them shifted — leaves the run's own logits
//! alone and changes what later runs read; where the first window holds pads, a pad row's entry
//! lands in a visible slot and a prompt token's in a masked one. `crate::host_feed` speaks real
//! tokens and cannot say that. Here the precision-matched reference runs each host run as the
//! host feeds it (`kvprobe_npu::onnx::window_feed::slot_feed`: W rows with their pads, the host's
//! positions, mask and past slots) and stores its presents by padded index, so the hypothesis
//! "each run's presents are stored rolled by r" is that transformation of what is stored. Every
//! r the declared window allows (1..W) is replayed, teacher-forced on the device's tokens, and the
//! closest is judged like every replay (`wiring_fit::reproduces`). Nothing runs on a request
//! without pads in its first window: every roll of a whole window stores the same entries at
//! other slots, and attention does not depend on where a key sits, so every hypothesis is then
//! the healthy function.

use kvprobe_npu::onnx::window_feed::{slot_feed, SlotFeed};
use kvprobe_reference::Model;
use kvprobe_schema::{GreedyFinding, Reproducer};
use serde::{Deserialize, Serialize};

use crate::footing::Footing;
use crate::host_feed::{greedy_request, misses, ref_logits_command, FeedMisses};
use crate::matched::{run_rows, Precision, PREFILL, TBT};
use crate::matched_store::Store;
use crate::session::Session;
use crate::wiring_fit::{healthy_and_precision, median};
use crate::Result;

/// The closest writer hypothesis of the slot-level replay against the device's greedy run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostWriterFit {
    /// The declared window W and context C, and the pads in front of this prompt.
    pub window: usize,
    pub context: usize,
    pub pads: usize,
    /// The closest hypothesis: each prompt window's presents stored rolled by `roll` (row j of
    /// the present in slot j − roll, modulo W).
    pub roll: usize,
    /// Replayed on the precision-matched reference (where the jitter control judges the device,
    /// `crate::footing`), else on the float32 one.
    pub on_matched: bool,
    pub misses: FeedMisses,
    /// Every roll replayed, with its median miss.
    pub tried: Vec<(usize, f64)>,
    /// The other rolls that store the same entries in this request's visible slots as `roll`
    /// ([`visible_rows`]): the same function here, so not replayed and not told apart.
    #[serde(default)]
    pub alike: Vec<usize>,
    /// The same roll on the float32 reference (what the reproducer computes): median miss.
    pub f32_miss: f64,
    /// Prompt then the device's tokens, and the prompt's length.
    pub seq: Vec<u32>,
    pub prompt_len: usize,
    pub pad_token: u32,
}

impl HostWriterFit {
    pub fn reproduces(&self) -> bool {
        self.misses.reproduces()
    }

    /// What the hypothesis does to this request's cache: the first window's visible slots (after
    /// its pads) hold the rows `(i + roll) mod W`; which of those are pad rows, and which prompt
    /// tokens' entries no visible slot holds.
    pub fn what(&self) -> String {
        let (w, r, p) = (self.window, self.roll, self.pads);
        let held: Vec<usize> = (p..w).map(|i| (i + r) % w).collect();
        let pad_rows = held.iter().filter(|&&j| j < p).count();
        let hidden: Vec<String> = (p..w)
            .filter(|j| !held.contains(j))
            .map(|j| (j - p).to_string())
            .collect();
        format!(
            "each prompt window's {w} presents stored rolled by {r} (the entry of row j kept in slot j − {r} mod {w}): with {p} pad(s) in front of the prompt, the first window's visible slots hold {pad_rows} pad row(s)' entries and prompt token(s) {}' entries sit in masked slots, so every later run reads another prompt{}",
            hidden.join(", "),
            if self.alike.is_empty() {
                String::new()
            } else {
                let a: Vec<String> = self.alike.iter().map(usize::to_string).collect();
                format!(
                    " (a roll by {} stores the same entries there: not told apart on this prompt)",
                    a.join(" or ")
                )
            }
        )
    }

    pub fn line(&self) -> String {
        let m = self.misses;
        let tried: Vec<String> = self
            .tried
            .iter()
            .map(|(r, x)| format!("roll {r} {x:.1e}"))
            .collect();
        let replay = format!("host slot replay (the host's runs as fed: W {} rows with their pads, the host's positions, mask and past slots, presents stored by slot)", self.window);
        let line = m.line(
            &replay,
            self.on_matched,
            &self.what(),
            "the declared precision",
            self.f32_miss,
        );
        format!("{line} (tried: {})", tried.join(", "))
    }

    /// The `kvprobe ref logits` command that computes the device's steps without the device.
    pub fn reproducer(&self, model: &Model) -> Reproducer {
        let geom = (self.window, self.context, self.pad_token);
        let roll = self.roll.to_string();
        let extra = ["--present-roll", roll.as_str()];
        let command = ref_logits_command(
            model,
            &self.seq,
            geom,
            self.prompt_len,
            &extra,
            "present-roll.npy",
        );
        let mut tried = vec![("healthy".to_string(), self.misses.healthy_miss)];
        tried.extend(self.tried.iter().map(|(r, m)| (format!("roll {r}"), *m)));
        Reproducer {
            command,
            setup: Vec::new(),
            replay: None,
            tried,
            note: Some(format!(
                "no emulator replays a host's runs; the command runs the float32 reference as the host feeds the device, each prompt window's presents stored rolled by {}: row k of present-roll.npy is greedy step k (median miss {:.1e}; at the declared precision {:.1e}, the healthy hypothesis {:.1e})",
                self.roll, self.f32_miss, self.misses.miss, self.misses.healthy_miss
            )),
        }
    }
}

/// Greedy steps 0.. (the prompt's last row, then one row per token) of `p`'s reference running
/// the host's runs of `sf` one by one, each run's presents stored by padded index, a run of
/// more than one row rolled by `roll` first (0: as written).
pub fn replay(model: &Model, p: &Precision, sf: &SlotFeed, roll: usize) -> Result<Vec<Vec<f32>>> {
    let model = p.model(model);
    let mut store = Store::new(model);
    let fed = (sf.padded.as_slice(), Some(&sf.feed));
    let prompt_runs = sf.runs.iter().take_while(|r| r.len() > 1).count();
    let mut out = Vec::new();
    for (i, run) in sf.runs.iter().enumerate() {
        let group = if run.len() > 1 { PREFILL } else { TBT };
        let logits = run_rows(model, p, &mut store, fed, run.clone(), 0, group, 1.0)?;
        if i + 1 >= prompt_runs {
            out.push(logits);
        }
        if run.len() > 1 && !roll.is_multiple_of(run.len()) {
            store.roll_last(run.len(), roll);
        }
    }
    Ok(out)
}

/// The prompt rows (index in the window ≥ `npad`) whose entries a roll by `roll` keeps in the
/// first window's visible slots `npad..w`, sorted; the rest of what they hold are pad rows, all
/// one entry (the pad id at position 0, attending to nothing). Attention does not see where a key
/// sits, and every later window is whole, so two rolls with the same rows are one function.
pub fn visible_rows(w: usize, npad: usize, roll: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = (npad..w)
        .map(|i| (i + roll) % w)
        .filter(|&j| j >= npad)
        .collect();
    rows.sort_unstable();
    rows
}

/// Replays every roll the declared window allows against the greedy run `g`; `None` when the
/// device declares no windowed host, or this request's first window holds no pad (every roll
/// is then the healthy function). The band is the steps' declared precision alone, without the
/// cache-free controls' miss that other fits add as the graph's noise: every writer hypothesis
/// predicts those controls (a self-only step reads no stored entry; a prefix from a reset is
/// judged only when it passes) to be the healthy ones, so their miss is not room a roll may
/// use — where they fail (a mask that shows the pads to every row), no roll is why.
pub fn run(s: &mut Session, g: &GreedyFinding) -> Result<Option<HostWriterFit>> {
    let Some(geom) = s.dev.host_window() else {
        return Ok(None);
    };
    let Some((seq, device)) = greedy_request(s, g) else {
        return Ok(None);
    };
    let n = s.ids.len();
    let Ok(sf) = slot_feed(geom, &seq, n) else {
        return Ok(None);
    };
    if sf.npad == 0 || geom.window < 2 {
        return Ok(None);
    }
    // replayed and judged as the greedy control judged the device (`crate::footing`)
    let footing = Footing::of(s)?;
    let exact = Precision::exact(s.model);
    let p = footing.matched.as_ref().unwrap_or(&exact);
    s.progress.phase("host slots", geom.window as u64);
    // one replay per distinct function: rolls that put the same rows in the visible slots
    let mut tried: Vec<(usize, f64, f64)> = Vec::new();
    let mut seen: Vec<(Vec<usize>, usize)> = Vec::new();
    for roll in 1..geom.window {
        let rows = visible_rows(geom.window, sf.npad, roll);
        if seen.iter().any(|(r, _)| *r == rows) {
            s.progress.inc(1);
            continue;
        }
        seen.push((rows, roll));
        let m = misses(&device, &replay(s.model, p, &sf, roll)?);
        let worst = m.iter().copied().fold(0.0, f64::max);
        tried.push((roll, median(m), worst));
        s.progress.inc(1);
    }
    let Some(&(roll, best, worst)) = tried.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Ok(None);
    };
    let key = visible_rows(geom.window, sf.npad, roll);
    let alike: Vec<usize> = (roll + 1..geom.window)
        .filter(|&r| visible_rows(geom.window, sf.npad, r) == key)
        .collect();
    let f32_miss = match footing.jitter() {
        true => median(misses(&device, &replay(s.model, &exact, &sf, roll)?)),
        false => best,
    };
    s.progress.inc(1);
    let steps: Vec<_> = g.steps.iter().collect();
    let base = healthy_and_precision(&steps, 0.0, footing.jitter());
    Ok(Some(HostWriterFit {
        window: geom.window,
        context: geom.context,
        pads: sf.npad,
        roll,
        on_matched: footing.jitter(),
        misses: FeedMisses {
            miss: best,
            worst,
            healthy_miss: base.median,
            healthy_worst: base.worst,
            precision: base.precision,
        },
        tried: tried.iter().map(|&(r, m, _)| (r, m)).collect(),
        alike,
        f32_miss,
        seq,
        prompt_len: n,
        pad_token: geom.pad_token,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::cosine;
    use crate::test_support::tiny_llama;
    use kvprobe_npu::onnx::window::WindowGeom;
    use kvprobe_reference::ForwardOptions;

    fn geom(w: usize) -> WindowGeom {
        WindowGeom {
            window: w,
            context: 32,
            max_length: 32,
            pad_value: 0,
            pad_token: 0,
            heads: 1,
            head_dim: 1,
        }
    }

    fn worst(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| 1.0 - cosine(x, y))
            .fold(0.0, f64::max)
    }

    #[test]
    fn the_host_runs_as_written_are_the_model_on_its_real_tokens() {
        // 6 prompt ids in windows of 4 (2 pads in front, each masked from every row), then 3
        // ids one run each: the greedy steps are the causal forward pass's rows 5..
        let m = tiny_llama(11);
        let seq = [3u32, 5, 9, 22, 41, 17, 8, 99, 12];
        let sf = slot_feed(geom(4), &seq, 6).unwrap();
        let got = replay(&m, &Precision::exact(&m), &sf, 0).unwrap();
        let full = m.forward(&seq, &ForwardOptions::default()).unwrap();
        let want: Vec<Vec<f32>> = (5..seq.len()).map(|r| full.row(r).to_vec()).collect();
        assert_eq!(got.len(), 4);
        assert!(worst(&got, &want) < 1e-6, "{}", worst(&got, &want));
    }

    #[test]
    fn a_roll_of_whole_windows_is_the_healthy_function_and_with_pads_it_is_not() {
        // whole windows: every roll stores the same entries at other slots
        let m = tiny_llama(11);
        let p = Precision::exact(&m);
        let seq = [3u32, 5, 9, 22, 41, 17, 8, 99, 12, 7];
        let whole = slot_feed(geom(4), &seq, 8).unwrap();
        let healthy = replay(&m, &p, &whole, 0).unwrap();
        for r in 1..4 {
            let rolled = replay(&m, &p, &whole, r).unwrap();
            assert!(worst(&rolled, &healthy) < 1e-6, "roll {r}");
        }
        // 6 of 8: a pad row's entry lands in a visible slot, token 0's in a masked one
        let padded = slot_feed(geom(4), &seq, 6).unwrap();
        let healthy = replay(&m, &p, &padded, 0).unwrap();
        let rolled = replay(&m, &p, &padded, 1).unwrap();
        assert!(
            worst(&rolled, &healthy) > 1e-4,
            "{}",
            worst(&rolled, &healthy)
        );
    }

    #[test]
    fn rolls_that_keep_the_same_prompt_rows_visible_are_one_function() {
        // W 8, 5 pads: visible slots 5, 6, 7. By hand: roll 1 keeps rows 6, 7 (and pad row 0);
        // rolls 3, 4, 5 keep only pad rows; roll 7 keeps rows 5, 6 (and pad row 4)
        assert_eq!(visible_rows(8, 5, 1), vec![6, 7]);
        for r in 3..=5 {
            assert!(visible_rows(8, 5, r).is_empty(), "roll {r}");
        }
        assert_eq!(visible_rows(8, 5, 7), vec![5, 6]);
        // 3 pads, roll 3: slots 3..8 hold rows 6, 7, 0, 1, 2: prompt rows 6 and 7 only
        assert_eq!(visible_rows(8, 3, 3), vec![6, 7]);
    }

    #[test]
    fn roll_last_moves_row_i_plus_r_to_row_i() {
        let m = tiny_llama(11);
        let mut st = Store::new(&m);
        for l in st.k.iter_mut().chain(st.v.iter_mut()) {
            *l = (0..5).map(|i| vec![i as f32]).collect();
        }
        st.roll_last(3, 1);
        for l in st.k.iter().chain(st.v.iter()) {
            let got: Vec<f32> = l.iter().map(|r| r[0]).collect();
            assert_eq!(got, vec![0.0, 1.0, 3.0, 4.0, 2.0]);
        }
    }
}
