//! A generated workload's tables written once as Parquet files and read
//! back as listing tables, the way DataFusion is usually deployed:
//! statistics from the footers, scans split by byte ranges, and row groups
//! pruned by the joins' dynamic filters.

use std::fs::File;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use datafusion::common::exec_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use rayon::prelude::*;

/// A part's batches, made as they are read.
pub(super) type Batches = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>;

/// Writes each table of `tables` (its name and how many parts it is made
/// in) to `folder/NAME/part-NNN.parquet`, one file per part, the parts of a
/// table written in parallel; `generate(name, part)` makes part `part`
/// (from 0) in the generator's row order. Snappy-compressed, with the
/// writer's defaults otherwise (row groups of 2^20 rows, as DataFusion
/// writes them, and column and page statistics), as a data lake would hold
/// them. A table already written there is kept: each is written to a
/// folder of its own and renamed into place only when complete.
pub(super) fn write_tables<G>(folder: &Path, tables: &[(&str, usize)], generate: G) -> Result<()>
where
    G: Fn(&str, usize) -> Result<(SchemaRef, Batches)> + Sync,
{
    let properties = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    for &(table, parts) in tables {
        let done = folder.join(table);
        if done.is_dir() {
            continue;
        }
        let writing = folder.join(format!("{table}.writing"));
        if writing.exists() {
            std::fs::remove_dir_all(&writing).map_err(|e| file_error("clear", &writing, e))?;
        }
        std::fs::create_dir_all(&writing).map_err(|e| file_error("create", &writing, e))?;
        (0..parts).into_par_iter().try_for_each(|part| -> Result<()> {
            let (schema, batches) = generate(table, part)?;
            let path = writing.join(format!("part-{:03}.parquet", part + 1));
            let file = File::create(&path).map_err(|e| file_error("create", &path, e))?;
            let mut writer = ArrowWriter::try_new(file, schema, Some(properties.clone()))?;
            for batch in batches {
                writer.write(&batch?)?;
            }
            writer.close()?;
            Ok(())
        })?;
        std::fs::rename(&writing, &done).map_err(|e| file_error("rename", &writing, e))?;
    }
    Ok(())
}

/// Registers in `ctx` each of `tables` that [`write_tables`] wrote to
/// `folder`, as a listing table over its files.
pub(super) async fn register_tables(ctx: &SessionContext, folder: &Path, tables: &[&str]) -> Result<()> {
    for &table in tables {
        let path = folder.join(table);
        let url = path.to_str().ok_or_else(|| exec_datafusion_err!("the path {} is not UTF-8", path.display()))?;
        ctx.register_parquet(table, url, ParquetReadOptions::default()).await?;
    }
    Ok(())
}

fn file_error(what: &str, path: &Path, error: std::io::Error) -> DataFusionError {
    exec_datafusion_err!("Parquet tables: cannot {what} {}: {error}", path.display())
}
