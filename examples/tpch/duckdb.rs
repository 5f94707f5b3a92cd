//! DuckDB beside the two sessions: `scripts/duckdb-queries.py` started once
//! over the job's Parquet files, asked for each query in turn, so that its
//! times come from the same host, files and statements as DataFusion's.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use datafusion::common::exec_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use serde_json::{Value, json};

/// A running `duckdb-queries.py`.
pub struct DuckDb {
    child: Child,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
    /// DuckDB's version, as the script reports it.
    pub version: String,
}

/// DuckDB's answer for one query: its median time and rows, or its error.
pub type DuckDbRun = std::result::Result<(Duration, usize), String>;

impl DuckDb {
    /// Starts `script` with the interpreter `PYTHON` names (`python3`
    /// without it) over the tables' folder `folder`.
    pub fn start(script: &Path, folder: &Path) -> Result<Self> {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
        let mut child = Command::new(&python)
            .arg(script)
            .arg(folder)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| exec_datafusion_err!("--duckdb: cannot start {python} {}: {e}", script.display()))?;
        let missing = || exec_datafusion_err!("--duckdb: the script's standard streams are not piped");
        let requests = child.stdin.take().ok_or_else(missing)?;
        let answers = BufReader::new(child.stdout.take().ok_or_else(missing)?);
        let mut duckdb = Self { child, requests, answers, version: String::new() };
        let ready = duckdb.answer()?;
        duckdb.version = ready["ready"].as_str().unwrap_or("of unknown version").to_string();
        Ok(duckdb)
    }

    /// Runs `statements` `warmups` times untimed, then `iterations` times
    /// timed.
    pub fn run(&mut self, statements: &[String], warmups: usize, iterations: usize) -> Result<DuckDbRun> {
        let request = json!({ "statements": statements, "warmups": warmups, "iterations": iterations });
        writeln!(self.requests, "{request}")
            .and_then(|()| self.requests.flush())
            .map_err(|e| exec_datafusion_err!("--duckdb: the script stopped reading: {e}"))?;
        let answer = self.answer()?;
        if let Some(error) = answer["error"].as_str() {
            return Ok(Err(error.to_string()));
        }
        match (answer["ms"].as_f64(), answer["rows"].as_u64()) {
            (Some(ms), Some(rows)) => Ok(Ok((Duration::from_secs_f64(ms / 1e3), rows as usize))),
            _ => Err(exec_datafusion_err!("--duckdb: an answer without a time and rows: {answer}")),
        }
    }

    /// The script's next line, as JSON.
    fn answer(&mut self) -> Result<Value> {
        let mut line = String::new();
        let read = self.answers.read_line(&mut line).map_err(|e| exec_datafusion_err!("--duckdb: {e}"))?;
        if read == 0 {
            return Err(DataFusionError::Execution(
                "--duckdb: the script ended; its error is above (is the duckdb package installed? \
                 see scripts/duckdb-queries.py)"
                    .to_string(),
            ));
        }
        serde_json::from_str(&line).map_err(|e| exec_datafusion_err!("--duckdb: not an answer ({e}): {line}"))
    }
}

impl Drop for DuckDb {
    fn drop(&mut self) {
        // Closing its input ends the script's loop; kill in case it hangs.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
