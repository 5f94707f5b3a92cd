//! Hot loops over key values, compiled for AVX2 where the CPU has it.
//!
//! The crate is built for x86-64's baseline, whose vector instructions have
//! no 32-bit minimum or maximum. A build side's raw keys are copied on every
//! core for their upload while the device waits, their span gathered in
//! the same pass; on the baseline that copy took a third to a half longer
//! than a plain copy of as many bytes, and with AVX2 the span's loop is
//! about six times faster. So that loop is compiled
//! twice, and the AVX2 copy runs where the CPU has it.
//!
//! Not every loop gains: the key encoder's, which calls out of the closure
//! (its code closure, the iterator adapters), was not compiled into the
//! AVX2 copy and ran several times slower there. Measure a loop before
//! handing it here.

/// Runs `body`, compiled with AVX2 where the CPU has it. Only code inlined
/// into `body` takes the wider lanes: mark the closure `#[inline(always)]`
/// and keep its loop within it.
#[inline(always)]
pub(crate) fn in_wide_lanes<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { with_avx2(body) };
    }
    body()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn with_avx2<R>(body: impl FnOnce() -> R) -> R {
    body()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The span and the codes the key loops compute, over values at both
    /// ends of the type.
    #[inline(always)]
    fn span_and_codes(values: &[i32], lo: i32, span: u32) -> (i32, i32, Vec<u32>) {
        let (min, max) = values.iter().fold((i32::MAX, i32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let codes = values
            .iter()
            .map(|&v| v.wrapping_sub(lo) as u32)
            .map(|offset| if offset <= span { offset } else { u32::MAX })
            .collect();
        (min, max, codes)
    }

    #[test]
    fn wide_lanes_compute_what_the_baseline_computes() {
        let mut values: Vec<i32> = (0..10_007).map(|i: i32| i.wrapping_mul(-1_640_531_535)).collect();
        values.extend([i32::MIN, i32::MAX, 0, -1, 1]);
        let baseline = span_and_codes(&values, -5, 1 << 30);
        let wide = in_wide_lanes(
            #[inline(always)]
            || span_and_codes(&values, -5, 1 << 30),
        );
        assert_eq!(wide, baseline);
        assert_eq!((baseline.0, baseline.1), (i32::MIN, i32::MAX));
        assert!(baseline.2.contains(&u32::MAX) && baseline.2.contains(&5));
    }
}
