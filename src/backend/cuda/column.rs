//! Payload columns in device memory.
//!
//! Fixed-width values of 1, 2, 4, 8 or 16 bytes keep their Arrow layout;
//! booleans and validity are one byte per row on the device, so that every
//! gather and scatter moves whole bytes, and are packed back into Arrow
//! bitmaps on the device before they are downloaded.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, make_array};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer};
use arrow::datatypes::DataType;
use datafusion::common::internal_datafusion_err;
use datafusion::error::Result;

use super::launch::CudaBackend;
use super::memory::DeviceBuffer;
use crate::arrays::value_bytes;
use crate::backend::{Fill, JoinBackend, held_width};
use crate::values::value_width;

/// Rows per thread of the value gathers (GATHER_ITEMS in gather.cu).
const GATHER_ITEMS: u64 = 4;

/// A column in device memory. Its buffers are never written after the
/// column is made, so columns share them: a gather by a sequence returns
/// its source without copying.
#[derive(Debug, Clone)]
pub struct CudaColumn {
    pub(crate) data_type: DataType,
    pub(crate) len: usize,
    /// Bytes per value on the device.
    pub(crate) width: usize,
    pub(crate) values: Arc<DeviceBuffer<u8>>,
    /// One byte per row, 1 for valid; `None` when no value is null.
    pub(crate) validity: Option<Arc<DeviceBuffer<u8>>>,
}

impl CudaBackend {
    /// Bits `[offset, offset + len)` of a bitmap as bytes on the device.
    fn unpack(&self, bitmap: &Buffer, offset: usize, len: usize, what: &str) -> Result<DeviceBuffer<u8>> {
        let first = offset / 8;
        let last = (offset + len).div_ceil(8);
        let packed = DeviceBuffer::upload(&self.instance, &bitmap.as_slice()[first..last], what)?;
        let bytes = DeviceBuffer::<u8>::alloc(&self.instance, len, what)?;
        let (source, bit_offset, rows, destination) =
            (packed.pointer(), (offset % 8) as u64, len as u64, bytes.pointer());
        self.launch("unpack_bits", rows, 0, &[source.into(), bit_offset.into(), rows.into(), destination.into()])?;
        Ok(bytes)
    }

    /// Bytes on the device to a bitmap on the host.
    fn pack(&self, bytes: &DeviceBuffer<u8>, len: usize, what: &str) -> Result<BooleanBuffer> {
        let words = DeviceBuffer::<u32>::alloc(&self.instance, len.div_ceil(32), what)?;
        let (source, rows, destination) = (bytes.pointer(), len as u64, words.pointer());
        self.launch("pack_bits", rows, 0, &[source.into(), rows.into(), destination.into()])?;
        let host = words.download(what)?;
        Ok(BooleanBuffer::new(Buffer::from_vec(host), 0, len))
    }

    pub(crate) fn upload_array(&self, array: &ArrayRef) -> Result<CudaColumn> {
        let data_type = array.data_type().clone();
        let width = held_width(&data_type)
            .ok_or_else(|| internal_datafusion_err!("the CUDA backend does not hold {data_type} columns"))?;
        let data = array.to_data();
        let (offset, len) = (data.offset(), data.len());
        let what = "a payload column";
        let values = if data_type == DataType::Boolean {
            self.unpack(&data.buffers()[0], offset, len, what)?
        } else {
            DeviceBuffer::upload_buffer(
                &self.instance,
                &data.buffers()[0],
                offset * width..(offset + len) * width,
                what,
            )?
        };
        let validity = match data.nulls().filter(|n| n.null_count() > 0) {
            Some(nulls) => {
                let bits = nulls.inner();
                Some(self.unpack(bits.inner(), bits.offset(), len, "a validity bitmap")?)
            }
            None => None,
        };
        Ok(CudaColumn { data_type, len, width, values: Arc::new(values), validity: validity.map(Arc::new) })
    }

    /// Read from `arrays` where they lie, where they are in pinned memory
    /// (a table kept there), else copied by `fill`.
    pub(crate) fn upload_filled_array(
        &self,
        data_type: &DataType,
        rows: usize,
        fill: Fill<'_, u8>,
        arrays: &[&dyn Array],
    ) -> Result<CudaColumn> {
        let width = value_width(data_type)
            .filter(|w| held_width(data_type) == Some(*w))
            .ok_or_else(|| internal_datafusion_err!("the CUDA backend does not hold {data_type} values end to end"))?;
        let what = "a payload column";
        let in_place = match self.pieces_in_place(arrays, width) {
            Some(pieces) => DeviceBuffer::upload_in_place(&self.instance, &pieces, what)?,
            None => None,
        };
        let values = match in_place {
            Some(values) if values.len() != rows * width => {
                return Err(internal_datafusion_err!("{what}: {} bytes in place for {rows} rows", values.len()));
            }
            Some(values) => values,
            None => DeviceBuffer::upload_with(&self.instance, rows * width, fill, what)?,
        };
        Ok(CudaColumn { data_type: data_type.clone(), len: rows, width, values: Arc::new(values), validity: None })
    }

    /// The bytes of `arrays`' values (`width` bytes each), where the first
    /// with any lies in a pinned block, so that the others may too (a table
    /// kept in pinned memory); `None`, at the cost of that one look, where
    /// it does not.
    pub(crate) fn pieces_in_place(&self, arrays: &[&dyn Array], width: usize) -> Option<Vec<Buffer>> {
        let first = arrays.iter().find(|array| !array.is_empty())?;
        if !self.instance.device.pinned.holds(value_bytes(*first, width)?.as_slice()) {
            return None;
        }
        arrays.iter().map(|array| value_bytes(*array, width)).collect()
    }

    pub(crate) fn download_array(&self, column: &CudaColumn) -> Result<ArrayRef> {
        let what = "an output column";
        let values = if column.data_type == DataType::Boolean {
            self.pack(&column.values, column.len, what)?.into_inner()
        } else {
            self.download_values(&column.values, what)?
        };
        let nulls = match &column.validity {
            Some(validity) => {
                Some(NullBuffer::new(self.pack(validity, column.len, what)?)).filter(|n| n.null_count() > 0)
            }
            None => None,
        };
        let data =
            ArrayData::builder(column.data_type.clone()).len(column.len).add_buffer(values).nulls(nulls).build()?;
        Ok(make_array(data))
    }

    /// A column's values as an Arrow buffer: downloaded into the backend's
    /// transfer memory (a pinned block) when it has some, else into fresh
    /// memory.
    fn download_values(&self, values: &DeviceBuffer<u8>, what: &str) -> Result<Buffer> {
        let bytes = values.len();
        if let Some(mut memory) = self.transfer_memory(bytes) {
            values.download_into(memory.bytes_mut(bytes)?, what)?;
            return memory.into_buffer(bytes);
        }
        // Arrow buffers must be aligned for their values, a Vec<u8> is not.
        let mut buffer = MutableBuffer::from_len_zeroed(bytes);
        values.download_into(buffer.as_slice_mut(), what)?;
        Ok(buffer.into())
    }

    pub(crate) fn gather_array(
        &self,
        column: &CudaColumn,
        positions: &DeviceBuffer<u32>,
        may_hold_nulls: bool,
    ) -> Result<CudaColumn> {
        let rows = positions.len();
        if positions.is_sequence() && rows == column.len {
            // Every row once, in order: the column is its own gather.
            return Ok(column.clone());
        }
        let what = "a gathered column";
        let values = DeviceBuffer::<u8>::alloc(&self.instance, rows * column.width, what)?;
        let kernel = match column.width {
            1 => "gather_1",
            2 => "gather_2",
            4 => "gather_4",
            8 => "gather_8",
            16 => "gather_16",
            w => return Err(internal_datafusion_err!("no gather for {w}-byte values")),
        };
        let (source, index, n, out) = (column.values.pointer(), positions.pointer(), rows as u64, values.pointer());
        let blocks = n.div_ceil(u64::from(super::launch::BLOCK) * GATHER_ITEMS);
        self.launch_blocks(kernel, blocks, 0, n, &[source.into(), index.into(), n.into(), out.into()])?;
        // Validity only where a null can arise: a null source or a null position.
        let validity = if may_hold_nulls || column.validity.is_some() {
            let validity = DeviceBuffer::<u8>::alloc(&self.instance, rows, what)?;
            let (source_valid, out_valid) = (column.validity.as_ref().map_or(0, |v| v.pointer()), validity.pointer());
            self.launch("gather_validity", n, 0, &[source_valid.into(), index.into(), n.into(), out_valid.into()])?;
            Some(validity)
        } else {
            None
        };
        Ok(CudaColumn {
            data_type: column.data_type.clone(),
            len: rows,
            width: column.width,
            values: Arc::new(values),
            validity: validity.map(Arc::new),
        })
    }
}
