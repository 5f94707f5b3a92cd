//! Directory join on the GPU: a sorted build side's run of rows per key
//! code, found by each probe key with two adjacent reads in its own row's
//! place (kernels/directory.cu).

use datafusion::common::internal_err;
use datafusion::error::Result;

use super::launch::{Arg, CudaBackend};
use super::memory::DeviceBuffer;
use crate::backend::{Candidates, JoinBackend, Layout, MatchFlags, Space, Transformed};
use crate::keys::NormalizedKey;

impl CudaBackend {
    pub(super) fn directory_of<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        codes: u32,
    ) -> Result<DeviceBuffer<u32>> {
        let Layout::Sorted(_) = build.layout else {
            return internal_err!("a directory needs a sorted build side");
        };
        // Each code's count, scanned in place: one extra zero becomes the
        // number of matchable keys.
        let directory = DeviceBuffer::<u32>::filled(&self.instance, codes as usize + 1, 0, "the directory")?;
        let n = build.rows as u64;
        let args = [Arg::from(build.keys.pointer()), n.into(), codes.into(), directory.pointer().into()];
        self.launch(&self.kernel_name::<K>("directory_counts"), n, 0, &args)?;
        self.exclusive_scan(&directory)?;
        Ok(directory)
    }

    pub(super) fn directory_match_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        directory: &DeviceBuffer<u32>,
        probe: &DeviceBuffer<K>,
        build_space: Space,
    ) -> Result<Candidates<CudaBackend>> {
        let rows = probe.len();
        if rows == 0 || build.rows == 0 {
            return self.empty_candidates();
        }
        let codes = (directory.len() - 1) as u32;
        let build_ids = Self::row_ids_for(build, build_space, "build")?;
        let lower = DeviceBuffer::<u32>::alloc(&self.instance, rows, "run starts")?;
        let not_one = DeviceBuffer::<u32>::filled(&self.instance, 1, 0, "match count check")?;
        let n = rows as u64;
        let search = [Arg::from(probe.pointer()), n.into(), directory.pointer().into(), codes.into()];
        let args = [&search[..], &[lower.pointer().into(), 0u64.into(), not_one.pointer().into()]].concat();
        let kernel = self.kernel_name::<K>("directory_search");
        self.launch(&kernel, n, 0, &args)?;
        if not_one.download_at(0, "match count check")? == 0 {
            // Each probe row matches once, at the start of its run.
            let build = match (build_space, &build.row_ids) {
                (Space::Original, Some(ids)) => self.gather_positions(ids, &lower)?,
                _ => lower,
            };
            return Ok(Candidates { build, probe: self.sequence(rows)? });
        }
        // One extra zero count becomes the total after the scan.
        let counts = DeviceBuffer::<u64>::filled(&self.instance, rows + 1, 0, "match counts")?;
        let args = [&search[..], &[0u64.into(), counts.pointer().into(), 0u64.into()]].concat();
        self.launch(&kernel, n, 0, &args)?;
        self.expand_runs(&counts, &lower, (build_ids, 0))
    }

    /// Flags the rows with a match of a build side with a directory and
    /// probe keys as they are ([`crate::backend::JoinBackend::directory_mark`]):
    /// a probe row's code has a run of build rows; a build row's code is
    /// seen among the probe rows'.
    pub(super) fn directory_mark_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        directory: &DeviceBuffer<u32>,
        probe: &DeviceBuffer<K>,
        build_space: Space,
        flags: MatchFlags<'_, CudaBackend>,
    ) -> Result<()> {
        let rows = probe.len();
        if rows == 0 || build.rows == 0 {
            return Ok(());
        }
        let codes = (directory.len() - 1) as u32;
        let seen = match flags.build {
            Some(_) => Some(DeviceBuffer::<u8>::filled(&self.instance, codes as usize, 0, "codes seen")?),
            None => None,
        };
        let n = rows as u64;
        let args = [
            Arg::from(probe.pointer()),
            n.into(),
            directory.pointer().into(),
            codes.into(),
            seen.as_ref().map_or(0, DeviceBuffer::pointer).into(),
            flags.probe.map_or(0, DeviceBuffer::pointer).into(),
        ];
        self.launch(&self.kernel_name::<K>("directory_mark_probe"), n, 0, &args)?;
        let (Some(build_flags), Some(seen)) = (flags.build, &seen) else {
            return Ok(());
        };
        let n = build.rows as u64;
        let args = [
            Arg::from(build.keys.pointer()),
            n.into(),
            codes.into(),
            seen.pointer().into(),
            Self::row_ids_for(build, build_space, "build")?.into(),
            build_flags.pointer().into(),
        ];
        self.launch(&self.kernel_name::<K>("directory_mark_build"), n, 0, &args)
    }
}
