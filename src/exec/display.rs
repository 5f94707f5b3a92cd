use std::fmt;

use datafusion::common::NullEquality;
use datafusion::physical_expr_common::physical_expr::fmt_sql;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};

use super::GpuJoinExec;

impl GpuJoinExec {
    fn projection_text(&self) -> Option<String> {
        let projection = self.cpu_equivalent().projection.as_ref()?;
        let schema = self.cpu_equivalent().join_schema();
        Some(projection.iter().map(|&i| format!("{}@{i}", schema.field(i).name())).collect::<Vec<_>>().join(", "))
    }
}

impl DisplayAs for GpuJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let (strategy, reasons) = self.strategy_text();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                let on = self.on().iter().map(|(l, r)| format!("({l}, {r})")).collect::<Vec<_>>().join(", ");
                write!(
                    f,
                    "GpuJoinExec: backend={}, algorithm={}, mode={:?}, join_type={:?}, on=[{on}]",
                    self.backend().name(),
                    strategy,
                    self.partition_mode(),
                    self.join_type(),
                )?;
                if self.devices().len() > 1 {
                    write!(f, ", devices={:?}", self.devices().ordinals())?;
                }
                if !self.from_above.is_empty() {
                    write!(f, ", filters_from_above=[{}]", self.from_above.text())?;
                }
                if let Some(filter) = self.filter() {
                    let on = if self.definition.pair_filter.is_some() { "backend" } else { "host" };
                    write!(f, ", filter={}, filter_on={on}", filter.expression())?;
                }
                if let Some(projection) = self.projection_text() {
                    write!(f, ", projection=[{projection}]")?;
                }
                if self.null_equality() == NullEquality::NullEqualsNull {
                    write!(f, ", NullsEqual: true")?;
                }
                if let Some(fetch) = self.fetch() {
                    write!(f, ", fetch={fetch}")?;
                }
                if self.cpu_equivalent().null_aware {
                    write!(f, ", null_aware")?;
                }
                if self.preserves_probe_order() {
                    write!(f, ", probe_order=kept")?;
                }
                if let Some(ordering) = self.key_ordering() {
                    write!(f, ", output_ordering=[{ordering}]")?;
                }
                if let Some(reasons) = &reasons {
                    write!(f, ", chosen=[{reasons}]")?;
                }
                if t == DisplayFormatType::Verbose {
                    write!(f, ", replaces={}", self.replaces().name())?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "backend={}", self.backend().name())?;
                writeln!(f, "algorithm={strategy}")?;
                writeln!(f, "join_type={:?}", self.join_type())?;
                let on = self
                    .on()
                    .iter()
                    .map(|(l, r)| format!("({} = {})", fmt_sql(l.as_ref()), fmt_sql(r.as_ref())))
                    .collect::<Vec<_>>()
                    .join(", ");
                writeln!(f, "on={on}")?;
                if let Some(filter) = self.filter() {
                    writeln!(f, "filter={}", fmt_sql(filter.expression().as_ref()))?;
                }
                Ok(())
            }
        }
    }
}
