//! The strategies an operator's build sides were transformed for, kept for
//! EXPLAIN ANALYZE: under `algorithm = auto` the choice is made per build
//! side, at run time.

use std::sync::Mutex;

use crate::algorithms::choice::Choice;

/// Each distinct strategy chosen, with the first reason given for it and
/// how many build sides it was chosen for.
#[derive(Debug, Default)]
pub(crate) struct ChosenStrategies(Mutex<Vec<(Choice, usize)>>);

impl ChosenStrategies {
    pub fn record(&self, choice: &Choice) {
        // A poisoned log only loses what EXPLAIN ANALYZE would show.
        let Ok(mut chosen) = self.0.lock() else { return };
        match chosen.iter_mut().find(|(c, _)| c.strategy == choice.strategy) {
            Some((_, count)) => *count += 1,
            None => chosen.push((choice.clone(), 1)),
        }
    }

    /// `PHJ-OM` or `PHJ-OM ×3, SMJ-OM ×1`, and the reasons; `None` before
    /// any build side was prepared.
    pub fn describe(&self) -> Option<(String, String)> {
        let chosen = self.0.lock().ok()?;
        let labels = match chosen.as_slice() {
            [] => return None,
            [(choice, _)] => choice.strategy.label(),
            many => many.iter().map(|(c, n)| format!("{} ×{n}", c.strategy.label())).collect::<Vec<_>>().join(", "),
        };
        let reasons =
            chosen.iter().map(|(c, _)| format!("{}: {}", c.strategy.label(), c.reason)).collect::<Vec<_>>().join("; ");
        Some((labels, reasons))
    }
}
