//! Faults of the OpenVINO family (`--openvino DIR --fault NAME`): a buggy host side in front of
//! the real plugins. The IR, OpenVINO and NPUW stay healthy; kvprobe's openvino.genai-style host
//! (host.rs, device.rs) is made to feed what a buggy pipeline feeds, each from a bug class of
//! issue 37 (docs/openvino.md "Faults" gives each one's field report and what the real plugins
//! do with it, measured).
//!
//! | fault | what the host does wrong | verdict |
//! |---|---|---|
//! | `ov-position-shift` | every run after the prompt gets position ids one past the truth (the new token counted before it is fed) | position-mismatch |
//! | `ov-mask-short` | every run after the prompt gets an `attention_mask` one shorter than the K/V it attends (the KV length counted one short) | mask-convention |
//! | `ov-stale-state` | no reset between requests: a new request is appended to the previous one's state, its mask and positions continuing after it | stale-cache |
//! | `ov-capacity-silent` | a step past the capacity is not refused: the host keeps the newest half of the context, re-fed as a new prompt on a fresh request | capacity-overflow |
//! | `ov-turn-restart` | a chat turn appended to the kept state gets position ids from 0, as a new prompt would (fresh requests are right) | position-mismatch |

use kvprobe_schema::Verdict;

use crate::contract::faults::{FaultDecl, FaultTable, FaultText};
use crate::{Error, Result};

/// The OpenVINO family's fault table (`--openvino DIR`, either plugin).
pub const TABLE: FaultTable = FaultTable {
    faults: &[
        FaultDecl::plain(
            "ov-position-shift",
            "position ids one past the truth after the prompt",
            Verdict::PositionMismatch,
        ),
        FaultDecl::plain(
            "ov-mask-short",
            "the attention_mask one shorter than the K/V after the prompt (KV length off by one)",
            Verdict::MaskConvention,
        ),
        FaultDecl::plain(
            "ov-stale-state",
            "no state reset between requests: a new request continues the previous one",
            Verdict::StaleCache,
        ),
        FaultDecl::plain(
            "ov-capacity-silent",
            "a step past the capacity continues silently on the newest half of the context",
            Verdict::CapacityOverflow,
        ),
        FaultDecl::plain(
            "ov-turn-restart",
            "an appended chat turn fed with position ids restarting at 0",
            Verdict::PositionMismatch,
        ),
    ],
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OvFault {
    PositionShift,
    MaskShort,
    StaleState,
    CapacitySilent,
    TurnRestart,
}

/// One `--fault` argument. A fault of another family is `UnknownFault` here.
pub fn parse(text: &str) -> Result<OvFault> {
    let ft = FaultText::split(text);
    let fault = match ft.name {
        "ov-position-shift" => OvFault::PositionShift,
        "ov-mask-short" => OvFault::MaskShort,
        "ov-stale-state" => OvFault::StaleState,
        "ov-capacity-silent" => OvFault::CapacitySilent,
        "ov-turn-restart" => OvFault::TurnRestart,
        name => {
            return Err(Error::UnknownFault {
                name: name.to_string(),
                known: TABLE.known(),
            })
        }
    };
    ft.bare()?;
    Ok(fault)
}

/// Where one run sits in the runtime's state, as the host counts it.
#[derive(Debug, Clone, Copy)]
pub struct RunAt {
    /// Tokens the runtime's state holds before the run.
    pub held: usize,
    /// Whether the request already holds its prompt (the run is a step or an appended turn).
    pub after_prompt: bool,
    /// `held` when the chat turn this run belongs to started (a run of several tokens, or a
    /// piece of one, appended to a kept state).
    pub turn_start: Option<usize>,
}

/// The `position_ids` and `attention_mask` the host feeds for `q` tokens at `at`, from the
/// request's `mask` (`[1, held + q]` when healthy), with `faults` applied.
pub fn feed(faults: &[OvFault], at: RunAt, q: usize, mask: Vec<i64>) -> (Vec<i64>, Vec<i64>) {
    let total = at.held + q;
    let mut pos = super::host::position_ids(total, q);
    let mut mask = fit_mask(mask, total);
    if !at.after_prompt {
        return (pos, mask);
    }
    for f in faults {
        match f {
            OvFault::PositionShift => pos.iter_mut().for_each(|p| *p += 1),
            OvFault::MaskShort => {
                mask.remove(0);
            }
            OvFault::TurnRestart => {
                if let Some(start) = at.turn_start {
                    pos.iter_mut().for_each(|p| *p -= start as i64);
                }
            }
            OvFault::StaleState | OvFault::CapacitySilent => {}
        }
    }
    (pos, mask)
}

/// The request's mask fitted to the `total` positions the state will hold: entries the state
/// kept from an earlier request (`ov-stale-state`) are visible, as that host's mask counts them;
/// entries it dropped (`ov-capacity-silent`) go with them.
fn fit_mask(mask: Vec<i64>, total: usize) -> Vec<i64> {
    match total.checked_sub(mask.len()) {
        Some(extra) => std::iter::repeat_n(1, extra).chain(mask).collect(),
        None => mask[mask.len() - total..].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_refuses_values() {
        assert_eq!(parse("ov-stale-state").unwrap(), OvFault::StaleState);
        assert!(matches!(
            parse("ov-mask-short=1"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(parse("kv-swap"), Err(Error::UnknownFault { .. })));
        assert_eq!(TABLE.faults.len(), 5);
    }

    #[test]
    fn each_fault_changes_only_what_it_names() {
        let step = RunAt {
            held: 5,
            after_prompt: true,
            turn_start: None,
        };
        let ones = |n| vec![1i64; n];
        assert_eq!(feed(&[], step, 1, ones(6)), (vec![5], ones(6)));
        assert_eq!(
            feed(&[OvFault::PositionShift], step, 1, ones(6)),
            (vec![6], ones(6))
        );
        assert_eq!(
            feed(&[OvFault::MaskShort], step, 1, ones(6)),
            (vec![5], ones(5))
        );
        // the prompt itself is fed right by every fault
        let prompt = RunAt {
            held: 0,
            after_prompt: false,
            turn_start: None,
        };
        let all = [OvFault::PositionShift, OvFault::MaskShort];
        assert_eq!(feed(&all, prompt, 3, ones(3)), (vec![0, 1, 2], ones(3)));
        // a turn of 3 appended to 5 held: healthy 5..8, restarted 0..3; a later piece of it
        let turn = RunAt {
            turn_start: Some(5),
            ..step
        };
        assert_eq!(feed(&[], turn, 3, ones(8)).0, vec![5, 6, 7]);
        assert_eq!(feed(&[OvFault::TurnRestart], turn, 3, ones(8)).0, [0, 1, 2]);
        let piece = RunAt { held: 7, ..turn };
        assert_eq!(feed(&[OvFault::TurnRestart], piece, 1, ones(8)).0, [2]);
        // a state holding 2 more (stale) or 2 fewer (slid) than the request's mask
        assert_eq!(
            feed(&[], RunAt { held: 7, ..step }, 1, vec![0, 1, 1, 1, 1, 1]).1,
            [1, 1, 0, 1, 1, 1, 1, 1]
        );
        assert_eq!(
            feed(&[], RunAt { held: 3, ..step }, 1, vec![0, 1, 1, 1, 1, 1]).1,
            [1, 1, 1, 1]
        );
    }
}
