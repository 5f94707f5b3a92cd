//! Join filters compared on the device, on the rows of the candidate pairs.

use datafusion::error::Result;

use super::column::CudaColumn;
use super::launch::CudaBackend;
use super::memory::DeviceBuffer;
use crate::backend::{Comparison, check_compared};

impl CudaBackend {
    pub(crate) fn compare_columns(
        &self,
        op: Comparison,
        left: (&CudaColumn, &DeviceBuffer<u32>),
        right: (&CudaColumn, &DeviceBuffer<u32>),
        and: Option<&DeviceBuffer<u8>>,
    ) -> Result<DeviceBuffer<u8>> {
        let (pairs, integer) = check_compared(
            (&left.0.data_type, left.1.len()),
            (&right.0.data_type, right.1.len()),
            and.map(DeviceBuffer::len),
        )?;
        let kernel = match integer {
            (true, 1) => "compare_rows_i8",
            (true, 2) => "compare_rows_i16",
            (true, 4) => "compare_rows_i32",
            (true, _) => "compare_rows_i64",
            (false, 1) => "compare_rows_u8",
            (false, 2) => "compare_rows_u16",
            (false, 4) => "compare_rows_u32",
            (false, _) => "compare_rows_u64",
        };
        let out = DeviceBuffer::<u8>::alloc(&self.instance, pairs, "join filter flags")?;
        let valid = |column: &CudaColumn| column.validity.as_ref().map_or(0, |v| v.pointer());
        let n = pairs as u64;
        self.launch(
            kernel,
            n,
            0,
            &[
                (op as u32).into(),
                left.0.values.pointer().into(),
                valid(left.0).into(),
                left.1.pointer().into(),
                right.0.values.pointer().into(),
                valid(right.0).into(),
                right.1.pointer().into(),
                and.map_or(0, DeviceBuffer::pointer).into(),
                n.into(),
                out.pointer().into(),
            ],
        )?;
        Ok(out)
    }
}
