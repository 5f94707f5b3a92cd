//! The TPC-DS workload: the 24 tables generated in process with
//! `tpcdsgen-arrow` (held in memory, or written as Parquet files), and the
//! queries read from files that TPC's own query generator wrote.
//!
//! TPC-DS's queries are made from templates by `dsqgen`, in TPC's kit, under
//! TPC's license; this crate does not carry them. docs/benchmarks.md shows
//! how to generate them (one `queryN.sql` per template, dialect `netezza`,
//! `-QUALIFY Y` for the qualification substitutions).

use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use rayon::prelude::*;
use tpcdsgen::config::{Session, SessionBuilder, Table};
use tpcdsgen_arrow::{
    CallCenterArrow, CatalogPageArrow, CatalogReturnsArrow, CatalogSalesArrow, CustomerAddressArrow, CustomerArrow,
    CustomerDemographicsArrow, DateDimArrow, HouseholdDemographicsArrow, IncomeBandArrow, InventoryArrow, ItemArrow,
    PromotionArrow, ReasonArrow, ShipModeArrow, StoreArrow, StoreReturnsArrow, StoreSalesArrow, TimeDimArrow,
    WarehouseArrow, WebPageArrow, WebReturnsArrow, WebSalesArrow, WebSiteArrow,
};

use super::parquet::{self, Batches};
use super::register_parts;

/// Rows per generated batch.
const BATCH_ROWS: usize = 8192;

/// The tables the queries read (all of TPC-DS's but `dbgen_version`).
pub const TABLES: [Table; 24] = [
    Table::CallCenter,
    Table::CatalogPage,
    Table::CatalogReturns,
    Table::CatalogSales,
    Table::Customer,
    Table::CustomerAddress,
    Table::CustomerDemographics,
    Table::DateDim,
    Table::HouseholdDemographics,
    Table::IncomeBand,
    Table::Inventory,
    Table::Item,
    Table::Promotion,
    Table::Reason,
    Table::ShipMode,
    Table::Store,
    Table::StoreReturns,
    Table::StoreSales,
    Table::TimeDim,
    Table::Warehouse,
    Table::WebPage,
    Table::WebReturns,
    Table::WebSales,
    Table::WebSite,
];

/// The rows of `table` made from its source rows `first..=last` (1-based),
/// as they are read.
fn generate_range(session: &Session, table: Table, first: u64, last: u64) -> Result<(SchemaRef, Batches)> {
    macro_rules! generate {
        ($arrow:ident) => {{
            let batches = $arrow::new(session.clone()).with_source_row_range(first, last).with_batch_size(BATCH_ROWS);
            Ok(($arrow::schema_ref(), Box::new(batches) as Batches))
        }};
    }
    match table {
        Table::CallCenter => generate!(CallCenterArrow),
        Table::CatalogPage => generate!(CatalogPageArrow),
        Table::CatalogReturns => generate!(CatalogReturnsArrow),
        Table::CatalogSales => generate!(CatalogSalesArrow),
        Table::Customer => generate!(CustomerArrow),
        Table::CustomerAddress => generate!(CustomerAddressArrow),
        Table::CustomerDemographics => generate!(CustomerDemographicsArrow),
        Table::DateDim => generate!(DateDimArrow),
        Table::HouseholdDemographics => generate!(HouseholdDemographicsArrow),
        Table::IncomeBand => generate!(IncomeBandArrow),
        Table::Inventory => generate!(InventoryArrow),
        Table::Item => generate!(ItemArrow),
        Table::Promotion => generate!(PromotionArrow),
        Table::Reason => generate!(ReasonArrow),
        Table::ShipMode => generate!(ShipModeArrow),
        Table::Store => generate!(StoreArrow),
        Table::StoreReturns => generate!(StoreReturnsArrow),
        Table::StoreSales => generate!(StoreSalesArrow),
        Table::TimeDim => generate!(TimeDimArrow),
        Table::Warehouse => generate!(WarehouseArrow),
        Table::WebPage => generate!(WebPageArrow),
        Table::WebReturns => generate!(WebReturnsArrow),
        Table::WebSales => generate!(WebSalesArrow),
        Table::WebSite => generate!(WebSiteArrow),
        Table::DbgenVersion => plan_err!("dbgen_version is not one of the tables the queries read"),
    }
}

/// The generator's settings at `scale_factor`.
fn session_at(scale_factor: f64) -> Result<Session> {
    SessionBuilder::new()
        .with_scale_factor(scale_factor)
        .build()
        .map_err(|e| exec_datafusion_err!("TPC-DS at scale factor {scale_factor}: {e}"))
}

/// The source rows (1-based, inclusive) of each of up to `partitions` parts
/// of `table`.
fn part_ranges(session: &Session, table: Table, partitions: usize) -> Vec<(u64, u64)> {
    let rows = session.get_scaling().get_row_count(table);
    let parts = (partitions.max(1) as u64).min(rows.max(1));
    let per_part = rows.div_ceil(parts);
    (0..parts).map(|part| (part * per_part + 1, ((part + 1) * per_part).min(rows))).collect()
}

/// Generates every table at `scale_factor` and registers it in `ctx` as an
/// in-memory table of up to `partitions` partitions, each a range of the
/// table's source rows, generated in parallel.
pub fn register_tables(ctx: &SessionContext, scale_factor: f64, partitions: usize) -> Result<()> {
    let session = session_at(scale_factor)?;
    for table in TABLES {
        let generated = part_ranges(&session, table, partitions)
            .into_par_iter()
            .map(|(first, last)| {
                let (schema, batches) = generate_range(&session, table, first, last)?;
                Ok((schema, batches.collect::<std::result::Result<_, _>>()?))
            })
            .collect::<Result<Vec<_>>>()?;
        register_parts(ctx, table.get_name(), generated)?;
    }
    Ok(())
}

/// Writes every table at `scale_factor` as Parquet files under `dir`, one
/// file per part (up to `partitions` parts, each a range of the table's
/// source rows), in the order the generator makes the rows (the sales by
/// ticket or order number). Tables already written there are kept. Returns
/// the folder that [`register_parquet`] reads.
pub fn write_parquet(dir: &Path, scale_factor: f64, partitions: usize) -> Result<PathBuf> {
    let folder = dir.join(format!("tpcds-sf{scale_factor}-parts{partitions}"));
    let session = session_at(scale_factor)?;
    let ranges: Vec<_> = TABLES.iter().map(|&table| (table, part_ranges(&session, table, partitions))).collect();
    let tables: Vec<_> = ranges.iter().map(|(table, parts)| (table.get_name(), parts.len())).collect();
    parquet::write_tables(&folder, &tables, |name, part| {
        let (table, parts) = ranges
            .iter()
            .find(|(table, _)| table.get_name() == name)
            .ok_or_else(|| exec_datafusion_err!("no TPC-DS table named {name}"))?;
        let &(first, last) = parts.get(part).ok_or_else(|| exec_datafusion_err!("TPC-DS {name}: no part {part}"))?;
        generate_range(&session, *table, first, last)
    })?;
    Ok(folder)
}

/// Registers in `ctx` the tables `write_parquet` wrote to `folder`, as
/// listing tables over their files (statistics read from the footers).
pub async fn register_parquet(ctx: &SessionContext, folder: &Path) -> Result<()> {
    parquet::register_tables(ctx, folder, &TABLES.map(|table| table.get_name())).await
}

/// The numbers of the queries whose files `dir` holds, in order.
pub fn query_numbers(dir: &Path) -> Result<Vec<usize>> {
    let entries = std::fs::read_dir(dir).map_err(|e| exec_datafusion_err!("reading {}: {e}", dir.display()))?;
    let mut numbers = vec![];
    for entry in entries {
        let name = entry.map_err(|e| exec_datafusion_err!("reading {}: {e}", dir.display()))?.file_name();
        let number = name.to_str().and_then(|n| n.strip_prefix("query")?.strip_suffix(".sql")?.parse::<usize>().ok());
        numbers.extend(number);
    }
    numbers.sort();
    Ok(numbers)
}

/// The statements of query `query`, read from `dir/queryN.sql`, in the SQL
/// that DataFusion reads.
pub fn statements(dir: &Path, query: usize) -> Result<Vec<String>> {
    let path = dir.join(format!("query{query}.sql"));
    let text = std::fs::read_to_string(&path).map_err(|e| exec_datafusion_err!("reading {}: {e}", path.display()))?;
    let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("--")).collect();
    Ok(code.join("\n").split(';').map(str::trim).filter(|s| !s.is_empty()).map(day_intervals).collect())
}

/// The generator's `date + 30 days` as `date + interval '30 days'`; an
/// interval already written so (`interval '30 days'`) stays as it is.
fn day_intervals(statement: &str) -> String {
    let mut sql = String::with_capacity(statement.len());
    let mut rest = statement;
    while let Some(at) = rest.find(" days") {
        let (before, after) = rest.split_at(at);
        let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || before[..before.len() - digits].ends_with('\'') {
            sql.push_str(&rest[..at + 5]);
        } else {
            let (head, number) = before.split_at(before.len() - digits);
            sql.push_str(&format!("{head}interval '{number} days'"));
        }
        rest = &after[5..];
    }
    sql.push_str(rest);
    sql
}

#[cfg(test)]
mod tests {
    use super::day_intervals;

    #[test]
    fn day_counts_become_intervals() {
        assert_eq!(
            day_intervals("d between cast('1998-08-04' as date) and (cast('1998-08-04' as date) +  14 days)"),
            "d between cast('1998-08-04' as date) and (cast('1998-08-04' as date) +  interval '14 days')"
        );
        assert_eq!(
            day_intervals("d_date -120 days and x + 30 days"),
            "d_date -interval '120 days' and x + interval '30 days'"
        );
        assert_eq!(day_intervals("no days here"), "no days here");
        let written = "(cast('1998-08-04' as date) + INTERVAL '30 days')";
        assert_eq!(day_intervals(written), written);
    }
}
