//! What GenAI's windowed host (W1–W4, `window.rs`) feeds the graph, in the model's terms: for
//! each real token of a request (the prompt, then one token per run) the position id it gets, and
//! for each row the earlier real tokens its run's mask lets it see. A diagnosis replays a request
//! under this feed on a reference model to ask whether the host's own convention explains what a
//! device computed (docs/onnx-genai.md "A pad-valued prompt token"): the rules are GenAI's,
//! evaluated as pure functions, with no graph and no cache.
//!
//! For most prompts the feed is the model's own (positions `0..t`, every earlier token visible);
//! it differs when W2 takes a first-window prompt token whose id is `pad_token_id` for a pad.

use super::window::{WindowGeom, WindowState};
use crate::Result;

/// The feed of a request of `seq.len()` real tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalFeed {
    /// The position id of each real token.
    pub positions: Vec<i64>,
    /// Row-major `[t, t]`: row r sees real token c (c ≤ r).
    pub visible: Vec<bool>,
}

impl LogicalFeed {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn sees(&self, row: usize, col: usize) -> bool {
        self.visible[row * self.len() + col]
    }

    /// The model's own feed: positions `0..t`, causal.
    pub fn model(t: usize) -> LogicalFeed {
        LogicalFeed {
            positions: (0..t as i64).collect(),
            visible: (0..t * t).map(|k| k % t <= k / t).collect(),
        }
    }

    /// The real tokens this feed treats otherwise than the model's feed: fed at another
    /// position, or hidden from some later row (or from themselves).
    pub fn departures(&self) -> Vec<usize> {
        let t = self.len();
        (0..t)
            .filter(|&c| self.positions[c] != c as i64 || (c..t).any(|r| !self.sees(r, c)))
            .collect()
    }
}

/// GenAI's feed for `seq` whose first `prompt_len` tokens are the prompt (one chunk run per
/// window) and the rest generated tokens (one run each). `None` when the feed cannot be written
/// in real tokens: a run whose mask shows a pad entry (a slot holding none of the request's
/// tokens).
pub fn logical_feed(
    geom: WindowGeom,
    seq: &[u32],
    prompt_len: usize,
) -> Result<Option<LogicalFeed>> {
    let t = seq.len();
    let mut st = WindowState::new(geom, Vec::new());
    let mut plans = st.prompt(&seq[..prompt_len])?;
    for &id in &seq[prompt_len..] {
        plans.push(st.token(id)?);
    }
    let npad = st.npad;
    let mut positions = vec![0i64; t];
    let mut visible = vec![false; t * t];
    for plan in &plans {
        let q = plan.ids.len();
        // slot of padded index s in this run (W5: past right-aligned, then the run's own tokens)
        let slot = |s: usize| {
            if s >= plan.first {
                Some(plan.past_len + s - plan.first)
            } else {
                st.slot(s, plan.first, plan.past_len)
            }
        };
        let end = plan.first + q;
        for s in (0..end).filter(|&s| s < npad) {
            if slot(s).is_some_and(|k| plan.mask[k] == 1) {
                return Ok(None);
            }
        }
        for (i, s) in (plan.first..end).enumerate().filter(|(_, s)| *s >= npad) {
            let r = s - npad;
            positions[r] = plan.positions[i];
            for c in 0..=r {
                visible[r * t + c] = slot(c + npad).is_some_and(|k| plan.mask[k] == 1);
            }
        }
    }
    Ok(Some(LogicalFeed { positions, visible }))
}

/// The host's runs of a request at its slot level: the padded sequence (pads first, W1), each
/// run's rows in it, and a feed over padded indexes, pads included: each row's position id and
/// the padded entries its run's mask shows it, through the run's right-aligned past slots (W5)
/// and its own rows (causal). A reference that runs these rows run by run and keeps each run's
/// presents by padded index holds what the host's cache holds, so a fault in how a run's
/// presents are written (a roll inside the window) is a transformation of what it stores, which
/// [`logical_feed`] cannot say: a pad row never has a real token to stand for.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotFeed {
    pub padded: Vec<u32>,
    /// Leading pads of the prompt.
    pub npad: usize,
    /// Padded index ranges of the host's runs, in order (prompt windows, then one per token).
    pub runs: Vec<std::ops::Range<usize>>,
    /// Over padded indexes (`padded.len()` rows and columns).
    pub feed: LogicalFeed,
}

/// GenAI's runs of `seq` (first `prompt_len` the prompt) at the slot level ([`SlotFeed`]).
pub fn slot_feed(geom: WindowGeom, seq: &[u32], prompt_len: usize) -> Result<SlotFeed> {
    let mut st = WindowState::new(geom, Vec::new());
    let mut plans = st.prompt(&seq[..prompt_len])?;
    for &id in &seq[prompt_len..] {
        plans.push(st.token(id)?);
    }
    let t = st.seq.len();
    let mut positions = vec![0i64; t];
    let mut visible = vec![false; t * t];
    let mut runs = Vec::with_capacity(plans.len());
    for plan in &plans {
        let q = plan.ids.len();
        for i in 0..q {
            let r = plan.first + i;
            positions[r] = plan.positions[i];
            for c in 0..=r {
                let slot = if c >= plan.first {
                    Some(plan.past_len + c - plan.first)
                } else {
                    st.slot(c, plan.first, plan.past_len)
                };
                visible[r * t + c] = slot.is_some_and(|k| plan.mask[k] == 1);
            }
        }
        runs.push(plan.first..plan.first + q);
    }
    Ok(SlotFeed {
        padded: st.seq.clone(),
        npad: st.npad,
        runs,
        feed: LogicalFeed { positions, visible },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(w: usize, c: usize, pad: u32) -> WindowGeom {
        WindowGeom {
            window: w,
            context: c,
            max_length: c,
            pad_value: 128,
            pad_token: pad,
            heads: 1,
            head_dim: 1,
        }
    }

    #[test]
    fn a_prompt_without_the_pad_id_is_fed_as_the_model_reads_it() {
        // one window, several windows, a remainder padded at the front, then tokens
        for (n, steps) in [(3, 4), (8, 3), (13, 5), (1, 2)] {
            let seq: Vec<u32> = (10..10 + (n + steps) as u32).collect();
            let f = logical_feed(geom(4, 32, 0), &seq, n).unwrap().unwrap();
            assert_eq!(f, LogicalFeed::model(n + steps), "prompt {n}");
            assert!(f.departures().is_empty());
        }
    }

    #[test]
    fn a_pad_valued_token_in_the_first_window_is_hidden_and_not_counted() {
        // W = 4, prompt [5, 0, 6, 7] with pad id 0 at index 1, then two tokens. By hand from
        // W2/W4: positions [0, 0, 1, 2], then 3, 4; chunk 0's mask hides slot C − 3 (index 1)
        // from every row of the chunk; the first token's run has its past right-aligned, so slot
        // C − 3 now holds index 2: index 1 is visible again and index 2 is hidden; the next
        // token's run hides index 3
        let f = logical_feed(geom(4, 16, 0), &[5, 0, 6, 7, 8, 9], 4)
            .unwrap()
            .unwrap();
        assert_eq!(f.positions, vec![0, 0, 1, 2, 3, 4]);
        let seen = |r: usize| (0..=r).filter(|&c| f.sees(r, c)).collect::<Vec<_>>();
        assert_eq!(seen(0), vec![0]);
        assert_eq!(seen(1), vec![0]);
        assert_eq!(seen(3), vec![0, 2, 3]);
        assert_eq!(seen(4), vec![0, 1, 3, 4]);
        assert_eq!(seen(5), vec![0, 1, 2, 4, 5]);
        assert_eq!(f.departures(), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_pad_valued_token_past_the_first_window_is_a_token_like_any_other() {
        // W3 fills W ones whatever the ids: index 5 (id 0) of a two-window prompt is fed as the
        // model reads it
        let seq = [5, 6, 7, 8, 9, 0, 10, 11, 12];
        let f = logical_feed(geom(4, 32, 0), &seq, 8).unwrap().unwrap();
        assert_eq!(f, LogicalFeed::model(9));
    }

    #[test]
    fn the_slot_feed_is_the_model_feed_on_real_tokens_and_pads_see_nothing() {
        // W 4, a prompt of 6 (2 pads in front), then 2 tokens: by W1-W5 the real tokens are read
        // at positions 0.., causal; the pads sit at position 0 and no row sees a pad
        let seq: Vec<u32> = (10..18).collect();
        let sf = slot_feed(geom(4, 16, 0), &seq, 6).unwrap();
        assert_eq!(sf.npad, 2);
        assert_eq!(sf.padded[..2], [0, 0]);
        assert_eq!(sf.runs, vec![0..4, 4..8, 8..9, 9..10]);
        let f = &sf.feed;
        assert_eq!(f.positions, vec![0, 0, 0, 1, 2, 3, 4, 5, 6, 7]);
        for r in 0..10 {
            for c in 0..=r {
                assert_eq!(f.sees(r, c), c >= 2 && r >= 2, "row {r} col {c}");
            }
        }
        // a prompt of whole windows has no pad row
        let sf = slot_feed(geom(4, 16, 0), &seq, 8).unwrap();
        assert_eq!((sf.npad, sf.runs.len()), (0, 2));
    }
}
