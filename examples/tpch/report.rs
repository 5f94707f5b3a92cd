//! What the job shows: a progress bar over the queries' runs, a line per
//! query, and, with `--csv`, the same figures as a table for docs/data.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use indicatif::{ProgressBar, ProgressStyle};

use crate::duckdb::DuckDbRun;

/// The figures of one query.
#[derive(Default)]
pub struct QueryFigures {
    pub query: usize,
    pub gpu: Duration,
    pub rows: usize,
    pub datafusion: Option<Duration>,
    pub single_node_gpu: Option<Duration>,
    pub single_node_datafusion: Option<Duration>,
    /// The GPU session with `--variant`'s options.
    pub variant: Option<Duration>,
    pub duckdb: Option<DuckDbRun>,
    /// Whether every other session's rows are the GPU session's.
    pub same_rows: bool,
    pub joins_on_gpu: usize,
    pub joins_on_datafusion: usize,
}

/// The bar (on standard error, where it is a terminal) and the CSV file.
pub struct Report {
    bar: ProgressBar,
    csv: Option<File>,
}

const CSV_HEADER: &str = "query,gpu_session_ms,datafusion_ms,duckdb_ms,single_node_gpu_ms,rows,duckdb_rows,\
                          same_rows,joins_on_gpu,joins_on_datafusion,variant_ms,single_node_datafusion_ms";

impl Report {
    /// A report of `runs` runs in all, each session's turn of a query one.
    pub fn new(runs: usize, csv: Option<&Path>) -> Result<Self> {
        let bar = ProgressBar::new(runs as u64);
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} runs, {elapsed} ({eta} left) {msg}") {
            bar.set_style(style);
        }
        let csv = match csv {
            Some(path) => {
                let mut file = File::create(path)
                    .map_err(|e| exec_datafusion_err!("--csv: cannot create {}: {e}", path.display()))?;
                writeln!(file, "{CSV_HEADER}")?;
                Some(file)
            }
            None => None,
        };
        Ok(Self { bar, csv })
    }

    /// The query now running.
    pub fn start(&self, query: usize) {
        self.bar.set_message(format!("Q{query:02}"));
    }

    /// One more run done.
    pub fn ran(&self) {
        self.bar.inc(1);
    }

    /// A line above the bar.
    pub fn line(&self, line: &str) {
        self.bar.suspend(|| println!("{line}"));
    }

    /// The query's figures, as a row of the CSV file.
    pub fn figures(&mut self, figures: &QueryFigures) -> Result<()> {
        let Some(csv) = &mut self.csv else {
            return Ok(());
        };
        let ms = |time: Option<Duration>| time.map(|t| format!("{:.1}", t.as_secs_f64() * 1e3)).unwrap_or_default();
        let duckdb = figures.duckdb.as_ref().and_then(|run| run.as_ref().ok());
        writeln!(
            csv,
            "Q{:02},{},{},{},{},{},{},{},{},{},{},{}",
            figures.query,
            ms(Some(figures.gpu)),
            ms(figures.datafusion),
            ms(duckdb.map(|(time, _)| *time)),
            ms(figures.single_node_gpu),
            figures.rows,
            duckdb.map(|(_, rows)| rows.to_string()).unwrap_or_default(),
            figures.same_rows,
            figures.joins_on_gpu,
            figures.joins_on_datafusion,
            ms(figures.variant),
            ms(figures.single_node_datafusion),
        )?;
        Ok(())
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
