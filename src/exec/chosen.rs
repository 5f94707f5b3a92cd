//! How an operator's build sides were joined, kept for EXPLAIN ANALYZE:
//! under `algorithm = auto` the strategy is chosen per build side at run
//! time, and a build side may still be left to DataFusion's operator.

use std::sync::Mutex;

use crate::algorithms::choice::Choice;

/// What DataFusion's operator is called where it joined a build side.
const DATAFUSION: &str = "DataFusion";

/// What it is called where the probe side built its hash table instead.
const DATAFUSION_SWAPPED: &str = "DataFusion (sides swapped)";

/// Each distinct way a build side was joined, with the first reason given
/// for it and how many build sides went that way.
#[derive(Debug, Default)]
pub(crate) struct ChosenStrategies(Mutex<Vec<Chosen>>);

#[derive(Debug)]
struct Chosen {
    label: String,
    reason: String,
    count: usize,
}

impl ChosenStrategies {
    pub fn record(&self, choice: &Choice) {
        self.note(choice.strategy.label(), &choice.reason);
    }

    /// A build side joined by DataFusion's operator, and why.
    pub fn record_datafusion(&self, reason: &str) {
        self.note(DATAFUSION.to_string(), reason);
    }

    /// A build side joined by DataFusion's operator with the sides
    /// swapped, and why.
    pub fn record_datafusion_swapped(&self, reason: &str) {
        self.note(DATAFUSION_SWAPPED.to_string(), reason);
    }

    fn note(&self, label: String, reason: &str) {
        // A poisoned log only loses what EXPLAIN ANALYZE would show.
        let Ok(mut chosen) = self.0.lock() else { return };
        match chosen.iter_mut().find(|c| c.label == label) {
            Some(seen) => seen.count += 1,
            None => chosen.push(Chosen { label, reason: reason.to_string(), count: 1 }),
        }
    }

    /// Whether some build side was joined by DataFusion's operator.
    pub fn left_to_datafusion(&self) -> bool {
        self.0.lock().is_ok_and(|chosen| chosen.iter().any(|c| c.label.starts_with(DATAFUSION)))
    }

    /// `PHJ-OM` or `PHJ-OM ×3, DataFusion ×1`, and the reasons; `None`
    /// before any build side was placed.
    pub fn describe(&self) -> Option<(String, String)> {
        let chosen = self.0.lock().ok()?;
        let labels = match chosen.as_slice() {
            [] => return None,
            [only] => only.label.clone(),
            many => many.iter().map(|c| format!("{} ×{}", c.label, c.count)).collect::<Vec<_>>().join(", "),
        };
        let reasons = chosen.iter().map(|c| format!("{}: {}", c.label, c.reason)).collect::<Vec<_>>().join("; ");
        Some((labels, reasons))
    }
}
