//! The host's own declared feed as a hypothesis (docs/diagnosis.md "Stateful devices", rule
//! `host-feed`). A device whose host declares GenAI's windowed rules (`Device::host_window`:
//! the window, the context, `pad_token_id`) feeds some requests otherwise than the model reads
//! them: W2 takes a first-window prompt token whose id is `pad_token_id` for a pad (position 0,
//! masked, not counted), and that hole stays at its slot while later runs slide past it
//! (`kvprobe_npu::onnx::window_feed`). When this request's feed departs from the model's, the
//! greedy run is replayed under that feed, teacher-forced on the device's tokens, on the
//! reference and at the band the greedy control judged the device by (`crate::footing`: a host
//! cache's matched reference, the band the jitter's spread where that control ran, else the
//! declared precision's cost), and judged like every replay: `evidence::beats_healthy` at the median
//! step or at the worst one, as the wiring fit (`crate::wiring_fit`). Nothing is tried on a
//! request the feed leaves alone, so an everyday prompt costs nothing here.

use kvprobe_npu::onnx::window::WindowGeom;
use kvprobe_npu::onnx::window_feed::{logical_feed, LogicalFeed};
use kvprobe_reference::{ForwardOptions, Model};
use kvprobe_schema::{GreedyFinding, PrefillFinding, Reproducer};
use serde::{Deserialize, Serialize};

use crate::footing::Footing;
use crate::metrics::cosine;
use crate::session::Session;
use crate::wiring_fit::{healthy_and_precision, matched_replay, median, reproduces};
use crate::Result;

/// The replay of the host's declared feed against the device's greedy run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFeedFit {
    /// GenAI's `decoder.sliding_window` window W and `model.context_length` C, as declared.
    pub window: usize,
    pub context: usize,
    pub pad_token: u32,
    /// Prompt indexes in the first window whose id is `pad_token_id`.
    pub pad_valued: Vec<usize>,
    /// The first real token the feed moves or hides.
    pub first_departure: usize,
    /// The replay and the healthy hypothesis (median and worst step).
    pub misses: FeedMisses,
    /// The replay ran on the precision-matched reference (`crate::footing`), else on the f32
    /// reference (results written before session 29 replayed on the matched one wherever it ran).
    #[serde(default)]
    pub on_matched: bool,
    /// The same feed on the float32 reference (what the reproducer computes): median miss.
    pub f32_miss: f64,
    /// Prompt then the device's tokens, and the prompt's length.
    pub seq: Vec<u32>,
    pub prompt_len: usize,
}

/// Median and worst misses (1 − cosine) over the greedy steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FeedMisses {
    pub miss: f64,
    pub worst: f64,
    pub healthy_miss: f64,
    pub healthy_worst: f64,
    /// The declared precision plus the cache-free controls' miss.
    pub precision: f64,
}

impl FeedMisses {
    /// Judged as a wiring fit is: within the declared precision and `PRECISION_RATIO` below the
    /// healthy hypothesis, at the median step or at the worst.
    pub fn reproduces(&self) -> bool {
        reproduces(
            (self.miss, self.worst),
            (self.healthy_miss, self.healthy_worst),
            self.precision,
        )
    }

    /// A host replay's evidence line: `replay` ran on the precision-matched reference or the
    /// float32 one, teacher-forced on the device's tokens, under the hypothesis `what`; its misses
    /// against the healthy hypothesis' and the band (`band` says what that precision holds); and
    /// the same hypothesis on the f32 reference, which its reproducer computes.
    pub fn line(
        &self,
        replay: &str,
        on_matched: bool,
        what: &str,
        band: &str,
        f32_miss: f64,
    ) -> String {
        format!(
            "{replay} on the {} reference, the device's tokens: {what} → median miss {:.1e} (worst step {:.1e}), the healthy hypothesis {:.1e} (worst {:.1e}), {band} {:.1e}; on the f32 reference {:.1e}",
            if on_matched {
                "precision-matched"
            } else {
                "float32"
            },
            self.miss,
            self.worst,
            self.healthy_miss,
            self.healthy_worst,
            self.precision,
            f32_miss
        )
    }
}

impl HostFeedFit {
    pub fn reproduces(&self) -> bool {
        self.misses.reproduces()
    }

    /// What the feed does, in the request's terms.
    pub fn what(&self) -> String {
        let toks: Vec<String> = self
            .pad_valued
            .iter()
            .map(|&i| format!("prompt token {i} (id {} = pad_token_id)", self.seq[i]))
            .collect();
        format!(
            "the host's declared feed (GenAI's windowed rules W2–W4, window {}, context {}, pad_token_id {}): {} in the first window fed at position 0 and masked as a pad, every later token one position early per such token, the masked slot staying put while the window slides",
            self.window,
            self.context,
            self.pad_token,
            toks.join(", ")
        )
    }

    pub fn line(&self) -> String {
        self.misses.line(
            "host feed replayed",
            self.on_matched,
            &self.what(),
            "the declared precision with the graph's noise (the prefill rows the feed leaves alone, the passing cache-free controls)",
            self.f32_miss,
        )
    }

    /// The `kvprobe ref logits` command that computes the device's steps without the device:
    /// row `prompt_len − 1 + k` of its .npy is greedy step k.
    pub fn reproducer(&self, model: &Model) -> Reproducer {
        let geom = (self.window, self.context, self.pad_token);
        let command = ref_logits_command(
            model,
            &self.seq,
            geom,
            self.prompt_len,
            &[],
            "host-feed.npy",
        );
        Reproducer {
            command,
            setup: Vec::new(),
            replay: None,
            tried: vec![
                ("healthy".into(), self.misses.healthy_miss),
                ("host-feed".into(), self.misses.miss),
            ],
            note: Some(format!(
                "no emulator replays a host's feed; the command computes the float32 reference under it, rows {}.. of host-feed.npy being the device's greedy steps (median miss {:.1e}; at the declared precision {:.1e}, the healthy hypothesis {:.1e})",
                self.prompt_len - 1,
                self.f32_miss,
                self.misses.miss,
                self.misses.healthy_miss
            )),
        }
    }
}

/// The prompt indexes in the first window (after GenAI's front padding to whole windows) whose
/// id is `pad`.
fn first_window_pad_ids(ids: &[u32], window: usize, pad: u32) -> Vec<usize> {
    let npad = ids.len().div_ceil(window) * window - ids.len();
    (0..window.saturating_sub(npad).min(ids.len()))
        .filter(|&i| ids[i] == pad)
        .collect()
}

/// The graph's own noise as the hypothesis sees it: `graph_noise` (the cache-free controls that
/// pass), or the larger miss of the prefill rows (each prefix one request from a reset) whose own
/// request the host feeds as the model reads it. Those rows are computed alike under the host's
/// feed and the healthy one, so what they miss is the device's arithmetic (a uint8 window reads
/// its own chunk's entries rounded, which the matched reference does not model: up to 1e-2 on
/// SmolLM2), never the fault as hypothesised; a row the feed departs on is the fault's and never
/// widens the band.
fn untouched_noise(
    geom: WindowGeom,
    ids: &[u32],
    pf: Option<&PrefillFinding>,
    graph_noise: f64,
) -> f64 {
    let rows = pf.map_or(&[][..], |p| p.rows.as_slice());
    rows.iter()
        .filter(|r| {
            let prefix = &ids[..(r.position + 1).min(ids.len())];
            logical_feed(geom, prefix, prefix.len())
                .ok()
                .flatten()
                .is_some_and(|f| f.departures().is_empty())
        })
        .map(|r| {
            1.0 - r
                .matched
                .map_or(r.comparison.cosine, |m| m.matched_vs_device)
        })
        .filter(|m| m.is_finite())
        .fold(graph_noise, f64::max)
}

/// Replays the host's feed against the greedy run `g` (whose device logits the session kept);
/// `None` when the device declares no such feed, or this request's feed is the model's own.
/// `graph_noise`: the passing cache-free controls' miss; `pf`: the prefill rows
/// ([`untouched_noise`]).
pub fn run(
    s: &mut Session,
    g: &GreedyFinding,
    graph_noise: f64,
    pf: Option<&PrefillFinding>,
) -> Result<Option<HostFeedFit>> {
    let Some(geom) = s.dev.host_window() else {
        return Ok(None);
    };
    let Some((seq, device)) = greedy_request(s, g) else {
        return Ok(None);
    };
    let n = s.ids.len();
    // a request the host refuses or cannot write in real tokens has no feed to replay
    let Some(feed) = logical_feed(geom, &seq, n).ok().flatten() else {
        return Ok(None);
    };
    let Some(&first_departure) = feed.departures().first() else {
        return Ok(None);
    };
    s.progress.phase("host feed", 1);
    // replayed and judged as the greedy control judged the device (`crate::footing`)
    let footing = Footing::of(s)?;
    let f32_rows = f32_replay(s.model, &seq, &feed, n)?;
    let replay = match &footing.matched {
        Some(p) => matched_replay(s.model, p, &seq, &feed, n)?,
        None => f32_rows.clone(),
    };
    let (fed, f32_fed) = (misses(&device, &replay), misses(&device, &f32_rows));
    let noise = untouched_noise(geom, &s.ids, pf, graph_noise);
    let judged: Vec<_> = g.steps.iter().collect();
    let base = healthy_and_precision(&judged, noise, footing.jitter());
    s.progress.inc(1);
    Ok(Some(HostFeedFit {
        window: geom.window,
        context: geom.context,
        pad_token: geom.pad_token,
        pad_valued: first_window_pad_ids(&s.ids, geom.window, geom.pad_token),
        first_departure,
        on_matched: footing.matched.is_some(),
        misses: FeedMisses {
            worst: fed.iter().copied().fold(0.0, f64::max),
            miss: median(fed),
            healthy_miss: base.median,
            healthy_worst: base.worst,
            precision: base.precision,
        },
        f32_miss: median(f32_fed),
        seq,
        prompt_len: n,
    }))
}

/// The greedy request the device ran (the prompt, then its tokens but the last) and each
/// step's device logits; `None` when the session kept no such run.
pub(crate) fn greedy_request<'s>(
    s: &'s Session,
    g: &GreedyFinding,
) -> Option<(Vec<u32>, Vec<&'s [f32]>)> {
    let dev = s
        .compared
        .iter()
        .find(|c| c.name == "greedy_device_logits")?;
    let (steps, n) = (g.steps.len(), s.ids.len());
    if steps == 0 || n == 0 || dev.rows != steps || g.device_ids.len() + 1 < steps {
        return None;
    }
    let mut seq = s.ids.clone();
    seq.extend_from_slice(&g.device_ids[..steps - 1]);
    let device = (0..steps)
        .map(|k| &dev.data[k * dev.cols..(k + 1) * dev.cols])
        .collect();
    Some((seq, device))
}

/// 1 − cosine of each device row against the replay's row (a non-finite cosine counts 2).
pub(crate) fn misses(device: &[&[f32]], rows: &[Vec<f32>]) -> Vec<f64> {
    device
        .iter()
        .zip(rows)
        .map(|(d, r)| {
            let c = cosine(d, r);
            if c.is_finite() {
                1.0 - c
            } else {
                2.0
            }
        })
        .collect()
}

/// The `kvprobe ref logits` command that runs `seq` as GenAI's windowed host feeds it (`geom`:
/// window, context, pad_token_id; the first `prompt_len` ids the prompt), `extra` flags added.
pub(crate) fn ref_logits_command(
    model: &Model,
    seq: &[u32],
    (window, context, pad): (usize, usize, u32),
    prompt_len: usize,
    extra: &[&str],
    out: &str,
) -> Vec<String> {
    let ids: Vec<String> = seq.iter().map(u32::to_string).collect();
    let mut command: Vec<String> = [
        "kvprobe",
        "ref",
        "logits",
        "--model",
        &model.source().display().to_string(),
        "--ids",
        &ids.join(","),
        "--genai-window",
        &window.to_string(),
        "--genai-context",
        &context.to_string(),
        "--pad-token",
        &pad.to_string(),
        "--prompt-len",
        &prompt_len.to_string(),
    ]
    .map(String::from)
    .to_vec();
    command.extend(extra.iter().map(|x| x.to_string()));
    command.extend(["--out".to_string(), out.to_string()]);
    command
}

/// Greedy steps 0.. (the prompt's last row, then one row per token) of the f32 reference under
/// `feed`: one forward pass with the feed's positions and visibility.
pub fn f32_replay(
    model: &Model,
    seq: &[u32],
    feed: &LogicalFeed,
    n: usize,
) -> Result<Vec<Vec<f32>>> {
    let out = model.forward(
        seq,
        &ForwardOptions {
            mask: Some(feed.visible.clone()),
            positions: Some(feed.positions.iter().map(|&p| p.max(0) as usize).collect()),
            ..Default::default()
        },
    )?;
    Ok((n - 1..seq.len()).map(|r| out.row(r).to_vec()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_valued_prompt_tokens_are_looked_for_in_the_first_window_only() {
        // 16 tokens, W 16: the first window is the whole prompt (SmolLM2's chat "capital of
        // France": `<|im_end|>` = pad_token_id 2 at index 10)
        let france = [
            1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
        ];
        assert_eq!(first_window_pad_ids(&france, 16, 2), vec![10]);
        // 20 tokens: 12 pads in front, the first window holds indexes 0..4; 10 is in the second
        let mut longer = france.to_vec();
        longer.extend([5, 6, 7, 8]);
        assert_eq!(first_window_pad_ids(&longer, 16, 2), Vec::<usize>::new());
        longer[2] = 2;
        assert_eq!(first_window_pad_ids(&longer, 16, 2), vec![2]);
    }
}
