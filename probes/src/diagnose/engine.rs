//! The rule engine: evaluates an ordered table of rules over a runtime's facts and writes the
//! verdict, its confidence, the evidence lines and `also` (docs/diagnosis.md, "Rules").
//!
//! A rule reads only the facts: the orchestration that ran the probes decides nothing but which
//! probe to run next. Evidence lines come out in the order they are written: the orchestration's
//! lines about a probe between the rule phases, each rule's lines when it fires.

use kvprobe_schema::Verdict;

/// How early in the pipeline a cause sits; the earliest one heads the verdict (a broken graph
/// explains everything after it), ties go to the rule that fired first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// The prefill graph (its control, single-chunk rows, fails).
    PrefillGraph,
    /// The tbt graph, named from its own control (self-only steps).
    TbtGraph,
    /// What the cache path shows (rings, masks, positions), and every verdict that is not a
    /// graph control's.
    CachePath,
}

/// When the engine asks a rule at all, by what the rules before it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Only if no rule named a cause yet ("only if nothing above fired").
    NothingYet,
    /// Only if some rule named a cause already.
    AfterCause,
}

/// What happens after a rule fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Continue,
    /// The diagnosis ends here: no later rule or probe runs.
    Stop,
}

/// The measured control a verdict stands on (issue 18): a fit, repair or variant may explain a
/// failing control, never create one. The engine sets aside a fault verdict whose control
/// passes within the device's precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Needs none: `healthy`, and notes (rules without a verdict).
    Exempt,
    /// Any control of the runtime.
    Any,
    /// Single-chunk prefill rows (no cache read).
    PrefillSingle,
    /// Multi-chunk prefill rows (they read what earlier chunks wrote).
    PrefillMulti,
    /// Self-only tbt steps.
    SelfOnly,
    /// Greedy tbt steps.
    Greedy,
    /// A stage that reads the cache: multi-chunk prefill rows or greedy tbt steps.
    CacheReading,
    /// The device's logits are finite.
    Output,
    /// The same request after a reset gives the same logits.
    Rerun,
    /// The prefill wrote the positions it was given (stateful devices).
    StateWrites,
    /// The longest prompt the device declares it takes, and generation past the end of its
    /// context, against the reference (the `capacity` check).
    Capacity,
}

impl Control {
    /// The short name docs/diagnosis.md lists.
    pub fn key(self) -> &'static str {
        match self {
            Control::Exempt => "none",
            Control::Any => "any",
            Control::PrefillSingle => "prefill-single",
            Control::PrefillMulti => "prefill-multi",
            Control::SelfOnly => "self-only",
            Control::Greedy => "greedy",
            Control::CacheReading => "cache-reading",
            Control::Output => "output",
            Control::Rerun => "rerun",
            Control::StateWrites => "state-writes",
            Control::Capacity => "capacity",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Control::Exempt => "none",
            Control::Any => "any control",
            Control::PrefillSingle => "single-chunk prefill rows",
            Control::PrefillMulti => "multi-chunk prefill rows",
            Control::SelfOnly => "self-only tbt steps",
            Control::Greedy => "greedy tbt steps",
            Control::CacheReading => "cache-reading stages (multi-chunk prefill, greedy tbt)",
            Control::Output => "finite logits",
            Control::Rerun => "re-run after reset",
            Control::StateWrites => "state writes",
            Control::Capacity => "the longest declared prompt and generation past the end",
        }
    }
}

/// What a runtime's facts say of each control: `true` when it fails by more than the device's
/// own precision explains.
pub trait Controls {
    fn fails(&self, c: Control) -> bool;
}

/// One row of a rule table.
pub struct Rule<F> {
    /// Stable name (docs/diagnosis.md lists every id in table order).
    pub id: &'static str,
    pub stage: Tier,
    /// The cause the rule names; `None` for a note (evidence only, no cause).
    pub verdict: Option<Verdict>,
    /// The control that must fail before the verdict stands.
    pub needs: Control,
    /// A control the rule's hypothesis leaves as a healthy device computes it (a wiring of the
    /// runs after the prompt leaves the cache-free prefill alone): when that control fails, the
    /// hypothesis does not reproduce what the device did there, so it cannot be the cause
    /// (issue 34: a hypothesis is scored across every control, not only the one it explains).
    pub keeps: Control,
    pub when: When,
    pub then: Then,
    pub check: fn(&F) -> Option<Cause>,
}

// by hand: a derive would ask `F: Copy` of the facts, the row holds only a function pointer
impl<F> Clone for Rule<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for Rule<F> {}

impl<F> Rule<F> {
    /// A rule asked always that lets the later rules run; a fault verdict needs some failing
    /// control until [`Rule::needs`] names which.
    pub const fn new(
        id: &'static str,
        stage: Tier,
        verdict: Option<Verdict>,
        check: fn(&F) -> Option<Cause>,
    ) -> Self {
        let needs = match verdict {
            None | Some(Verdict::Healthy) => Control::Exempt,
            Some(_) => Control::Any,
        };
        Rule {
            id,
            stage,
            verdict,
            needs,
            keeps: Control::Exempt,
            when: When::Always,
            then: Then::Continue,
            check,
        }
    }

    pub const fn when(mut self, when: When) -> Self {
        self.when = when;
        self
    }

    pub const fn needs(mut self, control: Control) -> Self {
        self.needs = control;
        self
    }

    pub const fn stop(mut self) -> Self {
        self.then = Then::Stop;
        self
    }

    pub const fn keeps(mut self, control: Control) -> Self {
        self.keeps = control;
        self
    }
}

/// What a rule found when it fires: how sure it is, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub confidence: f64,
    pub evidence: Vec<String>,
    pub warnings: Vec<String>,
    /// Further causes the same evidence supports (same tier), in order.
    pub also: Vec<(Verdict, f64)>,
}

impl Cause {
    pub fn new(confidence: f64) -> Self {
        Cause {
            confidence,
            evidence: Vec::new(),
            warnings: Vec::new(),
            also: Vec::new(),
        }
    }

    /// The evidence of a note (a rule without a verdict).
    pub fn note(line: impl Into<String>) -> Self {
        Cause::new(0.0).line(line)
    }

    pub fn line(mut self, line: impl Into<String>) -> Self {
        self.evidence.push(line.into());
        self
    }

    pub fn warn(mut self, line: impl Into<String>) -> Self {
        self.warnings.push(line.into());
        self
    }

    pub fn also(mut self, verdict: Verdict, confidence: f64) -> Self {
        self.also.push((verdict, confidence));
        self
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Named {
    verdict: Verdict,
    confidence: f64,
    tier: Tier,
    /// The rule that named it and that rule's own evidence lines (the decisive ones).
    rule: &'static str,
    decisive: Vec<String>,
}

/// The engine's result: what `Diagnosis` carries from the rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Conclusion {
    pub verdict: Verdict,
    pub confidence: f64,
    pub evidence: Vec<String>,
    pub also: Vec<Verdict>,
    pub warnings: Vec<String>,
    /// The rule heading the verdict and its own evidence lines; `None` for `unknown`.
    pub rule: Option<&'static str>,
    pub decisive: Vec<String>,
}

/// Evaluates rule phases one after the other and keeps what they found.
#[derive(Debug, Default)]
pub struct Engine {
    evidence: Vec<String>,
    warnings: Vec<String>,
    causes: Vec<Named>,
    fired: Vec<&'static str>,
    stopped: bool,
}

impl Engine {
    pub fn new() -> Self {
        Engine::default()
    }

    /// An evidence line of the orchestration (what a probe measured).
    pub fn line(&mut self, line: impl Into<String>) {
        self.evidence.push(line.into());
    }

    pub fn warn(&mut self, line: impl Into<String>) {
        self.warnings.push(line.into());
    }

    pub fn has_causes(&self) -> bool {
        !self.causes.is_empty()
    }

    /// A `Then::Stop` rule fired: the diagnosis is over.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Ids of the rules that fired, in order.
    pub fn fired(&self) -> &[&'static str] {
        &self.fired
    }

    /// Evaluates `rules` in order over `facts` (nothing once stopped).
    pub fn apply<F: Controls>(&mut self, rules: &[Rule<F>], facts: &F) {
        for rule in rules {
            if self.stopped {
                return;
            }
            let asked = match rule.when {
                When::Always => true,
                When::NothingYet => self.causes.is_empty(),
                When::AfterCause => !self.causes.is_empty(),
            };
            if let Some(cause) = asked.then(|| (rule.check)(facts)).flatten() {
                if rule.keeps != Control::Exempt && facts.fails(rule.keeps) {
                    self.contradicted(rule, cause);
                } else if rule.needs == Control::Exempt || facts.fails(rule.needs) {
                    self.record(rule, cause);
                } else {
                    self.set_aside(rule, cause);
                }
            }
        }
    }

    fn record<F>(&mut self, rule: &Rule<F>, cause: Cause) {
        self.fired.push(rule.id);
        let decisive = cause.evidence.clone();
        self.evidence.extend(cause.evidence);
        self.warnings.extend(cause.warnings);
        if let Some(verdict) = rule.verdict {
            let named = std::iter::once((verdict, cause.confidence))
                .chain(cause.also)
                .map(|(verdict, confidence)| Named {
                    verdict,
                    confidence,
                    tier: rule.stage,
                    rule: rule.id,
                    decisive: decisive.clone(),
                });
            self.causes.extend(named);
        }
        if rule.then == Then::Stop {
            self.stopped = true;
        }
    }

    /// A rule whose check fired while its control passes: its lines become warnings, it names
    /// no cause and stops nothing.
    fn set_aside<F>(&mut self, rule: &Rule<F>, cause: Cause) {
        let why = format!(
            "its control ({}) passes within the device's precision; a fit or variant may explain a failure, never create one",
            rule.needs.name()
        );
        self.warn_set_aside(rule, &why, cause);
    }

    /// A rule whose hypothesis predicts a healthy `keeps` control the device failed: it explains
    /// one control and contradicts another, so it names no cause (its lines become warnings).
    fn contradicted<F>(&mut self, rule: &Rule<F>, cause: Cause) {
        let why = format!(
            "its hypothesis leaves the {} as a healthy device computes them, and the device failed them: it does not reproduce what the device did there",
            rule.keeps.name()
        );
        self.warn_set_aside(rule, &why, cause);
    }

    fn warn_set_aside<F>(&mut self, rule: &Rule<F>, why: &str, cause: Cause) {
        let verdict = rule.verdict.map_or("a cause", |v| v.name());
        self.warnings.push(format!(
            "set aside: rule `{}` would name {verdict}, but {why}",
            rule.id
        ));
        self.warnings.extend(
            cause
                .evidence
                .into_iter()
                .map(|l| format!("  (set aside) {l}")),
        );
        self.warnings.extend(cause.warnings);
    }

    /// Headline = the earliest tier, then the first cause named; the other verdicts go to
    /// `also`, and each one costs the headline 0.05 of confidence (floor 0.5). No cause:
    /// `unknown`, 0.3.
    pub fn conclude(self) -> Conclusion {
        let Engine {
            evidence,
            warnings,
            causes,
            ..
        } = self;
        let Some(head) = causes
            .iter()
            .enumerate()
            .min_by_key(|(i, c)| (c.tier, *i))
            .map(|(_, c)| c.clone())
        else {
            return Conclusion {
                verdict: Verdict::Unknown,
                confidence: 0.3,
                evidence,
                also: Vec::new(),
                warnings,
                rule: None,
                decisive: Vec::new(),
            };
        };
        let mut also: Vec<Verdict> = Vec::new();
        for c in &causes {
            if c.verdict != head.verdict && !also.contains(&c.verdict) {
                also.push(c.verdict);
            }
        }
        let confidence = (head.confidence - 0.05 * also.len() as f64).max(0.5);
        Conclusion {
            verdict: head.verdict,
            confidence,
            evidence,
            also,
            warnings,
            rule: Some(head.rule),
            decisive: head.decisive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        id: &'static str,
        stage: Tier,
        verdict: Option<Verdict>,
        when: When,
        check: fn(&u8) -> Option<Cause>,
    ) -> Rule<u8> {
        Rule::new(id, stage, verdict, check).when(when)
    }

    /// Hand-made facts: 255 = every control passes, anything else = every control fails.
    const ALL_PASS: u8 = 255;

    impl Controls for u8 {
        fn fails(&self, _c: Control) -> bool {
            *self != ALL_PASS
        }
    }

    #[test]
    fn a_fault_verdict_whose_control_passes_is_set_aside() {
        let rules = [
            rule(
                "fit",
                Tier::CachePath,
                Some(Verdict::TbtGraph),
                When::Always,
                |_| Some(Cause::new(0.9).line("scale ×0.91 fits better")),
            )
            .stop(),
            rule(
                "ok",
                Tier::CachePath,
                Some(Verdict::Healthy),
                When::Always,
                |_| Some(Cause::new(0.95).line("every control passes")),
            ),
        ];
        let mut e = Engine::new();
        e.apply(&rules, &ALL_PASS);
        assert!(!e.stopped(), "a set-aside rule stops nothing");
        let c = e.conclude();
        assert_eq!(c.verdict, Verdict::Healthy);
        assert!(c.warnings[0].starts_with("set aside: rule `fit` would name tbt-graph"));
        assert!(c.warnings[1].contains("scale ×0.91"));
        // the same rule on failing controls names its verdict
        let mut e = Engine::new();
        e.apply(&rules, &0);
        assert_eq!(e.conclude().verdict, Verdict::TbtGraph);
    }

    #[test]
    fn earliest_tier_heads_and_others_cost_confidence() {
        let rules = [
            rule(
                "a",
                Tier::CachePath,
                Some(Verdict::CacheQuantization),
                When::Always,
                |_| Some(Cause::new(0.9).line("a")),
            ),
            rule(
                "b",
                Tier::PrefillGraph,
                Some(Verdict::PrefillGraph),
                When::Always,
                |_| Some(Cause::new(0.7).line("b").also(Verdict::MaskConvention, 0.7)),
            ),
            rule(
                "c",
                Tier::CachePath,
                Some(Verdict::KvBinding),
                When::NothingYet,
                |_| Some(Cause::new(0.9).line("c")),
            ),
        ];
        let mut e = Engine::new();
        e.apply(&rules, &0);
        assert_eq!(e.fired(), ["a", "b"]);
        let c = e.conclude();
        assert_eq!(c.verdict, Verdict::PrefillGraph);
        assert_eq!(
            c.also,
            vec![Verdict::CacheQuantization, Verdict::MaskConvention]
        );
        assert!((c.confidence - 0.6).abs() < 1e-12);
        assert_eq!(c.evidence, ["a", "b"]);
        assert_eq!((c.rule, c.decisive), (Some("b"), vec!["b".to_string()]));
    }

    #[test]
    fn notes_name_nothing_and_the_first_cause_named_heads() {
        let rules = [
            rule(
                "s",
                Tier::CachePath,
                Some(Verdict::TbtGraph),
                When::Always,
                |_| Some(Cause::new(0.85).line("s")),
            ),
            rule("n", Tier::CachePath, None, When::Always, |_| {
                Some(Cause::note("n"))
            }),
            rule(
                "d",
                Tier::CachePath,
                Some(Verdict::MaskConvention),
                When::Always,
                |_| Some(Cause::new(0.9).line("d")),
            ),
        ];
        let mut e = Engine::new();
        e.apply(&rules, &0);
        assert_eq!(e.fired(), ["s", "n", "d"]);
        let c = e.conclude();
        assert_eq!(c.verdict, Verdict::TbtGraph);
        assert_eq!(c.also, vec![Verdict::MaskConvention]);
        assert_eq!(c.evidence, ["s", "n", "d"]);
    }

    #[test]
    fn stop_ends_and_nothing_is_unknown() {
        let mut rules = [
            rule(
                "h",
                Tier::CachePath,
                Some(Verdict::Healthy),
                When::Always,
                |x| (*x == 1).then(|| Cause::new(0.95)),
            ),
            rule(
                "x",
                Tier::CachePath,
                Some(Verdict::TbtGraph),
                When::Always,
                |_| Some(Cause::new(0.6)),
            ),
        ];
        rules[0].then = Then::Stop;
        let mut e = Engine::new();
        e.apply(&rules, &1);
        assert!(e.stopped());
        let c = e.conclude();
        assert_eq!((c.verdict, c.confidence), (Verdict::Healthy, 0.95));
        let e = Engine::new();
        let c = e.conclude();
        assert_eq!((c.verdict, c.confidence), (Verdict::Unknown, 0.3));
    }
}
