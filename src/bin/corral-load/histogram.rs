//! The latency histogram of `corral-load`.

/// Log-linear latency histogram in nanoseconds: exact below 128 ns, then 64 buckets per
/// power of two (under 1.6% error), fixed size, cheap to record into and to merge.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    max: u64,
}

impl Histogram {
    const SUB: u32 = 6;
    const BUCKETS: usize = ((64 - Self::SUB as usize) << Self::SUB) + (1 << (Self::SUB + 1));

    /// An empty histogram.
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; Self::BUCKETS],
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < (1 << (Self::SUB + 1)) {
            return v as usize;
        }
        let shift = 63 - v.leading_zeros() - Self::SUB;
        ((shift as usize) << Self::SUB) + (v >> shift) as usize
    }

    /// Largest value that falls in bucket `i`, so percentiles err on the high side.
    fn upper(i: usize) -> u64 {
        if i < (1 << (Self::SUB + 1)) {
            return i as u64;
        }
        let shift = (i >> Self::SUB) - 1;
        let m = (i - (shift << Self::SUB)) as u64;
        ((m + 1) << shift) - 1
    }

    /// Records `n` samples of value `v`.
    pub fn record(&mut self, v: u64, n: u64) {
        self.counts[Self::index(v)] += n;
        self.max = self.max.max(v);
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    /// The largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The `p`th percentile (0-100), rounded up to its bucket's top.
    pub fn percentile(&self, p: f64) -> u64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::upper(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_err_high_by_at_most_a_bucket() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000, 1);
        }
        let p50 = h.percentile(50.0);
        assert!((500_000..=508_000).contains(&p50), "{p50}");
        assert_eq!(h.percentile(100.0), 1_000_000);
        let mut other = Histogram::new();
        other.record(5_000_000, 1);
        h.merge(&other);
        assert_eq!(h.max(), 5_000_000);
    }
}
